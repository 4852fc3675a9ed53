"""Issue 36's case through the whole benchmark runner: the simulated engine with
``--max-running-requests 64 --enable-metrics`` (what the SGLang and sim adapters now launch
with), closed-loop levels at 16 and 256 with the default observers on. The server's own
metrics say what the client's numbers cannot: at 256 the batch stays at the cap while the rest
queue. Also: ``bench --no-observe`` records no server metrics, and a server with no metrics
endpoint (the sim without ``--enable-metrics``, as SGLang) is benchmarked in full, its
observation marked unreadable with the reason."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from cleanslate.bench import (
    BenchConfig,
    BenchResult,
    ClosedLoop,
    ObserveOptions,
    RandomWorkload,
    run_benchmark,
)
from cleanslate.engines import get_engine
from tests.conftest import run_cli
from tests.sim._client import MODEL
from tests.sim.conftest import SimServer, SimServers

CAP = 64
#: Short requests on a fast clock: the level at 256 spends its steady window with 192 queued.
FAST = ["--time-scale", "0.25", "--drift", "0", "--cold-start", "1", "--cold-start-decode", "1",
        "--noise-seed", "1", "--decode-log-interval", "1000"]
WORKLOAD = RandomWorkload(input_len=32, output_len=8)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One sim launched with the argv's metrics flag as the sim adapter builds it."""
    argv = get_engine("sim").build_argv(MODEL, 1, {"max-running-requests": CAP})
    flags = argv[argv.index("--port") + 2:]
    assert flags[0] == "--enable-metrics", argv
    servers = SimServers(tmp_path_factory.mktemp("capped"))
    try:
        yield servers.start("--model-path", MODEL, *flags, *FAST)
    finally:
        servers.end_all()


def bench(url: str, levels: list[int], prompts: int) -> BenchResult:
    config = BenchConfig(url=url, model=MODEL, workload=WORKLOAD, num_prompts=prompts,
                         loads=tuple(ClosedLoop(concurrency=c) for c in levels),
                         observe=ObserveOptions(interval_s=0.05))
    assert config.observe.enabled and config.observe.metrics  # on, as by default
    return asyncio.run(run_benchmark(config))


@pytest.mark.slow  # 2-3 s: 1,024 requests
def test_the_cap_holds_the_batch_while_the_rest_wait(capped: SimServer, figure: Any) -> None:
    result = bench(capped.url, [16, 256], prompts=512)
    low, high = result.levels
    for level in (low, high):
        assert level.completed == 512 and level.failed == 0
        metrics = level.server_metrics
        assert metrics is not None and metrics.unreadable is None, metrics
        assert metrics.flavour == "sglang" and metrics.url == capped.url + "/metrics"
        assert metrics.running is not None and metrics.running.max <= CAP
        assert metrics.kv_usage is not None and 0 < metrics.kv_usage.max <= 1
        assert metrics.generation_tokens == level.total_output_tokens
    s16, s256 = low.server_metrics, high.server_metrics
    assert s16 is not None and s16.running is not None and s16.waiting is not None
    assert s256 is not None and s256.running is not None and s256.waiting is not None
    assert s256.kv_usage is not None
    # the cap, not the client, decides the batch; the rest of the 256 queue behind it
    assert s256.running.max == CAP
    assert s256.waiting.mean > 100, s256
    figure(f"c=16: running max {s16.running.max:g} waiting mean {s16.waiting.mean:.1f}; c=256: "
           f"running mean {s256.running.mean:.1f} max {s256.running.max:g}, waiting mean "
           f"{s256.waiting.mean:.1f} max {s256.waiting.max:g}, KV max {s256.kv_usage.max:.3f}, "
           f"{s256.samples} samples ({s256.window_samples} in the steady window); "
           f"{low.output_throughput:.0f} / {high.output_throughput:.0f} tok/s")


def test_no_observe_records_no_server_metrics(capped: SimServer) -> None:
    done = run_cli("bench", "--url", capped.url, "--model", MODEL, "--concurrency", "4",
                   "--num-prompts", "8", "--workload", "random:input_len=32,output_len=8",
                   "--no-observe", "--no-live", "--json", "-")
    assert done.returncode == 0, done.stdout + done.stderr
    (level,) = json.loads(done.stdout)["levels"]
    assert level["completed"] == 8 and level["server_metrics"] is None


def test_a_server_without_metrics_is_benchmarked_in_full(tmp_path_factory: pytest.TempPathFactory
                                                         ) -> None:
    servers = SimServers(tmp_path_factory.mktemp("plain"))
    try:
        plain = servers.start("--model-path", MODEL, *FAST)  # no --enable-metrics: 404
        result = bench(plain.url, [8], prompts=16)
    finally:
        servers.end_all()
    (level,) = result.levels
    assert level.completed == 16 and level.failed == 0
    metrics = level.server_metrics
    assert metrics is not None and metrics.unreadable is not None
    assert "HTTP 404" in metrics.unreadable, metrics.unreadable
    assert metrics.running is None and metrics.samples == 0
