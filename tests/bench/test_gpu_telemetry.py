"""GPU telemetry per level (issue 36 item 3): the simulated GPUs of real sim servers sampled
through the level seam (a thread here, the host sampler script through the local executor as
on an SSH host), the throttle fault's clock-event reason, hostile sampler output, a GPU that
disappears mid-level, and the command line's options. The GPU-only test reads this machine's
GPUs through NVML."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    GpuTelemetry,
    Harness,
    LevelEnd,
    ObserveOptions,
    RandomWorkload,
    gpu_observer,
    local_gpus,
    run_benchmark,
)
from cleanslate.bench._gpu import (
    GpuObserver,
    GpuSample,
    HostSampler,
    SimReader,
    ThreadSampler,
    make_sampler,
    parse_sampler_output,
    summarize,
)
from cleanslate.bench._observed import merge_gpu
from cleanslate.hosts.local import LocalExecutor
from cleanslate.sim.ledger import proc_start_ticks, write_config
from tests.conftest import run_cli
from tests.sim._client import MODEL
from tests.sim.conftest import SimServer, SimServers

FAST = ["--time-scale", "0.5", "--drift", "0", "--cold-start", "1", "--cold-start-decode", "1",
        "--noise-seed", "1", "--decode-log-interval", "1000"]
WORKLOAD = RandomWorkload(input_len=32, output_len=32)
THROTTLE_MHZ = 990


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimServers, SimServer,
                                                                     SimServer]]:
    """Two sim servers in one ledger: GPU 0 as is, GPU 1 with its clock throttled."""
    servers = SimServers(tmp_path_factory.mktemp("gpu-telemetry"))
    try:
        plain = servers.start("--model-path", MODEL, "--base-gpu-id", "0", *FAST)
        hot = servers.start("--model-path", MODEL, "--base-gpu-id", "1", *FAST,
                            "--fault", f"throttle-clock={THROTTLE_MHZ}")
        yield servers, plain, hot
    finally:
        servers.end_all()


def measure(url: str, concurrency: int, prompts: int, harness: Harness) -> Any:
    config = BenchConfig(url=url, model=MODEL, workload=WORKLOAD, num_prompts=prompts,
                         loads=(ClosedLoop(concurrency=concurrency),),
                         observe=ObserveOptions(interval_s=0.05, metrics=False))
    return asyncio.run(run_benchmark(config, harness)).levels[0]


def one_gpu(level: Any) -> GpuTelemetry:
    assert level.gpu is not None and len(level.gpu) == 1, level.gpu
    gpu: GpuTelemetry = level.gpu[0]
    assert gpu.unreadable is None, gpu
    return gpu


@pytest.mark.slow  # about 3 s: two levels on a real sim
def test_sim_gpu_telemetry_per_level_follows_the_load(sims: Any, figure: Any) -> None:
    servers, plain, _ = sims
    ledger = str(servers.ledger)
    assert local_gpus(plain.url, ledger=ledger) == (0,)  # the server on the URL's port
    factory = gpu_observer(None, (0,), "sim", ledger=ledger)
    assert factory is not None
    harness = Harness(observers=(factory,))

    async def at_rest() -> Any:
        observer = GpuObserver(make_sampler(None, (0,), "sim", 0.05, ledger=ledger), (0,))
        await observer.start()
        await asyncio.sleep(0.4)
        return await observer.stop(END)

    (idle,) = asyncio.run(at_rest()).summary
    low = one_gpu(measure(plain.url, 1, 4, harness))
    high_level = measure(plain.url, 16, 64, harness)
    high = one_gpu(high_level)
    for gpu in (low, high):
        assert gpu.source == "sim" and gpu.index == 0 and gpu.uuid == "GPU-sim-00000000"
        assert gpu.samples >= 5 and gpu.window_samples >= 3
        assert gpu.memory_used_mib is not None and gpu.memory_used_mib.mean > 1000
        assert gpu.energy_j is not None and gpu.energy_j > 0
        assert gpu.joules_per_output_token is not None and gpu.joules_per_output_token > 0
        assert gpu.max_sm_clock_mhz == 1980 and gpu.sampler_cpu_ms is not None
        assert "hw_thermal_slowdown" not in gpu.clock_events
    assert low.utilization_pct is not None and high.utilization_pct is not None
    assert low.sm_active_pct is not None and high.sm_active_pct is not None
    assert low.power_w is not None and high.power_w is not None
    # Utilisation (the share of time a kernel runs) saturates at one request already, as
    # NVML's does; SM activity and power keep growing with the batch.
    assert idle.utilization_pct is not None and idle.utilization_pct.max < 5
    assert idle.clock_events.get("gpu_idle", 0) > 0.5 and idle.power_w is not None
    assert high.utilization_pct.mean > 50 and low.utilization_pct.mean > 50
    assert idle.power_w.mean < min(low.power_w.mean, high.power_w.mean)
    # SM activity while busy grows with the batch (a ratio: a slow client on a loaded machine
    # leaves the GPU idle more at either load, not less busy per step)
    assert (high.sm_active_pct.mean / high.utilization_pct.mean
            > low.sm_active_pct.mean / low.utilization_pct.mean)
    # one batch of 16 costs less energy per token than 16 requests one by one
    assert high.joules_per_output_token is not None and low.joules_per_output_token is not None
    assert high.joules_per_output_token < low.joules_per_output_token
    assert [k for k, _ in harness.kept] == ["c=1", "c=16"]
    figure(f"sim GPU 0: idle util {idle.utilization_pct.mean:.0f} % {idle.power_w.mean:.0f} W; "
           f"c=1 util {low.utilization_pct.mean:.0f} % SM "
           f"{low.sm_active_pct.mean:.0f} % {low.power_w.mean:.0f} W "
           f"{low.joules_per_output_token:.3f} J/tok; c=16 util "
           f"{high.utilization_pct.mean:.0f} % SM {high.sm_active_pct.mean:.0f} % "
           f"{high.power_w.mean:.0f} W {high.joules_per_output_token:.3f} J/tok; sampler "
           f"{high.sampler_cpu_ms:.2f} ms CPU a sample")
    # repeats pool: gauges weighted, energy summed
    merged = merge_gpu([high_level.gpu, high_level.gpu])
    assert merged is not None and merged[0].merged == 2
    assert merged[0].energy_j == pytest.approx(2 * (high.energy_j or 0))


@pytest.mark.slow  # about 2 s
def test_the_throttle_fault_shows_its_reason_and_a_lower_clock(sims: Any) -> None:
    servers, _, hot = sims
    factory = gpu_observer(None, (1,), "sim", ledger=str(servers.ledger))
    assert factory is not None
    harness = Harness(observers=(factory,))
    gpu = one_gpu(measure(hot.url, 8, 32, harness))
    assert gpu.clock_events.get("hw_thermal_slowdown", 0) > 0.5, gpu.clock_events
    assert gpu.sm_clock_mhz is not None and gpu.sm_clock_mhz.max <= THROTTLE_MHZ
    assert gpu.max_sm_clock_mhz == 1980
    assert gpu.temperature_c is not None and gpu.temperature_c.max >= 90


@pytest.mark.slow  # about 2 s: the sampler script in a child Python, as on an SSH host
def test_the_host_sampler_script_through_an_executor(sims: Any) -> None:
    servers, plain, _ = sims
    executor = LocalExecutor()
    sampler = make_sampler(executor, (0, 5), "sim", 0.05, ledger=str(servers.ledger))
    assert isinstance(sampler, ThreadSampler)  # here, the thread reads the files
    host = HostSampler(executor, (0, 5), 0.05, "sim", ledger=str(servers.ledger))

    def factory(ctx: Any) -> GpuObserver:
        return GpuObserver(host, (0, 5))

    level = measure(plain.url, 4, 16, Harness(observers=(factory,)))
    assert level.gpu is not None
    gpu0, gpu5 = level.gpu
    assert gpu0.unreadable is None and gpu0.samples >= 3, gpu0
    assert gpu0.energy_j is not None and gpu0.energy_j > 0
    assert gpu0.sampler_cpu_ms is not None
    # no server on GPU 5: said, not invented
    assert gpu5.unreadable is not None and "no simulated server uses GPU 5" in gpu5.unreadable
    assert not os.path.exists(host.stop_dir)  # the script removed its stop folder


END = LevelEnd(window=(0.0, 1e12), level_span=(0.0, 1e12), output_tokens=100, completed=10)

HOSTILE: dict[str, bytes] = {
    "empty": b"",
    "binary": bytes(range(256)) * 64,
    "html": b"<html><body>502 Bad Gateway</body></html>\n",
    "not-objects": b"[1,2,3]\n42\n\"text\"\nnull\n",
    "no-kind": b'{"gpu": 0, "util": 50}\n',
    "error": b'{"kind": "error", "error": "NVML: \\u001b[31mDriver/library version mismatch"}\n',
    "long-line": b'{"kind": "sample", "gpu": 0, "wall": 1, "x": "' + b"A" * 100_000 + b'"}\n',
    "deep": b"[" * 100_000 + b"\n",
    "nan": b'{"kind": "sample", "gpu": 0, "wall": NaN, "util": NaN}\n',
    "other-gpu": b'{"kind": "sample", "gpu": 7, "wall": 1, "util": 5}\n',
    "bool-gpu": b'{"kind": "sample", "gpu": true, "wall": 1, "util": 5}\n',
    "string-wall": b'{"kind": "sample", "gpu": 0, "wall": "now", "util": 5}\n',
    "cut-short": b'{"kind": "start", "source": "nvml", "gpus": [{"gpu": 0, "uu',
    "end-only": b'{"kind": "end", "samples": -3, "cpu_s": "x"}\n',
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sampler_output_is_unreadable_with_a_reason(case: str) -> None:
    result = parse_sampler_output(HOSTILE[case], (0,), offset=0.0, span=(0.0, 10.0))
    gpu = summarize(0, result.samples[0], END, source="auto", failure=result.failure)
    assert gpu.unreadable is not None and gpu.unreadable.isprintable()
    assert len(gpu.unreadable) <= 200
    assert gpu.energy_j is None and gpu.utilization_pct is None


def test_values_a_gpu_cannot_have_are_left_out_and_counted() -> None:
    lines: list[dict[str, Any]] = [
        {"kind": "start", "source": "nvml", "gpus": [{"gpu": 0, "uuid": "GPU-\x1b[2Jx",
                                                      "name": "H100"}]}]
    utils: list[Any] = [50, 1e308, -4, True, "90", 70]
    for i, util in enumerate(utils):
        lines.append({"kind": "sample", "gpu": 0, "wall": 100 + i, "util": util, "pw": 300,
                      "ev": ["sw_power_cap", "\x1b]8;;evil", 3], "xid": [79, "x", -1],
                      "temp": 1e9})
    stdout = "\n".join(json.dumps(x) for x in lines).encode() + b"\ngarbage\n"
    # the host's clock is an hour off: its samples are moved to where this process took them
    result = parse_sampler_output(stdout, (0,), offset=3600.0, span=(0.0, 10.0))
    gpu = summarize(0, result.samples[0], END, source="auto", failure=result.failure,
                    uuid=result.meta[0][0], name=result.meta[0][1])
    assert gpu.unreadable is None and gpu.samples == 6
    assert gpu.utilization_pct is not None and gpu.utilization_pct.mean == 60
    assert gpu.clock_events == {"sw_power_cap": 1.0}
    assert gpu.xid_events == (79,) * 6
    assert gpu.temperature_c is None
    assert gpu.uuid is not None and gpu.uuid.isprintable()
    assert gpu.note is not None and "not believable" in gpu.note
    # no energy counter: power integrated over the 5 s between the first and last sample
    assert gpu.energy_j == pytest.approx(1500.0)
    assert gpu.joules_per_output_token == pytest.approx(15.0)


def write_telemetry(ledger: Path, gpu: int, util: float) -> None:
    record = {"pid": os.getpid(), "start_ticks": proc_start_ticks(os.getpid()), "gpu": gpu,
              "util": util, "pw": 200.0, "ej": int(time.time() * 1000), "smc": 1980}
    (ledger / f"telemetry-{gpu}.json").write_text(json.dumps(record))


def test_a_gpu_that_disappears_mid_level(tmp_path: Path) -> None:
    write_config(str(tmp_path), gpus=2)
    write_telemetry(tmp_path, 0, 40.0)
    write_telemetry(tmp_path, 1, 60.0)

    async def level() -> Any:
        observer = GpuObserver(ThreadSampler(SimReader(str(tmp_path), (0, 1)), (0, 1), 0.05,
                                             "sim"), (0, 1))
        await observer.start()
        await asyncio.sleep(0.2)
        (tmp_path / "telemetry-1.json").unlink()  # GPU 1 falls off the bus
        await asyncio.sleep(0.2)
        now = time.perf_counter()
        return await observer.stop(LevelEnd(window=(now - 10, now), level_span=None,
                                            output_tokens=50, completed=5))

    observed = asyncio.run(level())
    kept, gone = observed.summary
    assert kept.unreadable is None and kept.utilization_pct is not None
    assert kept.utilization_pct.mean == 40
    assert gone.unreadable is not None
    assert "stopped answering during the level" in gone.unreadable
    assert "no simulated server uses GPU 1" in gone.unreadable
    assert gone.utilization_pct is not None and gone.utilization_pct.mean == 60  # kept
    assert any("err" in s for s in observed.samples)


def test_a_missing_ledger_is_unreadable_not_a_failed_level(tmp_path: Path) -> None:
    async def level() -> Any:
        observer = GpuObserver(make_sampler(None, (0,), "sim", 0.05,
                                            ledger=str(tmp_path / "nowhere")), (0,))
        await observer.start()
        return await observer.stop(END)

    (gpu,) = asyncio.run(level()).summary
    assert gpu.unreadable is not None and "does not exist" in gpu.unreadable


def test_command_line_gpu_options_are_checked() -> None:
    bad = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--gpus", "0,x")
    assert bad.returncode == 2 and "--gpus" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--gpu-source", "dcgm")
    assert bad.returncode == 2 and "--gpu-source" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow  # about 2 s: the command line against the sim, on and off
def test_bench_command_line_records_gpu_telemetry(sims: Any, tmp_path: Path) -> None:
    servers, plain, _ = sims
    env = {"CLEANSLATE_SIM_GPU_DIR": str(servers.ledger)}
    args = ["bench", "--url", plain.url, "--model", MODEL, "--concurrency", "4",
            "--num-prompts", "8", "--workload", "random:input_len=16,output_len=16", "--no-live",
            "--observe-interval", "0.05"]
    on = run_cli(*args, "--json", str(tmp_path / "on.json"), env=env)
    assert on.returncode == 0, on.stderr
    (gpu,) = json.loads((tmp_path / "on.json").read_text())["levels"][0]["gpu"]
    assert gpu["index"] == 0 and gpu["source"] == "sim" and gpu["unreadable"] is None
    assert gpu["joules_per_output_token"] > 0
    off = run_cli(*args, "--no-observe", "--json", str(tmp_path / "off.json"), env=env)
    assert off.returncode == 0, off.stderr
    assert json.loads((tmp_path / "off.json").read_text())["levels"][0].get("gpu") is None


@pytest.mark.gpu
def test_this_machines_gpus_through_nvml() -> None:
    pytest.importorskip("pynvml")
    gpus = local_gpus("http://127.0.0.1:8000", "nvml")
    if not gpus:
        pytest.skip("NVML sees no GPU here")

    async def level() -> Any:
        observer = GpuObserver(make_sampler(None, gpus, "nvml", 0.1), gpus)
        await observer.start()
        await asyncio.sleep(1.0)
        return await observer.stop(END)

    for gpu in asyncio.run(level()).summary:
        assert gpu.unreadable is None and gpu.source == "nvml" and gpu.samples >= 5, gpu
        assert gpu.power_w is not None and gpu.power_w.mean > 0
        assert gpu.energy_j is not None and gpu.energy_j > 0
        assert gpu.sm_clock_mhz is not None and gpu.max_sm_clock_mhz


def test_energy_from_the_counter_read_once_a_second_with_its_tail_integrated() -> None:
    samples = [GpuSample(t=0.0, values={"ej": 10_000.0, "pw": 100.0}),
               GpuSample(t=0.5, values={"pw": 300.0}),
               GpuSample(t=1.0, values={"ej": 210_000.0, "pw": 300.0}),
               GpuSample(t=1.5, values={"pw": 100.0})]
    gpu = summarize(0, samples, END, source="nvml")
    # 200 J from the counter, then (300 + 100) / 2 W over the last 0.5 s
    assert gpu.energy_j == pytest.approx(300.0) and gpu.note is None
    assert gpu.joules_per_output_token == pytest.approx(3.0)
