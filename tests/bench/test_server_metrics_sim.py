"""The observer reads the simulated engine's SGLang-named ``/metrics`` during a real level
(issue 36 items 2 and 5): a real sim process with ``--max-running-requests 4
--enable-metrics``, the benchmark client's level and the observer in one event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    LevelResult,
    MetricsObservation,
    MetricsObserver,
    ObserveOptions,
    RandomWorkload,
    run_level,
    summarize,
)
from cleanslate.engines import engine_class, metric_maps
from tests.sim._client import MODEL
from tests.sim.conftest import SimServers


async def observed_level(url: str, bare: bool) -> tuple[LevelResult, MetricsObservation,
                                                         tuple[float, float]]:
    sim_map = engine_class("sim").metric_map
    assert sim_map is not None
    observer = MetricsObserver(url, metric_maps() if bare else (sim_map,), interval_s=0.02)
    config = BenchConfig(url=url, model=MODEL, num_prompts=16,
                         workload=RandomWorkload(input_len=64, output_len=24),
                         observe=ObserveOptions(enabled=False))  # this test's observer only
    await observer.start()
    t0 = time.perf_counter()
    level = await run_level(config, ClosedLoop(concurrency=16))
    t1 = time.perf_counter()
    return level, await observer.stop(), (t0, t1)


@pytest.mark.parametrize("bare", [False, True], ids=["sim-adapter", "bare-url"])
def test_the_observer_reads_the_sims_cap_queue_and_tokens(sims: SimServers, bare: bool) -> None:
    server = sims.start("--max-running-requests", "4", "--enable-metrics", "--time-scale", "0.2")
    level, observation, window = asyncio.run(observed_level(server.url, bare))
    assert level.completed == 16 and level.failed == 0
    summary = observation.summary
    assert summary.unreadable is None and summary.flavour == "sglang"
    assert summary.url == server.url + "/metrics"
    assert summary.samples >= 5 and summary.failed_scrapes == 0 and summary.skipped_values == 0
    assert summary.running is not None and summary.running.max == 4
    assert summary.waiting is not None and summary.waiting.max > 0
    assert summary.kv_usage is not None and 0 < summary.kv_usage.max <= 1
    # the baseline before the level to the scrape after it: exactly what the level sent
    assert summary.generation_tokens == level.total_output_tokens == 16 * 24
    assert summary.prompt_tokens == level.total_input_tokens == 16 * 64
    assert summary.preemptions == 0 and summary.counter_resets == 0
    # the level's own window: the baseline and final scrapes fall outside it; the gauges
    # are the window's, the counters still the whole level's
    windowed = summarize(observation.samples, flavour="sglang", url="", window=window)
    assert windowed.window_samples == summary.samples - 2
    assert windowed.gauge_window == "steady"
    assert windowed.running is not None and windowed.running.max == 4
    assert windowed.generation_tokens == 16 * 24
