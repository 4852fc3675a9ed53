"""The bottleneck verdict printed where the number is (issue 37 item 2): bench's table gains a
"bound by" column (``running_cap`` clear, ``compute?`` likely, ``unknown``) and one line per
level under it with the evidence and the engine's advice; the live view shows the verdict as a
level ends; ``--find-max``'s probe table has the same column; the CLI against the sim capped at
64 says the cap bound c=256."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import cleanslate.engines  # noqa: F401  (the engines' advice books)
from cleanslate.bench import (
    BenchConfig,
    BenchResult,
    Bottleneck,
    ClosedLoop,
    GaugeStats,
    LiveView,
    ObserveOptions,
    RandomWorkload,
    ServerConfig,
    ServerMetrics,
    bound_by,
    bound_lines,
    diagnosed,
    run_benchmark,
    summary_table,
)
from cleanslate.engines import get_engine
from tests.bench.conftest import fake_server
from tests.sim._client import MODEL
from tests.sim.conftest import SimServer, SimServers

CAP_64 = ServerConfig(
    url="http://127.0.0.1:30000", engine="sim", flavour="sglang",
    in_effect={"max_running_requests": 64, "cuda_graph_max_bs": 160, "dp_size": 1},
    sources={"max_running_requests": "GET /server_info"})


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


def capped(result: BenchResult) -> BenchResult:
    """``result``'s levels as the sim capped at 64 showed them at c=16 and c=256 (test_observe
    _sim's figures), diagnosed against that configuration; the client's CPU as a client of
    its own process shows it (here the fake server shares the client's core)."""
    low, high = (lv.model_copy(update={"client_cpu_util": 0.2}) for lv in result.levels)
    low = low.model_copy(update={"server_metrics": ServerMetrics(
        flavour="sglang", running=GaugeStats(mean=1.9, max=2, share_at_max=0.8),
        waiting=GaugeStats(mean=0.0, max=1), kv_usage=GaugeStats(mean=0.02, max=0.03))})
    high = high.model_copy(update={"server_metrics": ServerMetrics(
        flavour="sglang", running=GaugeStats(mean=64, max=64, share_at_max=0.97),
        waiting=GaugeStats(mean=188, max=192), kv_usage=GaugeStats(mean=0.29, max=0.31))})
    low = diagnosed(low, (), CAP_64, "sim")
    high = diagnosed(high, (low,), CAP_64, "sim")
    return result.model_copy(update={"levels": (low, high)})


def text_of(result: BenchResult) -> str:
    console = Console(record=True, width=300)
    console.print(summary_table(result))
    return console.export_text()


def test_the_cell_marks_the_confidence() -> None:
    assert bound_by(Bottleneck(verdict="running_cap", confidence="clear")) == "running_cap"
    assert bound_by(Bottleneck(verdict="compute", confidence="likely")) == "compute?"
    assert bound_by(Bottleneck(verdict="unknown", confidence="unknown")) == "unknown"
    assert bound_by(None) == "-"


def test_the_table_says_what_bound_each_level_and_the_lines_say_why() -> None:
    plain = measured()
    assert all(lv.bottleneck is not None for lv in plain.levels)  # run_benchmark diagnosed
    result = capped(plain)
    text = text_of(result)
    assert "bound by" in text.splitlines()[2]
    row = next(line for line in text.splitlines() if line.startswith("│ c=4 "))
    assert row.rstrip(" │").endswith("running_cap"), row
    low, high = bound_lines(result.levels)
    first = result.levels[0].bottleneck
    assert first is not None and first.verdict == "offered_load"  # likely at a first level
    assert low.startswith(f"c=2 bound by {bound_by(first)}: running 1.9 on average"), low
    assert high.startswith("c=4 bound by running_cap: running 64 of cap 64"), high
    assert "188 waiting" in high and "KV 31%" in high
    assert high.endswith("raise --max-running-requests above 64: requests queue behind the cap "
                         "while the batch could grow"), high


def test_a_level_recorded_without_a_verdict_has_no_column() -> None:
    plain = measured()
    bare = plain.model_copy(update={"levels": tuple(
        lv.model_copy(update={"bottleneck": None}) for lv in plain.levels)})
    assert "bound by" not in text_of(bare)
    assert bound_lines(bare.levels) == []


def test_the_live_view_shows_each_verdict_as_its_level_ends() -> None:
    result = capped(measured())
    console = Console(record=True, width=300)
    view = LiveView(console)
    for level in result.levels:
        view.on_level(level)
    console.print(view.render())
    shown = console.export_text()
    assert "c=2 bound by offered_load" in shown  # clear or likely ('?')
    assert "c=4 bound by running_cap:" in shown


def test_the_probe_table_has_the_column_and_the_lines() -> None:
    from cleanslate.bench import CapacityResult, CapacitySLO, Probe, ProbeVerdict, StopReason
    from cleanslate.cli._find_max import probe_line, probe_table

    result = capped(measured())
    slo = CapacitySLO(limits={"p99_ttft_ms": 5000.0})
    probes = tuple(Probe(index=i, load=float(c), label=lv.label, verdict=ProbeVerdict.PASS,
                         requests=lv.completed, level=lv)
                   for i, (c, lv) in enumerate(zip((2, 4), result.levels, strict=True)))
    found = CapacityResult(dimension="concurrency", slo=slo, tolerance=0.1, start=2,
                           max_load=4, probes=probes, capacity=4, stopped_by=StopReason.MAX_LOAD)
    console = Console(record=True, width=300)
    console.print(probe_table(found))
    text = console.export_text()
    assert "bound by" in text.splitlines()[2]
    assert "running_cap" in next(line for line in text.splitlines()
                                 if line.startswith("│ c=4 "))
    assert str(probe_line(probes[1], slo)).endswith("; bound by running_cap")


# -- the command, against the sim capped at 64 ----------------------------------------------

FAST = ["--time-scale", "0.25", "--drift", "0", "--cold-start", "1", "--cold-start-decode", "1",
        "--noise-seed", "1", "--decode-log-interval", "1000"]


@pytest.fixture(scope="module")
def sim64(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    argv = get_engine("sim").build_argv(MODEL, 1, {"max-running-requests": 64})
    servers = SimServers(tmp_path_factory.mktemp("sim64"))
    try:
        yield servers.start("--model-path", MODEL, *argv[argv.index("--port") + 2:], *FAST)
    finally:
        servers.end_all()


@pytest.mark.slow  # about 3 s: 600 requests through the command
def test_bench_says_the_cap_bound_the_sim_at_256(cli: Any, sim64: SimServer,
                                                  figure: Any) -> None:
    res = cli("bench", "--url", sim64.url, "--model", MODEL, "--concurrency", "16,256",
              "--num-prompts", "300", "--workload", "random:input_len=32,output_len=8",
              "--observe-interval", "0.05", "--no-live", env={"COLUMNS": "250"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    header = next(line for line in lines if "bound by" in line)
    assert header.rstrip(" ┃").endswith("bound by")
    row = next(line for line in lines if line.startswith("│ c=256 "))
    assert "running_cap" in row, res.stdout
    said = next(line for line in lines if line.startswith("c=256 bound by "))
    assert said.startswith("c=256 bound by running_cap: running 64 of cap 64"), said
    assert "raise --max-running-requests above 64" in said
    figure(said)


def test_report_bench_shows_the_column_and_the_lines(tmp_path: Path) -> None:
    from cleanslate.report import bench_csv, load_bench_report, render_bench_html

    path = tmp_path / "out.json"
    path.write_text(capped(measured()).model_dump_json())
    report = load_bench_report(path)
    page = render_bench_html(report, plots=[], generated_at=0.0)
    assert "<th>bound by</th>" in page and "c=4 bound by running_cap: running 64 of cap 64" in page
    rows = list(csv.DictReader(io.StringIO(bench_csv(report))))
    assert rows[1]["bound_by"] == "running_cap" and rows[1]["bound_confidence"] == "clear"
    assert rows[1]["bound_evidence"].startswith("running 64 of cap 64")
