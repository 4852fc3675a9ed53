"""What bound each trial in a study's report (issue 37 item 3): the verdicts a trial records at
its best level and at its first miss, the one-cell and one-line forms, which flag moved which
bottleneck in an ablation, and the exports (CSV columns, JSON keys, the HTML page). The levels
are real (the fake server), their engine metrics the sim's capped at 64 and lifted to 256."""

from __future__ import annotations

import asyncio
import csv
import io
import json

import pytest

import cleanslate.engines  # noqa: F401  (the engines' advice books)
from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    GaugeStats,
    LevelResult,
    ObserveOptions,
    RandomWorkload,
    ServerConfig,
    ServerMetrics,
    bound_by,
    diagnosed,
    run_benchmark,
)
from cleanslate.report import (
    StudyReport,
    TrialView,
    ablation_lines,
    bound_cell,
    moved_text,
    render_html,
    to_csv,
    to_json,
    trial_bound_lines,
    trial_bounds,
)
from cleanslate.store import (
    LevelVerdict,
    StudyStatus,
    TrialRecord,
    TrialStatus,
    trial_bottlenecks,
)
from cleanslate.testing.fake_openai import FakeOptions, parse_faults, start_fake_server


def config(cap: int) -> ServerConfig:
    return ServerConfig(url="http://127.0.0.1:30000", engine="sim", flavour="sglang",
                        in_effect={"max_running_requests": cap, "dp_size": 1},
                        sources={"max_running_requests": "GET /server_info"})


@pytest.fixture(scope="module")
def measured() -> tuple[LevelResult, LevelResult]:
    """Two real levels (c=16, c=256) against the fake server, not observed."""
    async def go() -> tuple[LevelResult, LevelResult]:
        server = await start_fake_server(FakeOptions(parse_faults(())))
        try:
            bench = BenchConfig(url=server.url, model="m", num_prompts=16,
                                workload=RandomWorkload(input_len=8, output_len=4),
                                loads=(ClosedLoop(concurrency=16), ClosedLoop(concurrency=256)),
                                observe=ObserveOptions(enabled=False))
            low, high = (await run_benchmark(bench)).levels
            return low, high
        finally:
            server.close()
            await server.wait_closed()

    low, high = asyncio.run(go())
    return (low.model_copy(update={"client_cpu_util": 0.2}),
            high.model_copy(update={"client_cpu_util": 0.2}))


def seen(level: LevelResult, running: GaugeStats, waiting: GaugeStats) -> LevelResult:
    return level.model_copy(update={"server_metrics": ServerMetrics(
        flavour="sglang", running=running, waiting=waiting,
        kv_usage=GaugeStats(mean=0.3, max=0.31))})


def trial(number: int, cap: int, levels: tuple[LevelResult, LevelResult], value: float,
          verdicts: dict[str, LevelVerdict], best: str | None) -> TrialRecord:
    """A finished trial of the cap ``cap``: its levels diagnosed against that configuration,
    its verdict fields set as the trial sets them."""
    low = diagnosed(levels[0], (), config(cap), "sim")
    high = diagnosed(levels[1], (low,), config(cap), "sim")
    done = (low, high)
    return TrialRecord(study="capped", number=number, params={"max-running-requests": cap},
                       status=TrialStatus.FEASIBLE if best else TrialStatus.INFEASIBLE,
                       value=value if best else None, best_level=best, levels=done,
                       level_verdicts=verdicts,
                       **trial_bottlenecks(done, verdicts, best))


@pytest.fixture(scope="module")
def study(measured: tuple[LevelResult, LevelResult]) -> StudyReport:
    low, high = measured
    ok = {"c=16": LevelVerdict.OK, "c=256": LevelVerdict.OK}
    capped = (seen(low, GaugeStats(mean=15.8, max=16), GaugeStats(mean=0, max=1)),
              seen(high, GaugeStats(mean=64, max=64, share_at_max=0.97),
                   GaugeStats(mean=188, max=192)))
    lifted = (capped[0], seen(high, GaugeStats(mean=250, max=256), GaugeStats(mean=2, max=9)))
    at32 = (capped[0], seen(high, GaugeStats(mean=32, max=32, share_at_max=0.98),
                            GaugeStats(mean=220, max=224)))
    missed = trial(2, 32, at32, 0.0, {"c=16": LevelVerdict.OK,
                                      "c=256": LevelVerdict.SLO_MISS}, "c=16")
    spec = {"name": "capped", "engine": "sim", "strategy": "ablation",
            "baseline": {"max-running-requests": 64},
            "space": {"max-running-requests": [32, 64, 256]},
            "objective": {"maximize": "output_throughput"}}
    trials = (TrialView(trial(0, 64, capped, 5400.0, ok, "c=256")),
              TrialView(trial(1, 256, lifted, 11200.0, ok, "c=256")),
              TrialView(missed.model_copy(update={"value": 2400.0})))
    return StudyReport(name="capped", spec=spec, status=StudyStatus.FINISHED, created_at=0.0,
                       elapsed_s=1.0, trials=trials, store_url="sqlite:///x.db")


def test_a_trial_records_the_verdict_at_its_best_level_and_at_its_first_miss(
        study: StudyReport) -> None:
    base, lifted, missed = (t.record for t in study.trials)
    assert base.best_bottleneck is not None and base.best_bottleneck.verdict == "running_cap"
    assert base.limit_level is None and base.limit_bottleneck is None
    assert lifted.best_bottleneck is not None
    assert lifted.best_bottleneck.verdict == "offered_load"
    assert missed.limit_level == "c=256" and missed.limit_bottleneck is not None
    assert bound_cell(base) == "running_cap at c=256"
    assert missed.best_bottleneck is not None
    low = bound_by(missed.best_bottleneck)  # offered_load, clear or likely ('?')
    assert low.rstrip("?") == "offered_load"
    assert bound_cell(missed) == f"{low} at c=16; running_cap at c=256 (slo_miss)"
    best_line, miss_line = trial_bound_lines(missed)
    assert best_line.startswith(f"bound by {low} at c=16: running 15.8 on average")
    assert miss_line.startswith("first miss: running_cap at c=256 (slo_miss): running 32 of "
                                "cap 32"), miss_line
    assert "raise --max-running-requests above 32" in miss_line


def test_a_record_written_before_the_fields_reads_its_levels(study: StudyReport) -> None:
    base = study.trials[0].record
    old = base.model_copy(update={"best_bottleneck": None, "limit_level": None,
                                  "limit_bottleneck": None})
    best, limit = trial_bounds(old)
    assert best is not None and best.bottleneck == base.best_bottleneck and limit is None
    bare = old.model_copy(update={"levels": tuple(lv.model_copy(update={"bottleneck": None})
                                                  for lv in old.levels)})
    assert trial_bounds(bare) == (None, None) and bound_cell(bare) == "-"


def test_the_ablation_says_which_flag_moved_which_bottleneck(study: StudyReport) -> None:
    effects = {e.trial.number: e for e in study.ablation_effects()}
    after = effects[1].trial.record.best_bottleneck
    assert after is not None and after.verdict == "offered_load"
    lifted = moved_text(effects[1])
    assert lifted.startswith(f"max-running-requests 64 -> 256: running_cap -> "
                             f"{bound_by(after)}, +107.4 %"), lifted
    assert "(not moved)" not in lifted
    lowered = moved_text(effects[2])
    assert lowered.startswith("max-running-requests 64 -> 32: running_cap -> offered_load"), \
        lowered
    lines = ablation_lines(study)
    assert lines[0] == "what each change moved (against the baseline, trial 0):"
    assert lines[1].startswith("  baseline bound by running_cap at c=256: running 64 of cap 64")
    assert f"  {lifted} (trial 1)" in lines


def test_the_exports_and_the_page_carry_the_verdicts(study: StudyReport) -> None:
    rows = {row["number"]: row for row in csv.DictReader(io.StringIO(to_csv([study])))}
    assert rows["0"]["bound_by"] == "running_cap at c=256"
    assert (rows["0"]["best_bottleneck"], rows["0"]["best_confidence"]) == ("running_cap",
                                                                            "clear")
    assert (rows["2"]["limit_level"], rows["2"]["limit_bottleneck"]) == ("c=256", "running_cap")
    doc = json.loads(to_json([study]))["studies"][0]
    first = next(t for t in doc["trials"] if t["number"] == 0)
    assert first["best_bottleneck"]["verdict"] == "running_cap"
    assert first["levels"][1]["bottleneck"]["evidence"][0].startswith("running 64 of cap 64")
    lifted = next(a for a in doc["ablation"] if a["trial"] == 1)
    assert (lifted["bottleneck_before"], lifted["bottleneck_after"]) == ("running_cap",
                                                                         "offered_load")
    assert lifted["moved"].startswith("max-running-requests 64 -> 256: running_cap -> ")
    page = render_html([study], plots=[], generated_at=0.0)
    assert "<th>bound by</th>" in page and "bound by (baseline → change)" in page
    assert "c=256 bound by running_cap: running 64 of cap 64" in page
    assert "raise --max-running-requests above 64" in page
