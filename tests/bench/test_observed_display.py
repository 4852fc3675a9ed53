"""What the observers saw, shown where people look (issue 36 item 6): bench's table gains
running, waiting, KV % and GPU % / W per level, only when observed; what could not be read is
said once; the live view shows an observer's newest scrape."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from rich.console import Console

from cleanslate.bench import (
    BenchConfig,
    BenchResult,
    ClosedLoop,
    GaugeStats,
    GpuTelemetry,
    LevelEnd,
    ObserveOptions,
    RandomWorkload,
    ServerMetrics,
    live_readings,
    observation_notes,
    run_benchmark,
    summary_table,
)
from cleanslate.bench._gpu import GpuObserver, make_sampler
from cleanslate.bench._server_metrics import ServerMetricsObserver
from cleanslate.engines import engine_class
from tests._kit import served
from tests.bench.conftest import fake_server
from tests.sim.conftest import SimServers


def measured() -> BenchResult:
    """Two real levels (c=2, c=4) against the fake server, not observed."""
    async def go() -> BenchResult:
        async with fake_server() as (url, _):
            config = BenchConfig(url=url, model="m", num_prompts=4,
                                 workload=RandomWorkload(input_len=8, output_len=4),
                                 loads=(ClosedLoop(concurrency=2), ClosedLoop(concurrency=4)),
                                 observe=ObserveOptions(enabled=False))
            return await run_benchmark(config)

    return asyncio.run(go())


def gauge(mean: float, top: float) -> GaugeStats:
    return GaugeStats(mean=mean, max=top)


METRICS = ServerMetrics(flavour="sglang", url="http://x/metrics", samples=40, window_samples=30,
                        running=gauge(53.8, 64), waiting=gauge(202.2, 248),
                        kv_usage=gauge(0.388, 0.495), preemptions=0.0,
                        generation_tokens=163840.0)
GPUS = (GpuTelemetry(index=0, name="H100", source="nvml", samples=30,
                     utilization_pct=gauge(96.0, 100.0), power_w=gauge(690.0, 700.0),
                     energy_j=1000.0, joules_per_output_token=0.5),
        GpuTelemetry(index=1, name="H100", source="nvml", samples=30,
                     utilization_pct=gauge(98.0, 100.0), power_w=gauge(710.0, 720.0)))


def with_observed(result: BenchResult, **fields: Any) -> BenchResult:
    levels = tuple(lv.model_copy(update=fields) for lv in result.levels)
    return result.model_copy(update={"levels": levels})


def text_of(result: BenchResult) -> str:
    console = Console(record=True, width=260)
    console.print(summary_table(result))
    return console.export_text()


def test_the_table_gains_the_observed_columns_only_when_observed() -> None:
    plain = measured()
    header = text_of(plain).splitlines()[2]
    for column in ("running", "waiting", "KV %", "GPU % / W"):
        assert column not in header
    seen = text_of(with_observed(plain, server_metrics=METRICS, gpu=GPUS))
    header = seen.splitlines()[2]
    for column in ("running", "waiting", "KV %", "GPU % / W"):
        assert column in header, header
    row = next(line for line in seen.splitlines() if "c=4" in line)
    # running and waiting mean/max, KV mean/max, the GPUs' mean utilization / summed power
    assert "54/64" in row and "202/248" in row and "39%/50%" in row
    assert "97 / 1,400" in row
    only_metrics = text_of(with_observed(plain, server_metrics=METRICS))
    assert "KV %" in only_metrics and "GPU % / W" not in only_metrics


def test_what_could_not_be_read_is_said_once_with_its_reason() -> None:
    plain = measured()
    none = ServerMetrics(flavour="transformers", note="no engine metrics: none served")
    notes = observation_notes(with_observed(plain, server_metrics=none))
    assert notes == ["engine metrics: no engine metrics: none served (every level)"]
    # an unreadable level shows '-' in its cells and its reason once
    broken = ServerMetrics(url="http://x/metrics", unreadable="HTTP 404")
    levels = (plain.levels[0].model_copy(update={"server_metrics": METRICS}),
              plain.levels[1].model_copy(update={"server_metrics": broken,
                                                 "gpu": (GPUS[0].model_copy(update={
                                                     "unreadable": "NVML: GPU is lost",
                                                     "utilization_pct": None,
                                                     "power_w": None}),)}))
    mixed = plain.model_copy(update={"levels": levels})
    assert observation_notes(mixed) == ["engine metrics unreadable: HTTP 404 (c=4)",
                                        "GPU 0 unreadable: NVML: GPU is lost (c=4)"]
    table = text_of(mixed)
    cells = [c.strip() for c in next(line for line in table.splitlines()
                                     if "c=4" in line).split("│")[1:-1]]
    assert cells[-4:-1] == ["-", "-", "-"]  # running, waiting, KV % (then bound by)
    assert "GPU % / W" not in table  # no GPU gave a reading: no column


SCRAPE = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{tp_rank="0"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{tp_rank="0"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{tp_rank="0"} 0.4
"""


def test_the_live_view_shows_an_observers_newest_scrape() -> None:
    sim_map = engine_class("sim").metric_map
    assert sim_map is not None

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=SCRAPE, content_type="text/plain")

    async def go() -> tuple[str, str, str]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with served(app) as url:
            good = ServerMetricsObserver(url, (sim_map,), interval_s=10)
            before = live_readings([good])
            await good.start()
            line = live_readings([good, object()])  # one without latest() shows nothing
            missing = ServerMetricsObserver(url + "/nothing", (sim_map,), interval_s=10)
            await missing.start()
            gone = live_readings([missing])
            for observer in (good, missing):
                await observer.observer.stop()
            return before, line, gone

    before, line, gone = asyncio.run(go())
    assert before == ""
    assert line == "running 3  waiting 5  KV 40%"
    assert gone.startswith("unreadable: HTTP 404")


@pytest.mark.slow  # a real sim process: about 1 s
def test_the_live_view_shows_the_gpus_newest_reading(tmp_path: Path) -> None:
    servers = SimServers(tmp_path)
    try:
        servers.start("--time-scale", "0.1")
        ledger = str(servers.ledger)

        async def go() -> tuple[str, str]:
            seen = GpuObserver(make_sampler(None, [0], "sim", 0.05, ledger), [0])
            absent = GpuObserver(make_sampler(None, [7], "sim", 0.05, ledger), [7])
            for observer in (seen, absent):
                await observer.start()
            await asyncio.sleep(0.3)
            line, gone = live_readings([seen]), live_readings([absent])
            for observer in (seen, absent):
                await observer.stop(LevelEnd(None, None, 0, 0))
            return line, gone

        line, gone = asyncio.run(go())
    finally:
        servers.end_all()
    assert re.fullmatch(r"GPU \d+ % / [\d,]+ W", line), line
    assert gone.startswith("unreadable: ") and "GPU 7" in gone, gone
