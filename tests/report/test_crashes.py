"""Crashes shown first in a study's report (issue 38 item 3): a trial whose server crashed at any
level is in the Failures section with the level, the cause and its log excerpt (text, escaped in
HTML), its status reads ``crashed at c=N (cause)`` in every table and export, and the throughput
plot marks the crash with an X without drawing its line to 0 tok/s.

The studies are the recorded quick start (``data/stores.json``) in a real SQLite store, two of
its trials rewritten as crashed: #4 as a store written before this rule kept it (``feasible``,
the crashed level a verdict of its ladder), #5 as a study records it now (``infeasible``, the
value of the levels below kept).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from cleanslate.report import load_report, render_html, to_csv, to_json, trials_table
from cleanslate.report._console import failure_lines
from cleanslate.report._data import StudyReport, log_excerpt
from cleanslate.report._plots import throughput_figure, throughput_line
from cleanslate.store import Store, TrialStatus
from tests.report.conftest import load_recorded

#: The sim's crash as its log tells it (the sim writes SGLang's traceback), with a line of
#: markup that a report must show as text.
TAIL = """[2026-12-06 08:14:48] Decode batch. #running-req: 64, #queue-req: 0
[2026-12-06 08:14:50 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "worker.py", line 101, in init_forward_metadata
    self._page_table = metadata.page_table_1_flattened
AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'
<script>alert("log")</script>
[2026-12-06 08:14:50] Simulated server stopped (exit 1)
"""
#: Output tokens/s of a level cut short by the crash (near 0: what drew the line down).
PARTIAL = 12.5
DETAIL = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> StudyReport:
    url = f"sqlite:///{tmp_path_factory.mktemp('crashes') / 'cleanslate.db'}"
    load_recorded(url)
    store = Store(url)
    try:
        trials = {t.number: t for t in store.trials("quickstart")}
        old = trials[4]
        # the crashed level's partial measurement: what few tokens came before the crash
        partial = old.levels[2].model_copy(update={"output_throughput": PARTIAL})
        store.save_trial(old.model_copy(update={
            "levels": (*old.levels[:2], partial),
            "level_verdicts": {**old.level_verdicts, "c=256": "crashed"},
            "cause": "python_exception", "detail": f"c=256: {DETAIL}", "log_tail": TAIL}))
        new = trials[5]
        store.save_trial(new.model_copy(update={
            "status": TrialStatus.INFEASIBLE, "best_level": "c=32",
            "level_verdicts": {"c=32": "ok", "c=128": "crashed"},
            "levels": new.levels[:2], "cause": "python_exception",
            "detail": f"c=128: {DETAIL}", "log_tail": TAIL}))
        return load_report(store, "quickstart")
    finally:
        store.close()


def test_every_crashed_trial_is_a_failure_with_its_level_cause_and_excerpt(
        report: StudyReport) -> None:
    assert [t.number for t in report.failures] == [3, 4, 5]  # the OOM and the two crashes
    four = report.trial(4)
    assert four is not None and four.crash_text == "crashed at c=256 (python_exception)"
    lines = failure_lines(report)
    assert lines[0] == "failures of quickstart (3):"
    assert f"  #4 crashed at c=256 (python_exception): c=256: {DETAIL}" in lines
    assert f"  #5 crashed at c=128 (python_exception): c=128: {DETAIL}" in lines
    assert any(line.startswith("  #3 infeasible: oom") for line in lines)
    # the excerpt: the traceback to its exception, not the batch lines before it
    assert f"      {DETAIL}" in lines
    assert not any("Decode batch" in line for line in lines)


def test_the_excerpt_is_the_last_traceback_else_the_last_lines() -> None:
    assert log_excerpt(TAIL).splitlines() == TAIL.splitlines()[1:5]
    frames = "Traceback (most recent call last):\n" + "  frame\n" * 30 + "ValueError: x\n"
    cut = log_excerpt("before\n" + frames, lines=6).splitlines()
    assert cut == ["Traceback (most recent call last):", "  ...", *["  frame"] * 3,
                   "ValueError: x"]
    assert log_excerpt("a\n\nb\nc\n", lines=2) == "b\nc"
    assert log_excerpt("") == ""


def test_tables_and_exports_say_crashed_at_the_level(report: StudyReport) -> None:
    console = Console(file=io.StringIO(), width=400, color_system=None)
    console.print(trials_table(report))
    table = console.file.getvalue()  # type: ignore[attr-defined]
    assert table.count("crashed at c=256 (python_exception)") == 1
    assert table.count("crashed at c=128 (python_exception)") == 1
    rows = {int(r["number"]): r for r in csv.DictReader(io.StringIO(to_csv([report])))}
    assert rows[4]["crash"] == "crashed at c=256 (python_exception)"
    assert rows[5]["crash"] == "crashed at c=128 (python_exception)"
    assert rows[5]["value"] != ""  # the value of the level below the crash is kept
    assert rows[0]["crash"] == ""
    doc = {t["number"]: t for t in json.loads(to_json([report]))["studies"][0]["trials"]}
    assert (doc[4]["crashed_at"], doc[4]["crash"]) == ("c=256",
                                                       "crashed at c=256 (python_exception)")
    assert doc[0]["crashed_at"] is None and doc[0]["crash"] is None


def test_the_html_failures_show_the_crash_and_escape_the_log(report: StudyReport,
                                                             tmp_path: Path) -> None:
    page = render_html([report], plots=[])
    failures = page.split(">Failures<", 1)[1]
    assert '<span class="badge b-crashed">crashed</span> at c=256 (python_exception)' in failures
    assert "Trial #5" in failures and "Trial #3" in failures
    assert "&lt;script&gt;alert(&quot;log&quot;)&lt;/script&gt;" in failures
    assert "<script>alert" not in page


def test_the_throughput_line_stops_at_the_last_level_that_served(report: StudyReport) -> None:
    four, five, base = report.trial(4), report.trial(5), report.trial(0)
    assert four is not None and five is not None and base is not None
    line = throughput_line(four)
    assert [p[0] for p in line.points] == [32.0, 128.0]  # c=256 crashed: not a point
    assert line.crashes == [(256.0, line.points[-1][1])]  # the X, level with c=128
    assert all(y > 0 for _, y, _ in line.points)
    short = throughput_line(five)
    assert [p[0] for p in short.points] == [32.0] and short.crashes == [(128.0,
                                                                          short.points[0][1])]
    untouched = throughput_line(base)
    assert [p[0] for p in untouched.points] == [32.0, 128.0, 256.0] and not untouched.crashes


def test_the_throughput_plot_draws_an_x_and_no_fall_to_the_partial_level(
        report: StudyReport) -> None:
    fig = throughput_figure([report])
    drawn = [(line.get_marker(), list(zip(line.get_xdata(), line.get_ydata(), strict=True)))
             for line in fig.axes[0].get_lines()]
    points = [xy for _, xys in drawn for xy in xys]
    assert not any(y == PARTIAL for _, y in points), "the crashed level was drawn"
    four = throughput_line(report.trial(4))  # type: ignore[arg-type]
    assert ("X", [(256.0, four.points[-1][1])]) in drawn


def test_a_configuration_decided_by_its_crash_is_not_on_the_pareto_front(
        report: StudyReport) -> None:
    # #4's c=32 and c=128 were on it before (its record, as stores before kept it, feasible)
    front = {(t.number, level.label) for t, level, _, _ in report.pareto_front()}
    assert front and not any(number in (4, 5) for number, _ in front), front
    assert {t.number for t, _, _, _ in report.level_points()} >= {4, 5}  # still drawn
