"""The level seam (issue 36, item 1): every level, repeat and ``--find-max`` probe is watched
through one :class:`Harness`; an observer starts before the level's first request and stops
after its last answer with the level's window; its summary lands on the result under its key
and its raw samples in the harness's sink. The stored models pool over repeats, and a level
stored before observation existed still reads.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import cleanslate.engines  # noqa: F401  (the engines register their metric names)
from cleanslate.bench import (
    BenchConfig,
    CapacitySearch,
    CapacitySLO,
    ClosedLoop,
    GaugeStats,
    GpuTelemetry,
    Harness,
    LevelContext,
    LevelEnd,
    LevelResult,
    Observed,
    ObserveOptions,
    RandomWorkload,
    ServerMetrics,
    find_max,
    observers_for,
    run_benchmark,
    run_level,
)
from cleanslate.bench._observed import merge_gpu, merge_server_metrics
from cleanslate.bench._server_metrics import MetricSample, summarize
from tests.bench.conftest import fake_server

SMALL = RandomWorkload(input_len=8, output_len=4)


class Recorder:
    """An observer that keeps what the seam told it: when it started and stopped, and the
    level's end. Its summary is a ServerMetrics naming the measurement it watched."""

    key = "server_metrics"

    def __init__(self, ctx: LevelContext, log: list[dict[str, Any]]) -> None:
        self.ctx = ctx
        self.entry: dict[str, Any] = {"label": ctx.label}
        log.append(self.entry)

    async def start(self) -> None:
        self.entry["started"] = time.perf_counter()

    async def stop(self, end: LevelEnd) -> Observed:
        self.entry["stopped"] = time.perf_counter()
        self.entry["end"] = end
        return Observed(self.key, ServerMetrics(url=self.ctx.label, samples=1,
                                                window_samples=1),
                        ({"t": end.window[0] if end.window else 0.0},))


def recording(log: list[dict[str, Any]]) -> Any:
    return lambda ctx: Recorder(ctx, log)


def config(url: str, **fields: Any) -> BenchConfig:
    return BenchConfig(url=url, model="m", workload=SMALL, num_prompts=8,
                       observe=ObserveOptions(metrics=False), **fields)


def test_every_level_is_observed_inside_its_own_window() -> None:
    log: list[dict[str, Any]] = []
    sink: list[tuple[str, str, Sequence[Mapping[str, Any]]]] = []

    async def go() -> Any:
        async with fake_server(itl_s=0.002) as (url, _):
            cfg = config(url, loads=(ClosedLoop(concurrency=2), ClosedLoop(concurrency=4)))
            harness = Harness(observers=(recording(log),),
                              on_samples=lambda *a: sink.append(a))
            return await run_benchmark(cfg, harness)

    result = asyncio.run(go())
    assert [e["label"] for e in log] == ["c=2", "c=4"]
    for level, entry in zip(result.levels, log, strict=True):
        end: LevelEnd = entry["end"]
        assert end.level_span is not None and end.window is not None
        # started before the first send, stopped after the last answer
        assert entry["started"] <= end.level_span[0] <= end.level_span[1] <= entry["stopped"]
        assert end.level_span[0] <= end.window[0] <= end.window[1] <= end.level_span[1]
        assert end.output_tokens == level.total_output_tokens
        assert end.completed == level.completed == 8
        assert level.server_metrics is not None and level.server_metrics.url == level.label
    assert [(label, key) for label, key, _ in sink] == [("c=2", "server_metrics"),
                                                        ("c=4", "server_metrics")]


def test_repeats_are_observed_one_by_one_and_pooled() -> None:
    log: list[dict[str, Any]] = []
    harness = Harness(observers=(recording(log),))

    async def go() -> LevelResult:
        async with fake_server() as (url, _):
            return await run_level(config(url, repeats=1), ClosedLoop(concurrency=2), harness)

    one = asyncio.run(go())
    assert one.server_metrics is not None and harness.kept[("c=2", "server_metrics")]

    log.clear()

    async def three() -> Any:
        async with fake_server() as (url, _):
            return await run_benchmark(config(url, repeats=3,
                                              loads=(ClosedLoop(concurrency=2),)),
                                       Harness(observers=(recording(log),)))

    level = asyncio.run(three()).levels[0]
    assert [e["label"] for e in log] == [f"c=2 repeat {i}/3" for i in (1, 2, 3)]
    assert level.server_metrics is not None
    assert level.server_metrics.merged == 3 and level.server_metrics.samples == 3
    assert all(r.server_metrics is not None for r in level.repeats)


def test_every_find_max_probe_is_observed() -> None:
    log: list[dict[str, Any]] = []

    async def go() -> Any:
        async with fake_server() as (url, _):
            search = CapacitySearch("concurrency",
                                    CapacitySLO(limits={"p50_ttft_ms": 10_000.0}),
                                    start=2, max_load=4, tolerance=0.5)
            return await find_max(config(url), search, Harness(observers=(recording(log),)))

    result = asyncio.run(go())
    assert len(result.probes) >= 2
    assert [e["label"] for e in log][:2] == ["c=2", "c=4"]
    assert all(p.level is not None and p.level.server_metrics is not None
               for p in result.probes)


def test_no_observe_runs_no_observer_not_even_the_harness_own() -> None:
    log: list[dict[str, Any]] = []

    async def go() -> LevelResult:
        async with fake_server() as (url, _):
            cfg = config(url).model_copy(update={"observe": ObserveOptions(enabled=False)})
            return await run_level(cfg, ClosedLoop(concurrency=2),
                                   Harness(observers=(recording(log),)))

    level = asyncio.run(go())
    assert log == [] and level.server_metrics is None and level.gpu is None
    assert observers_for(None) == () and observers_for(ObserveOptions(enabled=False),
                                                       extra=(recording(log),)) == ()


def test_an_endpoint_without_metrics_never_costs_the_level() -> None:
    """The default observer scrapes the fake server, which has no /metrics: the level is
    whole and the summary says why there is nothing."""
    async def go() -> LevelResult:
        async with fake_server() as (url, stats):
            cfg = BenchConfig(url=url, model="m", workload=SMALL, num_prompts=8)
            level = await run_level(cfg, ClosedLoop(concurrency=2))
            assert stats.requests == 8  # scrapes are not completions
            return level

    level = asyncio.run(go())
    assert level.completed == 8 and level.failed == 0
    assert level.server_metrics is not None
    assert level.server_metrics.unreadable is not None
    assert "404" in level.server_metrics.unreadable


def test_observe_options_are_checked_and_named() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        ObserveOptions(interval_s=0.001)
    with pytest.raises(ValueError, match="extra"):
        ObserveOptions.model_validate({"intervall_s": 1})


def _sample(t: float, running: float, waiting: float, gen: float) -> MetricSample:
    return MetricSample(t, series={"running": {"": running}, "waiting": {"": waiting},
                                   "generation_tokens": {"": gen}})


def test_gauges_cover_the_steady_window_and_counters_the_whole_level() -> None:
    samples = [_sample(0.0, 0, 0, 100), _sample(1.0, 4, 10, 150), _sample(2.0, 8, 20, 250),
               _sample(3.0, 2, 0, 300)]
    s = summarize(samples, flavour="sglang", url="u", window=(0.5, 2.5))
    assert s.gauge_window == "steady" and s.window_samples == 2 and s.samples == 4
    assert s.running == GaugeStats(mean=6.0, max=8.0, share_at_max=0.5)
    assert s.generation_tokens == 200.0  # baseline to final scrape
    # a window no scrape fell in (a level shorter than the period): the whole level
    short = summarize(samples, flavour="sglang", url="u", window=(1.2, 1.3))
    assert short.gauge_window == "level" and short.running is not None
    assert short.running.max == 8.0
    # the same, the scrape period said: 0.1 s is shorter than two periods of 0.25 s
    assert summarize(samples, flavour="sglang", url="u", window=(1.2, 1.3),
                     interval_s=0.25).running == short.running


def test_a_steady_window_no_scrape_answered_in_leaves_the_gauges_unknown() -> None:
    """vLLM's CPU build at c=16 on 2 loaded cores: its API server answered a scrape as the
    level started and one after it ended, both "running 0", and timed out in between, while
    its log said 2 running, 7 waiting. Those idle readings are not the level's: its gauges are
    unknown, said so, and its counters are kept (the diagnosis then reads the client alone)."""
    samples = [_sample(0.0, 0, 0, 640), _sample(1.1, 0, 0, 640),
               MetricSample(2.2, error="no answer within 2 s"), _sample(9.0, 0, 0, 6784)]
    s = summarize(samples, flavour="vllm", url="u", window=(1.5, 8.0), interval_s=0.25)
    assert s.running is None and s.waiting is None and s.window_samples == 0
    assert s.unreadable == (
        "no scrape answered inside the level's steady window (6.5 s, a scrape every 0.25 s): "
        "3 answered before or after it, 1 failed (last: no answer within 2 s); running and "
        "waiting during the level are not known")
    assert s.generation_tokens == 6144.0 and s.samples == 3 and s.failed_scrapes == 1


def test_merges_weight_by_samples_and_keep_the_largest_max() -> None:
    a = ServerMetrics(samples=3, window_samples=1, running=GaugeStats(mean=10, max=10),
                      preemptions=2.0, prefix_cache_hit_rate=0.5)
    b = ServerMetrics(samples=5, window_samples=3, running=GaugeStats(mean=2, max=4),
                      preemptions=1.0, prefix_cache_hit_rate=0.1)
    bad = ServerMetrics(unreadable="HTTP 404")
    m = merge_server_metrics([a, b, bad])
    assert m is not None and m.merged == 3 and m.samples == 8
    assert m.running == GaugeStats(mean=4.0, max=10.0)
    assert m.preemptions == 3.0
    assert m.prefix_cache_hit_rate == pytest.approx(0.2)
    assert merge_server_metrics([bad, None]) == bad and merge_server_metrics([None]) is None
    g1 = GpuTelemetry(index=0, window_samples=2, power_w=GaugeStats(mean=100, max=120),
                      energy_j=50.0, joules_per_output_token=0.5,
                      clock_events={"sw_power_cap": 1.0})
    g2 = GpuTelemetry(index=0, window_samples=2, power_w=GaugeStats(mean=200, max=300),
                      energy_j=150.0, joules_per_output_token=1.5)
    (gpu,) = merge_gpu([(g1,), (g2,)]) or ()
    assert gpu.power_w == GaugeStats(mean=150, max=300) and gpu.energy_j == 200.0
    assert gpu.joules_per_output_token == pytest.approx(1.0)  # 200 J over 200 tokens
    assert gpu.clock_events == {"sw_power_cap": 0.5}


def test_a_level_stored_before_observation_reads_without_it() -> None:
    async def go() -> LevelResult:
        async with fake_server() as (url, _):
            return await run_level(config(url), ClosedLoop(concurrency=2))

    stored = asyncio.run(go()).model_dump(mode="json")
    for key in ("server_metrics", "gpu"):
        stored.pop(key, None)
    old = LevelResult.model_validate(stored)
    assert old.server_metrics is None and old.gpu is None


def test_a_program_that_never_imported_the_engines_is_told_why_it_has_no_metrics() -> None:
    """bench never imports an engine; the engines register their metric names. A program
    that runs the benchmark alone gets a level whose ``server_metrics`` says what to do."""
    code = (
        "import asyncio, sys\n"
        "from cleanslate.bench import BenchConfig, ClosedLoop, RandomWorkload, run_level\n"
        "from cleanslate.testing.fake_openai import fake_openai_thread\n"
        "assert 'cleanslate.engines' not in sys.modules\n"
        "with fake_openai_thread() as server:\n"
        "    cfg = BenchConfig(url=server.url, model='m', num_prompts=4,\n"
        "                      workload=RandomWorkload(input_len=8, output_len=4))\n"
        "    level = asyncio.run(run_level(cfg, ClosedLoop(concurrency=2)))\n"
        "print(level.completed, level.server_metrics.unreadable)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.startswith("4 ") and "import cleanslate.engines" in out


class Broken:
    """An observer that breaks its promise not to raise, at ``start`` or at ``stop``."""

    key = "gpu"

    def __init__(self, at: str) -> None:
        self.at = at

    async def start(self) -> None:
        if self.at == "start":
            raise RuntimeError("boom at start")

    async def stop(self, end: LevelEnd) -> Observed:
        raise OSError("boom at stop")


@pytest.mark.parametrize("at", ["start", "stop"])
def test_an_observer_that_raises_costs_its_observation_never_the_level(at: str) -> None:
    log: list[dict[str, Any]] = []

    async def go() -> LevelResult:
        async with fake_server() as (url, _):
            return await run_level(config(url), ClosedLoop(concurrency=2),
                                   Harness(observers=(lambda ctx: Broken(at), recording(log))))

    level = asyncio.run(go())
    assert level.completed == 8 and level.failed == 0
    assert level.gpu is None and level.server_metrics is not None  # the other one kept
    assert any(f"failed at its {at}" in w and "boom" in w for w in level.warnings), level.warnings
