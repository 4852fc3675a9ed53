"""Reports with intervals (issue 24, point 6): studies with replicates and races saved to a real
SQLite store (``stats_data``), the report read back; every figure checked against a hand
computation with :mod:`cleanslate.stats`."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

import pytest
from rich.console import Console

from cleanslate.report import StudyReport, load_report, render_html, to_csv, to_json
from cleanslate.report._console import print_differences, print_report
from cleanslate.report._plots import ablation_figure, pareto_figure, throughput_figure
from cleanslate.report._stats import difference, half_width_text, welch
from cleanslate.stats import compare_paired, t_interval
from cleanslate.store import Store
from cleanslate.store._trials import StudyStatus
from cleanslate.tune.race import summarize
from cleanslate.tune.study import Statistics
from tests.cli.inproc import run_main
from tests.report import stats_data
from tests.report.conftest import StudyStore
from tests.report.stats_data import A_SEEDS, A_VALUES, B_SEEDS, B_VALUES, GPU_S, TTFT


@pytest.fixture(scope="module")
def stats_store(tmp_path_factory: pytest.TempPathFactory) -> StudyStore:
    folder = tmp_path_factory.mktemp("stats")
    url = f"sqlite:///{folder / 'cleanslate.db'}"
    stats_data.save(url)
    return StudyStore(folder, url, ("race-a", "race-b"))


@pytest.fixture(scope="module")
def reports(stats_store: StudyStore) -> dict[str, StudyReport]:
    store = Store(stats_store.url)
    try:
        return {n: load_report(store, n) for n in stats_store.studies}
    finally:
        store.close()


def _text(report: StudyReport) -> str:
    out = io.StringIO()
    print_report(Console(file=out, width=240, no_color=True), report)
    return out.getvalue()


def test_json_best_carries_its_interval_and_tie_set(reports: dict[str, StudyReport]) -> None:
    doc = json.loads(to_json([reports["race-a"]]))["studies"][0]
    best = doc["best"]
    # #0 is the incumbent and has the best mean; #1 is tied with it, #3 undecided, #2 lost
    # without a race.
    hand = t_interval(A_VALUES[0])
    assert best["number"] == 0
    assert best["value"] == pytest.approx(hand.mean)
    assert best["ci_low"] == pytest.approx(hand.low)
    assert best["ci_high"] == pytest.approx(hand.high)
    assert best["n_replicates"] == 5
    assert best["tied_with"] == [1]
    assert best["undecided_with"] == [3]
    assert {"params", "best_level", "launch_command"} <= set(best)  # the keys it had
    trials = {t["number"]: t for t in doc["trials"]}
    assert [t["number"] for t in doc["trials"]][:1] == [0]  # the best first
    # The outcome's words (cleanslate.stats.Outcome), as tune prints them.
    assert [trials[n]["standing"] for n in range(5)] == ["best", "tie", "loss",
                                                         "undecided", None]
    one = t_interval(A_VALUES[1])
    assert (trials[1]["ci_low"], trials[1]["ci_high"]) == (pytest.approx(one.low),
                                                           pytest.approx(one.high))
    assert trials[1]["n_replicates"] == 5
    assert [(r["value"], r["seed"], r["slot"], r["discarded"]) for r in trials[0]["replicates"]
            ] == [(v, s, "local/gpus=0/port=30000", None)
                  for v, s in zip(A_VALUES[0], A_SEEDS, strict=True)]
    assert [r["pair"] for r in trials[1]["replicates"]] == [0, 1, 2, 3, 4]
    assert trials[2]["ci_low"] is None and trials[2]["n_replicates"] == 1
    # #1 against the best: its race as the racing code recorded it.
    race = compare_paired(A_VALUES[0], A_VALUES[1], tie_margin=0.03, max_pairs=5)
    vs = trials[1]["vs_best"]
    assert vs["verdict"] == "tie" and vs["method"] == "race" and vs["pairs"] == 5
    assert (vs["diff"], vs["ci_low"], vs["ci_high"]) == (
        pytest.approx(race.diff), pytest.approx(race.low), pytest.approx(race.high))
    assert trials[2]["vs_best"]["verdict"] == "loss" and trials[2]["vs_best"]["ci_low"] is None
    assert trials[1]["vs_best"]["too_few_measurements"] is False  # five pairs
    # The statistics' cost: every measurement beyond a configuration's first.
    extra = sum(len(v) - 1 for v in A_VALUES.values())
    total = GPU_S * (sum(len(v) for v in A_VALUES.values()) + 0.25)
    assert doc["statistics"]["replicates_run"] == extra == 12
    assert doc["statistics"]["gpu_s"] == pytest.approx(extra * GPU_S)
    assert doc["statistics"]["total_gpu_s"] == pytest.approx(total)
    assert doc["statistics"]["share"] == pytest.approx(extra * GPU_S / total)


def test_fixed_replicates_tie_set_and_single_shot(reports: dict[str, StudyReport],
                                                  recorded_store: StudyStore) -> None:
    doc = json.loads(to_json([reports["race-b"]]))["studies"][0]
    assert doc["best"]["number"] == 0  # about 6 % faster than the others
    assert doc["best"]["tied_with"] == []
    assert doc["best"]["undecided_with"] == [3]  # no seed in common with the best
    # A study measured once per configuration has no interval and no tie set.
    quick = load_report(Store(recorded_store.url), "quickstart")
    best = json.loads(to_json([quick]))["studies"][0]["best"]
    assert best["ci_low"] is None and best["ci_high"] is None and best["tied_with"] == []
    assert best["n_replicates"] == 1
    assert "one run: no interval" in _text(quick)


def test_compare_gives_each_shared_configuration_its_difference(
        reports: dict[str, StudyReport]) -> None:
    a, b = reports["race-a"], reports["race-b"]
    doc = json.loads(to_json([a, b]))
    [comparison] = doc["comparisons"]
    assert (comparison["a"], comparison["b"]) == ("race-a", "race-b")
    rows = {c["params"]["max-running-requests"]: c for c in comparison["configurations"]}
    assert set(rows) == {64, 128, 256, 32}  # 512 was infeasible in race-a, not run in race-b
    # 64 and 128 share seeds 11-13: paired, one look (the whole error rate on one test).
    for mrr, number in ((64, 0), (128, 1)):
        hand = compare_paired(A_VALUES[number][:3], B_VALUES[number], tie_margin=0.03,
                              confidence=0.95, max_pairs=2)
        row = rows[mrr]
        assert row["method"] == "paired" and row["pairs"] == 3
        assert row["diff"] == pytest.approx(hand.diff)
        assert row["ci_low"] == pytest.approx(hand.low)
        assert row["ci_high"] == pytest.approx(hand.high)
    assert rows[64]["verdict"] == "win" and rows[64]["significant"] is True
    assert 0.055 < rows[64]["diff"] < 0.065
    # The same speed: a tie, never a win, though race-b's mean is higher.
    assert rows[128]["verdict"] == "tie" and rows[128]["significant"] is False
    assert rows[128]["ci_low"] < 0 < rows[128]["ci_high"]
    # One measurement in race-a: no interval, said so.
    assert rows[256]["method"] == "single" and rows[256]["ci_low"] is None
    assert rows[256]["verdict"] == "one run on a side: no interval"
    # No seed in common: unpaired (Welch) on the log values.
    assert rows[32]["method"] == "welch"
    assert rows[32]["ci_low"] < 0 < rows[32]["ci_high"] and not rows[32]["significant"]
    out = io.StringIO()
    print_differences(Console(file=out, width=240, no_color=True), a, b)
    lines = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines()
             if line.startswith("│")}
    assert "win" in lines["max-running-requests=64"]
    assert "tie" in lines["max-running-requests=128"]
    assert "win" not in lines["max-running-requests=128"]
    assert "one run on a side: no interval" in lines["max-running-requests=256"]


def test_welch_matches_scipy_on_the_log_values() -> None:
    from scipy import stats as sps

    a, b = A_VALUES[3], B_VALUES[3]
    diff, low, high, _outcome = welch(a, b, tie_margin=0.03, confidence=0.95)
    test = sps.ttest_ind([math.log(v) for v in b], [math.log(v) for v in a], equal_var=False)
    ci = test.confidence_interval(0.95)
    assert low == pytest.approx(math.expm1(ci.low))
    assert high == pytest.approx(math.expm1(ci.high))
    assert diff == pytest.approx(math.expm1(sum(map(math.log, b)) / 3
                                            - sum(map(math.log, a)) / 5))
    # Clearly apart: a win; the direction flips for a metric to minimize.
    assert welch([100, 101, 99], [110, 111, 109], tie_margin=0.03,
                 confidence=0.95)[3].value == "win"
    assert welch([100, 101, 99], [110, 111, 109], tie_margin=0.03, confidence=0.95,
                 higher_is_better=False)[3].value == "loss"


def test_difference_of_single_runs_has_no_interval(reports: dict[str, StudyReport]) -> None:
    two = reports["race-a"].trial(2)
    assert two is not None
    found = difference(two.record, two.record, Statistics())
    assert found.method == "single" and found.low is None
    assert found.verdict == "one run each: no interval" and not found.significant


def test_terminal_table_prints_half_widths_and_marks(reports: dict[str, StudyReport]) -> None:
    text = _text(reports["race-a"])
    rows = {line.split("│")[1].strip(): line for line in text.splitlines()
            if line.startswith("│")}
    hand = t_interval(A_VALUES[0])
    assert f"mean {hand.mean:,.0f} ± {hand.half_width:.1f} (5 runs)" in rows["0"]
    assert "best" in rows["0"] and "tie" in rows["1"] and "undecided" in rows["3"]
    assert "loss" in rows["2"]
    assert "±" not in rows["2"]  # one measurement
    race = compare_paired(A_VALUES[0], A_VALUES[1], tie_margin=0.03, max_pairs=5)
    assert race.low is not None and race.high is not None
    assert (f"tie with the best: #1 ({race.diff * 100:+.1f} % [{race.low * 100:+.1f}, "
            f"{race.high * 100:+.1f}] tie (race, 5 pairs))") in text
    assert "undecided against the best: #3 (" in text
    assert "statistics: 12 more measurements, 1,200 GPU-s of 1,625 GPU-s (74 %)" in text


def test_html_shows_intervals_and_the_tie(reports: dict[str, StudyReport]) -> None:
    page = render_html([reports["race-a"]], plots=[])
    hand = t_interval(A_VALUES[0])
    assert f"mean {hand.mean:,.0f} ± {hand.half_width:.1f} (5 runs)" in page
    assert '<span class="badge b-tie">tie</span>' in page
    assert 'class="tied-row"' in page
    assert "statistics: 12 more measurements" in page
    assert "races run as a challenger" in page  # the race table of #1's details
    # The ablation table calls the tie what it is.
    assert "(tie)" in page and "no significant effect" not in page
    both = render_html([reports["race-a"], reports["race-b"]], plots=[])
    assert "race-b against race-a" in both
    assert '<span class="badge b-tie">tie</span>' in both
    assert '<span class="badge b-win">win</span>' in both


def test_csv_has_interval_columns(reports: dict[str, StudyReport]) -> None:
    rows = {int(r["number"]): r for r in csv.DictReader(io.StringIO(to_csv(
        [reports["race-a"]])))}
    hand = t_interval(A_VALUES[1])
    assert float(rows[1]["ci_low"]) == pytest.approx(hand.low)
    assert float(rows[1]["ci_high"]) == pytest.approx(hand.high)
    assert rows[1]["n_replicates"] == "5" and rows[1]["standing"] == "tie"
    assert rows[0]["standing"] == "best"
    assert rows[2]["ci_low"] == "" and rows[2]["n_replicates"] == "1"
    assert rows[4]["ci_low"] == "" and rows[4]["n_replicates"] == ""


def _errorbars(fig: Any) -> list[Any]:
    from matplotlib.container import ErrorbarContainer

    return [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_throughput_plot_has_the_levels_intervals(reports: dict[str, StudyReport]) -> None:
    report = reports["race-a"]
    bars = _errorbars(throughput_figure([report]))
    assert len(bars) == 3  # #0, #1 and #3 were measured five times; #2 once
    spans = sorted(tuple(sorted(round(float(seg[1][1] - seg[0][1]), 6)
                                for seg in bar.lines[2][0].get_segments()))
                   for bar in bars)
    hands = []
    for number in (0, 1, 3):
        c32 = t_interval(A_VALUES[number])
        c8 = t_interval([v * 0.5 for v in A_VALUES[number]])
        assert c32.high is not None and c32.low is not None
        assert c8.high is not None and c8.low is not None
        hands.append(tuple(sorted((round(c8.high - c8.low, 6), round(c32.high - c32.low, 6)))))
    assert spans == sorted(hands)


def test_pareto_and_ablation_plots_have_error_bars(reports: dict[str, StudyReport]) -> None:
    report = reports["race-a"]
    bars = _errorbars(pareto_figure([report]))
    assert len(bars) == 6  # two levels each of #0, #1, #3
    ttft = t_interval([TTFT[0], *TTFT[1:]])
    heights = {round(float(seg[1][1] - seg[0][1]), 6) for bar in bars
               for seg in bar.lines[2][1].get_segments()}
    assert ttft.high is not None and ttft.low is not None
    assert round(ttft.high - ttft.low, 6) in heights
    fig = ablation_figure(report)
    [bar] = _errorbars(fig)
    widths = sorted(round(float(seg[1][0] - seg[0][0]), 4)
                    for seg in bar.lines[2][0].get_segments())
    # The tie (#1) and the undecided race (#3): each its race's interval, in percent.
    races = [compare_paired(A_VALUES[0], A_VALUES[n], tie_margin=0.03, max_pairs=5)
             for n in (1, 3)]
    expected = sorted(round((r.high - r.low) * 100, 4) for r in races  # type: ignore[operator]
                      )
    assert [w for w in widths if w > 0] == expected


def test_cli_json_and_compare(stats_store: StudyStore, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    done = run_main(capsys, monkeypatch, "report", "race-a", "--store", stats_store.url,
                    "--format", "json", "--compare", "race-b")
    assert done.code == 0, done.err
    doc = json.loads(done.out)
    assert doc["studies"][0]["best"]["tied_with"] == [1]
    assert len(doc["comparisons"][0]["configurations"]) == 4
    done = run_main(capsys, monkeypatch, "report", "race-a", "--store", stats_store.url,
                    "--compare", "race-b")
    assert done.code == 0, done.err
    assert "race-b against race-a: the configurations both ran" in done.out
    assert "paired by seed, 3 pairs" in done.out


def test_half_width_keeps_the_means_precision() -> None:
    assert half_width_text("1,002", 8.09) == "8.1"
    assert half_width_text("1,002", 35.8) == "36"
    assert half_width_text("41.0", 2.84) == "2.8"
    assert half_width_text("4.7", 0.012) == "0.012"
    assert half_width_text("1,002", 0.0) == "0"
    assert B_SEEDS[3] == [21, 22, 23]


def test_host_effects_are_reported_per_slot(tmp_path: Any) -> None:
    # Two configurations, each measured twice on a slot and twice on another about 10 %
    # faster: the slot's effect, not a configuration's.
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    slow, fast = "a/gpus=0/port=1", "b/gpus=0/port=1"
    values = {0: ([1000.0, 1010.0], [1100.0, 1108.0]), 1: ([990.0, 1002.0], [1093.0, 1096.0])}
    records = []
    for number, (on_a, on_b) in values.items():
        a = stats_data.trial("fleet-c", number, 64 * (number + 1), on_a, [1, 2], slot=slow)
        b = stats_data.trial("fleet-c", number, 64 * (number + 1), on_b, [1, 2], slot=fast)
        reps = (*a.replicates, *(r.model_copy(update={"index": r.index + 2})
                                 for r in b.replicates))
        records.append(summarize(a.model_copy(update={"replicates": reps}), 0.95))
    store = Store(url)
    try:
        store.save_study("fleet-c", stats_data.spec_of("fleet-c", {"replicates": 4}),
                         StudyStatus.FINISHED)
        for record in records:
            store.save_trial(record)
        report = load_report(store, "fleet-c")
    finally:
        store.close()
    effects = json.loads(to_json([report]))["studies"][0]["statistics"]["host_effects"]
    per_trial = []
    for on_a, on_b in values.values():
        la = sum(map(math.log, on_a)) / 2
        lb = sum(map(math.log, on_b)) / 2
        per_trial.append((lb - la) / 2)
    hand = t_interval(per_trial)
    assert effects[fast]["effect"] == pytest.approx(math.expm1(hand.mean))
    assert effects[fast]["ci_low"] == pytest.approx(math.expm1(hand.low))  # type: ignore[arg-type]
    assert effects[fast]["n"] == 2
    assert effects[slow]["effect"] == pytest.approx(math.expm1(-hand.mean))
    assert 0.04 < effects[fast]["effect"] < 0.055
    assert f"{fast} +{math.expm1(hand.mean) * 100:.1f} %" in _text(report)


def test_a_race_outcome_this_version_cannot_read_is_said_not_raised(
        tmp_path: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    records = stats_data.race_a()
    odd = records[1].model_copy(update={"races": (records[1].races[0].model_copy(
        update={"outcome": "<b>won</b>"}),)})
    store = Store(url)
    try:
        store.save_study("odd", stats_data.spec_of("odd", {"replicates": "auto"}),
                         StudyStatus.FINISHED)
        for record in (records[0], odd, *records[2:]):
            store.save_trial(record.model_copy(update={"study": "odd"}))
    finally:
        store.close()
    done = run_main(capsys, monkeypatch, "report", "odd", "--store", url)
    assert done.code == 0, done.err
    assert "no tie set: a recorded race or measurement is not readable" in done.out
    assert "best configuration (trial 0)" in done.out  # the best mean, as without races
    page = render_html([load_report(Store(url), "odd")], plots=[])
    assert "<b>won</b>" not in page


def test_studies_of_different_objectives_are_not_compared(
        reports: dict[str, StudyReport]) -> None:
    from dataclasses import replace

    a = reports["race-a"]
    b = replace(reports["race-b"], spec={**reports["race-b"].spec,
                                         "objective": {"minimize": "p99_ttft_ms"}})
    [comparison] = json.loads(to_json([a, b]))["comparisons"]
    assert comparison["configurations"] == []
    assert "race-b minimizes p99_ttft_ms, race-a maximizes output_throughput" in \
        comparison["note"]
    out = io.StringIO()
    print_differences(Console(file=out, width=200, no_color=True), a, b)
    assert "their values are not comparable" in out.getvalue()


def test_tune_says_what_the_report_says() -> None:
    """``tune``'s lines after its table, on the same records: the same words (before: "not
    told apart from it" where the report said ``undecided``, and ``tied``/``beaten``), and a
    mean labelled as one."""
    from cleanslate.cli._stats import marks, statistics_lines, value_text
    from cleanslate.report._stats import study_spec
    from cleanslate.tune.race import tie_set

    spec = study_spec(stats_data.spec_of("race-a", {"replicates": "auto",
                                                      "tie_margin": 0.03}))
    trials = stats_data.race_a()
    assert marks(tie_set(trials, spec)) == {0: "best", 1: "tie", 2: "loss", 3: "undecided"}
    lines = statistics_lines(spec, trials, str)
    hand = t_interval(A_VALUES[0])
    assert lines[0].startswith(f"  output_throughput = mean {hand.mean:,.1f} ± ")
    assert "(5 runs, each a new server; 95% interval)" in lines[0]
    assert lines[1].startswith("  tie with it (within ±3%): trial 1 ")
    assert lines[2].startswith("  undecided against it (not told apart: neither a difference "
                               "nor a tie is shown): trial 3 ")
    three = t_interval(A_VALUES[3])
    assert f") mean {three.mean:,.1f} ± " in lines[2] and " (5 runs), " in lines[2]
    assert not any("told apart from it" in line for line in lines)
    assert value_text(trials[2]) == "900.0"  # one run: no mean to label
