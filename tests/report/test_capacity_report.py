"""Reports of capacity searches (issue 25, point 4): studies whose trials ran the core's
:class:`~cleanslate.bench.CapacitySearch` (``capacity_data``: real levels judged by the core on
their Wilson intervals), saved to a real SQLite store and read back: the bracket, probes, crash,
cliffs and unresolved probes in the terminal table, the page's per-trial plot of the probe
sequence (its error bars against the Wilson intervals computed by hand), the JSON and CSV
fields, and ``cleanslate tune``'s summary."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from cleanslate.bench import CapacityResult
from cleanslate.report import (
    StudyReport,
    TrialView,
    bracket_text,
    load_report,
    render_html,
    to_csv,
    to_json,
)
from cleanslate.report._console import print_report
from cleanslate.report._plots import (
    CAPACITY_HEIGHT,
    CAPACITY_WIDTH,
    Plot,
    capacity_figure,
    render_plots,
)
from cleanslate.stats import t_interval, wilson
from cleanslate.store import Store, TrialRecord
from cleanslate.store._trials import StudyStatus
from tests.cli.inproc import run_main
from tests.report import capacity_data
from tests.report.conftest import StudyStore


@pytest.fixture(scope="module")
def cap_store(tmp_path_factory: pytest.TempPathFactory) -> StudyStore:
    folder = tmp_path_factory.mktemp("capacity")
    url = f"sqlite:///{folder / 'cleanslate.db'}"
    capacity_data.save(url)
    return StudyStore(folder, url, ("cap", "cap-race"))


@pytest.fixture(scope="module")
def reports(cap_store: StudyStore) -> dict[str, StudyReport]:
    store = Store(cap_store.url)
    try:
        return {n: load_report(store, n) for n in cap_store.studies}
    finally:
        store.close()


@pytest.fixture(scope="module")
def plots(reports: dict[str, StudyReport]) -> list[Plot]:
    return render_plots([reports["cap"]])


@pytest.fixture(scope="module")
def page(reports: dict[str, StudyReport], plots: list[Plot]) -> str:
    return render_html([reports["cap"]], plots=plots)


def _text(report: StudyReport) -> str:
    out = io.StringIO()
    print_report(Console(file=out, width=260, no_color=True), report)
    return out.getvalue()


def _row(text: str, number: int) -> str:
    return next(line for line in text.splitlines() if re.match(rf"[│|]\s*{number}\s*[│|]", line))


def test_the_searches_are_the_cores_own(reports: dict[str, StudyReport]) -> None:
    """The data behind the other tests: what the core decided on the recorded counts."""
    cap = reports["cap"]
    got = {t.number: t.capacity for t in cap.trials}
    assert all(isinstance(c, CapacityResult) for c in got.values())
    assert [p.label for p in got[0].probes] == [  # type: ignore[union-attr]
        "c=8", "c=16", "c=32", "c=64", "c=48", "c=40", "c=36", "c=38"]
    assert {n: (c.capacity, c.upper) for n, c in got.items()} == {  # type: ignore[union-attr]
        0: (38, 40), 1: (16, 32), 2: (44, 48), 3: (None, 1)}
    # the probes' levels are the trial's, in probe order
    for t in cap.trials:
        assert [lv.label for lv in t.record.levels] == [p.label for p in t.capacity.probes]  # type: ignore[union-attr]


def test_table_shows_each_bracket_the_probes_the_crash_and_the_findings(
        reports: dict[str, StudyReport]) -> None:
    text = _text(reports["cap"])
    assert "capacity [bracket)" in text and "probes (stopped)" in text
    assert re.search(r"c=38 \[38, 40\)\s*[│|]\s*8 \(tolerance, 1 extended\)", _row(text, 0))
    crash = _row(text, 1)
    assert "c=16 [16, 32)" in crash and "3 (crashed)" in crash
    assert "crashed at c=32 (cuda_error)" in crash
    cliff = _row(text, 2)
    assert "c=44 [44, 48)" in cliff and "unresolved c=64" in cliff
    assert "cliff c=16→c=32 -37%" in cliff
    nothing = _row(text, 3)
    assert "infeasible (nothing_passes)" in nothing and "none (c=1 did not pass)" in nothing
    assert "4 (nothing passes)" in nothing
    # the best by capacity first (44 > 38 > 16), the infeasible one last
    order = [int(m) for m in re.findall(r"^[│|]\s*(\d+)\s*[│|]", text, re.M)]
    assert order == [2, 0, 1, 3]
    assert "best configuration (trial 2)" in text
    assert "max_concurrency_under_slo = 44 at c=44" in text
    assert ("capacity: max concurrency within the SLOs: c=44, boundary in [44, 48) (7 probes, "
            "stopped: tolerance)") in text


def test_replicated_capacities_carry_their_interval_and_standing(
        reports: dict[str, StudyReport]) -> None:
    race = reports["cap-race"]
    text = _text(race)
    hand = t_interval([38.0, 36.0, 38.0], 0.95)
    assert race.trial(0).interval().low == pytest.approx(hand.low)  # type: ignore[union-attr]
    assert f"mean 37.3 ± {hand.half_width:.1f} (3 runs)" in _row(text, 0)
    # the standing is the study's own decision (tie_set), as for any objective
    for n in (0, 1):
        assert race.mark(race.trial(n)) in _row(text, n)  # type: ignore[arg-type]
    assert race.mark(race.trial(0)) == "best"  # type: ignore[arg-type]
    assert "c=38 [38, 40)" in _row(text, 0)
    assert "capacity of its other measurements: c=36 [36, 38), c=38 [38, 40)" in text


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def test_page_holds_each_trials_probe_plot_and_table(page: str,
                                                     reports: dict[str, StudyReport]) -> None:
    assert '<h2 id="Capacity-cap">Capacity</h2>' in page
    assert '<a href="#Capacity-cap">Capacity</a>' in page
    for t in reports["cap"].trials:
        result = t.capacity
        assert result is not None
        block = page.split(f'<div class="capacity" id="capacity-cap-{t.number}">', 1)[1]
        block = block.split('<div class="capacity"', 1)[0].split("<h2", 1)[0]
        img = re.search(r'<img alt="Capacity search of trial #(\d+)" '
                        r'src="data:image/png;base64,([^"]+)">', block)
        assert img is not None and int(img[1]) == t.number
        assert _png_size(base64.b64decode(img[2])) == (CAPACITY_WIDTH, CAPACITY_HEIGHT)
        # one row per probe, in probe order, with its verdict
        rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td>(c=\d+)</td><td><span "
                          r'class="badge b-(\w+)">', block)
        assert [(int(i), lb, v) for i, lb, v in rows] == [
            (p.index + 1, p.label, p.verdict.value) for p in result.probes]
    crash = page.split('id="capacity-cap-1"', 1)[1].split('<div class="capacity"', 1)[0]
    assert ("crashed at c=32 (cuda_error: CUDA error: an illegal memory access was "
            "encountered)") in crash
    # the trials table links each bracket to its search
    assert '<a class="nowrap" href="#capacity-cap-0">c=38 [38, 40)</a>' in page
    # the page's own plots stay two (throughput, Pareto); the capacity plots are per trial
    plots = page.split('<h2 id="plots">', 1)[1].split("<h2", 1)[0]
    assert plots.count("<figure") == 2


def _bars(ax: Any) -> dict[float, tuple[float, float, float]]:
    """Each probe drawn: load -> (point, low end, high end) of its error bar, in %."""
    out: dict[float, tuple[float, float, float]] = {}
    for container in ax.containers:
        data, _caps, (bars,) = container.lines
        xs, ys = data.get_data()
        for x, y, seg in zip(xs, ys, bars.get_segments(), strict=True):
            out[float(x)] = (float(y), float(seg[0][1]), float(seg[1][1]))
    return out


def test_plot_draws_attainment_with_the_wilson_intervals_target_and_bracket(
        reports: dict[str, StudyReport]) -> None:
    cap = reports["cap"]
    trial = cap.trial(0)
    assert trial is not None
    ax: Any = capacity_figure(cap, trial).axes[0]
    bars = _bars(ax)
    assert sorted(bars) == [8, 16, 32, 36, 38, 40, 48, 64]
    for level in trial.record.levels:
        met, n = level.limit_counts["p90_tpot_ms"]
        low, high = wilson(met, n, 0.95)
        y, lo, hi = bars[float(level.load.concurrency)]  # type: ignore[union-attr]
        assert (y, lo, hi) == pytest.approx((100 * met / n, 100 * low, 100 * high))
    assert bars[38][0] == pytest.approx(100 * 375 / 400)  # the extended probe, pooled
    lines = {(tuple(line.get_ydata()), line.get_linestyle()) for line in ax.get_lines()}
    assert ((90.0, 90.0), "--") in lines  # the target
    spans = [p for p in ax.patches if p.get_label().startswith("bracket")]
    assert len(spans) == 1
    extent = spans[0].get_window_extent().transformed(ax.transData.inverted())
    assert (extent.x0, extent.x1) == pytest.approx((38.0, 40.0))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "pass (5)" in legend and "fail (SLO missed) (3)" in legend
    # the crash is drawn as an X at its load, with a dotted line there
    crashed = cap.trial(1)
    assert crashed is not None
    ax = capacity_figure(cap, crashed).axes[0]
    assert any(line.get_marker() == "X" and list(line.get_xdata()) == [32]
               for line in ax.get_lines())
    assert any(line.get_linestyle() == ":" and tuple(line.get_xdata()) == (32, 32)
               for line in ax.get_lines())
    unresolved = cap.trial(2)
    assert unresolved is not None
    ax = capacity_figure(cap, unresolved).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "unresolved (interval holds the target) (1)" in legend


def test_png_files_include_one_capacity_plot_per_trial(plots: list[Plot]) -> None:
    names = [p.name for p in plots]
    assert names == ["throughput", "pareto", "capacity-2", "capacity-0", "capacity-1",
                     "capacity-3"]


PROBE_KEYS = {"index", "label", "load", "verdict", "attainment", "ci_low", "ci_high", "target",
              "requests", "measurements", "output_throughput", "cause"}
SUMMARY_KEYS = {"capacity", "upper", "bracket", "summary", "dimension", "tolerance",
                "stopped_by", "resolved", "crash", "cliffs", "unresolved", "max_goodput",
                "probes"}


def test_json_has_the_capacity_fields_and_validates(reports: dict[str, StudyReport]) -> None:
    doc = json.loads(to_json([reports["cap"]]))["studies"][0]
    assert doc["objective"] == {"maximize": "max_concurrency_under_slo"}
    trials = {t["number"]: t for t in doc["trials"]}
    for n, t in trials.items():
        stored = reports["cap"].trial(n)
        assert stored is not None and stored.capacity is not None
        # the record's own capacity validates back to the stored answer
        assert CapacityResult.model_validate(t["capacity"]) == stored.capacity
        record = TrialRecord.model_validate({k: v for k, v in t.items() if k in
                                             TrialRecord.model_fields})
        assert record.capacity == stored.capacity
        summary = t["capacity_summary"]
        assert set(summary) == SUMMARY_KEYS
        assert all(set(p) == PROBE_KEYS for p in summary["probes"])
        assert [p["label"] for p in summary["probes"]] == [lv["label"] for lv in t["levels"]]
    assert trials[0]["capacity_summary"]["bracket"] == "c=38 [38, 40)"
    probe = trials[0]["capacity_summary"]["probes"][7]
    low, high = wilson(375, 400, 0.95)
    assert probe == {"index": 7, "label": "c=38", "load": 38.0, "verdict": "pass",
                     "attainment": 375 / 400, "ci_low": pytest.approx(low),
                     "ci_high": pytest.approx(high), "target": 0.9, "requests": 400,
                     "measurements": 2, "output_throughput": 3480.0, "cause": None}
    crash = trials[1]["capacity_summary"]
    assert (crash["capacity"], crash["upper"], crash["stopped_by"]) == (16.0, 32.0, "crashed")
    assert crash["crash"].startswith("crashed at c=32 (cuda_error: ")
    assert trials[2]["capacity_summary"]["unresolved"] == [64.0]
    assert len(trials[2]["capacity_summary"]["cliffs"]) == 1
    assert trials[3]["capacity_summary"]["capacity"] is None
    best = doc["best"]
    assert best["number"] == 2 and best["capacity"]["bracket"] == "c=44 [44, 48)"
    assert best["value"] == 44.0 and best["best_level"] == "c=44"


def test_csv_has_the_capacity_columns(reports: dict[str, StudyReport],
                                      recorded_store: StudyStore) -> None:
    rows = list(csv.DictReader(io.StringIO(to_csv([reports["cap"]]))))
    by = {int(r["number"]): r for r in rows}
    assert by[0]["capacity_bracket"] == "c=38 [38, 40)"
    assert (by[1]["capacity"], by[1]["capacity_upper"], by[1]["stopped_by"]) == (
        "16.0", "32.0", "crashed")
    assert by[1]["crash"].startswith("crashed at c=32 (cuda_error")
    assert by[2]["unresolved"] == "64" and by[2]["cliffs"].startswith("cliff: ")
    assert by[3]["capacity"] == "" and by[3]["probes"] == "4"
    # a study without a search keeps its columns as they were
    store = Store(recorded_store.url)
    try:
        plain = load_report(store, recorded_store.studies[0])
    finally:
        store.close()
    header = to_csv([plain]).splitlines()[0].split(",")
    assert "capacity" not in header and "capacity_bracket" not in header


def test_report_command_exports_and_writes_the_page(
        cap_store: StudyStore, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    got = run_main(capsys, monkeypatch, "report", "cap", "--store", cap_store.url,
                   "--format", "json")
    assert got.code == 0, got.err
    assert json.loads(got.out)["studies"][0]["best"]["capacity"]["capacity"] == 44.0
    html = tmp_path / "cap.html"
    got = run_main(capsys, monkeypatch, "report", "cap", "--store", cap_store.url,
                   "--html", str(html))
    assert got.code == 0, got.err
    assert "c=44 [44, 48)" in got.out
    assert html.read_text().count('alt="Capacity search of trial #') == 4


def test_tune_summary_and_json_give_the_best_capacity_with_its_bracket(
        capsys: pytest.CaptureFixture[str]) -> None:
    from cleanslate.cli._documents import TuneDone
    from cleanslate.cli.tune import _summary
    from cleanslate.tune.controller import StudyOutcome
    from cleanslate.tune.study import StudySpec

    trials = capacity_data.cap_trials()
    spec = StudySpec.model_validate(
        {**capacity_data.spec_of("cap", [512, 256, 128, 64]), "concurrency": [8],
         "objective": {"maximize": "output_throughput"}})
    outcome = StudyOutcome(trials=trials, new_trials=4, best=trials[2], stopped_by="plan")
    capsys.readouterr()
    _summary(spec, outcome)
    out = capsys.readouterr().out
    rows = {int(m[1]): m[2] for m in re.finditer(r"│ (\d+) │.*│ (c=\d+ \[.*?|none.*?)\s*│\n",
                                                  out)}
    assert rows == {2: "c=44 [44, 48), 7 probes; unresolved c=64; cliff c=16→c=32 -37%",
                    0: "c=38 [38, 40), 8 probes",
                    1: "c=16 [16, 32), 3 probes; crashed at c=32 (cuda_error)",
                    3: "none (c=1 did not pass), 4 probes"}
    assert "best configuration (trial 2)" in out
    assert ("\n  max concurrency within the SLOs: c=44, boundary in [44, 48) (7 probes, "
            "stopped: tolerance); cliff: ") in out
    doc = TuneDone.of(spec, outcome).model_dump(mode="json")
    assert doc["capacity"]["bracket"] == "c=44 [44, 48)"
    assert doc["capacity"]["probes"][3]["verdict"] == "unresolved"
    assert CapacityResult.model_validate(doc["best"]["capacity"]) == trials[2].capacity


def test_page_lists_each_measurements_bracket_under_racing(
        reports: dict[str, StudyReport]) -> None:
    page = render_html([reports["cap-race"]], plots=[])  # the tables alone
    details = page.split('id="trial-cap-race-0"', 1)[1].split("</details>", 1)[0]
    assert "<th>capacity [bracket)</th>" in details
    cells = re.findall(r"<td>(c=\d+ \[\d+, \d+\)), (\d+) probes</td>", details)
    assert cells == [("c=38 [38, 40)", "8"), ("c=36 [36, 38)", "8"), ("c=38 [38, 40)", "8")]
    assert "<img" not in page and "(no plot" not in page  # none asked for, none missed


def test_capacity_plots_are_capped_per_study_the_best_first(
        reports: dict[str, StudyReport], monkeypatch: pytest.MonkeyPatch) -> None:
    import cleanslate.report._html as html_mod
    import cleanslate.report._plots as plots_mod

    monkeypatch.setattr(plots_mod, "MAX_CAPACITY_PLOTS", 2)
    monkeypatch.setattr(html_mod, "MAX_CAPACITY_PLOTS", 2)
    drawn = plots_mod.capacity_plots([reports["cap"]])
    assert [p.name for p in drawn] == ["capacity-2", "capacity-0"]
    page = render_html([reports["cap"]], plots=drawn)
    for number, plotted in ((2, True), (0, True), (1, False), (3, False)):
        block = page.split(f'id="capacity-cap-{number}"', 1)[1].split('<div class="capacity"')[0]
        assert ("<img" in block) is plotted
        assert ("(no plot: at most 2 trials of a study are drawn" in block) is not plotted


def test_plot_of_probes_whose_every_request_met_the_limit() -> None:
    """80 of 80 (and 400 of 400) within the limit: the Wilson interval's high end is
    0.9999999999999999, a hair under the share 1.0; the error bar is drawn from 0, not refused
    (a real sim study's report failed so: 'yerr' must not contain negative values)."""
    assert wilson(400, 400, 0.95)[1] < 1.0
    record = capacity_data.capacity_trial(
        "all-met", 0, 64, lambda c: ((400,), 10.0 * c, None) if c <= 20 else ((200,), 9.0, None),
        per=400)
    report = StudyReport(name="all-met", spec=capacity_data.spec_of("all-met", [64]),
                         status=StudyStatus.FINISHED, created_at=None, elapsed_s=None,
                         trials=(TrialView(record=record),), store_url="sqlite://")
    ax: Any = capacity_figure(report, report.trials[0]).axes[0]
    bars = _bars(ax)
    assert bars[8.0][0] == 100.0 and bars[8.0][2] == pytest.approx(100.0)
    assert record.capacity is not None and bracket_text(record.capacity) == "c=20 [20, 22)"


def test_compare_puts_each_studys_best_capacity_side_by_side(
        reports: dict[str, StudyReport]) -> None:
    from cleanslate.report import comparison_table

    both = [reports["cap"], reports["cap-race"]]
    out = io.StringIO()
    Console(file=out, width=260, no_color=True).print(comparison_table(both))
    row = next(line for line in out.getvalue().splitlines() if "best's capacity" in line)
    assert "c=44 [44, 48), 7 (tolerance, 1 extended)" in row
    assert "c=38 [38, 40), 8 (tolerance)" in row
    page = render_html(both, plots=[])
    assert ("<td><b>best&#x27;s capacity [bracket)</b></td><td>c=44 [44, 48), 7 (tolerance, "
            "1 extended)</td><td>c=38 [38, 40), 8 (tolerance)</td>") in page
    assert 'id="capacity-cap-2"' in page and 'id="capacity-cap-race-0"' in page


def test_a_bracket_without_an_upper_end_says_why() -> None:
    from cleanslate.bench import CapacitySLO, StopReason

    def result(stopped: StopReason) -> CapacityResult:
        return CapacityResult(dimension="concurrency", slo=CapacitySLO(
            limits={"p90_tpot_ms": 5.0}), tolerance=0.1, start=8, max_load=64, capacity=64,
            upper=None, stopped_by=stopped)

    assert bracket_text(result(StopReason.MAX_LOAD)) == "c=64 (cap: every probe passed)"
    assert bracket_text(result(StopReason.INTERRUPTED)) == "at least c=64 (stopped: interrupted)"
