"""One test per fault, asserting what a user of the simulated engine observes."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time

import aiohttp
import psutil
import pytest

from cleanslate.bench._client import RequestRecord
from tests.sim._client import one_request, streamed_text
from tests.sim.conftest import (
    SimServers,
    free_port,
    port_listening,
    read_gpus,
    used_mib,
    wait_for,
)

pytestmark = pytest.mark.slow

CRASH_LINE = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"


async def _concurrent(
    url: str, n: int, max_tokens: int, timeout_s: float = 20
) -> list[RequestRecord]:
    async with aiohttp.ClientSession() as session:
        return list(
            await asyncio.gather(
                *(
                    one_request(session, url, f"p{i} q", max_tokens, timeout_s=timeout_s)
                    for i in range(n)
                )
            )
        )


def test_crash_at_concurrency_writes_a_traceback_and_dies(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.2", "--fault", "crash-at-concurrency=3")
    results = asyncio.run(_concurrent(server.url, 4, 200))
    assert server.proc.wait(10) == 1
    log = server.log()
    assert "Traceback (most recent call last):" in log
    assert CRASH_LINE in log
    assert any(not r.ok for r in results)
    assert wait_for(lambda: not any(used_mib(server.ledger).values()), 2.0)


def test_the_model_crashes_above_the_captured_batch_size(sims: SimServers) -> None:
    # With CUDA graphs on, a decode batch above --cuda-graph-max-bs crashes ...
    server = sims.start("--time-scale", "0.2", "--cuda-graph-max-bs", "4")
    asyncio.run(_concurrent(server.url, 8, 100))
    assert server.proc.wait(10) == 1
    assert CRASH_LINE in server.log()
    # ... while the same load with CUDA graphs off, or below the limit, is fine.
    eager = sims.start("--time-scale", "0.2", "--cuda-graph-max-bs", "4", "--disable-cuda-graph")
    assert all(r.ok for r in asyncio.run(_concurrent(eager.url, 8, 20)))
    assert eager.proc.poll() is None


def test_nan_fault_emits_nan_text(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.1", "--fault", "nan")

    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            r = await one_request(session, server.url, "hi", 6)
            assert r.ok and r.output_tokens == 6
            return await streamed_text(session, server.url, "hi", 6)

    assert asyncio.run(go()).split() == ["NaN"] * 6


def test_hang_after_n_requests_while_health_is_ok(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.1", "--fault", "hang-after=2")

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                assert (await one_request(session, server.url, "x", 4, timeout_s=10)).ok
            stuck = await one_request(session, server.url, "x", 4, timeout_s=2)
            assert not stuck.ok and stuck.output_tokens == 0 and stuck.error == "deadline"

    asyncio.run(go())
    assert server.healthy()
    assert server.proc.poll() is None


def test_exit_after_n_requests_exits_0_by_itself(sims: SimServers) -> None:
    """vLLM's API server exits 0 after its engine core died (vllm PR #52178): a server that
    ends by itself, with the status of one that was asked to stop."""
    server = sims.start("--time-scale", "0.1", "--fault", "exit-after=2")

    async def go() -> RequestRecord:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                assert (await one_request(session, server.url, "x", 4, timeout_s=10)).ok
            return await one_request(session, server.url, "x", 64, timeout_s=10)

    cut = asyncio.run(go())
    assert not cut.ok
    assert server.proc.wait(10) == 0
    assert "simulated fault exit-after" in server.log()
    assert wait_for(lambda: not any(used_mib(server.ledger).values()), 2.0)


def test_degenerate_after_n_requests_while_health_and_models_are_ok(sims: SimServers) -> None:
    import urllib.request

    server = sims.start("--time-scale", "0.1", "--fault", "degenerate-after=1")

    async def go() -> tuple[str, str]:
        async with aiohttp.ClientSession() as session:
            first = await streamed_text(session, server.url, "hi", 6)
            return first, await streamed_text(session, server.url, "hi", 16)

    first, later = asyncio.run(go())
    assert "!" not in first and len(first.split()) == 6
    assert later == "!" * 16
    assert server.healthy()
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
        assert resp.status == 200


def test_health_generate_goes_through_the_scheduler(sims: SimServers) -> None:
    import urllib.request

    server = sims.start("--time-scale", "0.1", "--fault", "hang-after=0")
    with urllib.request.urlopen(server.url + "/health_generate", timeout=10) as resp:
        assert resp.status == 200  # a probe does not count as a request

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            assert not (await one_request(session, server.url, "x", 2, timeout_s=1)).ok
            timeout = aiohttp.ClientTimeout(total=2)
            with pytest.raises(asyncio.TimeoutError):
                async with session.get(server.url + "/health_generate", timeout=timeout):
                    pass

    asyncio.run(go())
    assert server.healthy()


@pytest.mark.parametrize("args", [["--fault", "oom-at-start"], ["--mem-fraction-static", "0.95"]])
def test_oom_at_start_exits_1_with_a_cuda_oom(sims: SimServers, args: list[str]) -> None:
    server = sims.start("--tp-size", "2", *args, ready=False)
    assert server.proc.wait(30) == 1
    log = server.log()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log
    assert "Traceback (most recent call last):" in log
    assert not server.healthy()
    assert wait_for(lambda: not any(used_mib(server.ledger).values()), 2.0)


def test_not_enough_memory_for_the_kv_cache(sims: SimServers) -> None:
    server = sims.start("--mem-fraction-static", "0.5", ready=False)
    assert server.proc.wait(30) == 1
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in (
        server.log()
    )


def test_ignore_sigterm_leaves_a_worker_behind(sims: SimServers) -> None:
    server = sims.start("--tp-size", "2", "--fault", "ignore-sigterm")
    tp0, tp1 = server.workers()
    assert server.terminate() == 0
    assert tp0.is_running() and tp0.status() != "zombie"
    assert not tp1.is_running() or tp1.status() == "zombie"
    assert used_mib(server.ledger)[0] > 0 and used_mib(server.ledger)[1] == 0
    assert "did not exit" in server.log()
    os.kill(tp0.pid, signal.SIGKILL)
    tp0.wait(5)
    assert not any(used_mib(server.ledger).values())


def test_orphan_grandchild_survives_the_launcher(sims: SimServers) -> None:
    server = sims.start("--fault", "orphan-grandchild=4096")
    reading = read_gpus(server.ledger)
    names = {p.name: p.pid for p in reading.gpus[0].processes}
    assert set(names) == {"sim::scheduler_TP0", "sim::grandchild"}
    grandchild = psutil.Process(names["sim::grandchild"])
    assert os.getsid(grandchild.pid) != os.getsid(server.pid)
    assert grandchild.environ()["CLEANSLATE_RUN"] == server.marker
    assert server.terminate() == 0
    time.sleep(0.3)
    assert grandchild.is_running()
    after = read_gpus(server.ledger).gpus[0]
    assert [p.pid for p in after.processes] == [grandchild.pid]
    assert after.memory_used_mib == 4096
    os.kill(grandchild.pid, signal.SIGKILL)
    assert wait_for(lambda: used_mib(server.ledger)[0] == 0, 2.0)


def test_slow_release_keeps_memory_after_the_process_is_gone(sims: SimServers) -> None:
    server = sims.start("--fault", "slow-release=1.5")
    worker = server.workers()[0]
    t0 = time.monotonic()
    assert server.terminate() == 0
    assert not worker.is_running() or worker.status() == "zombie"
    gpu0 = read_gpus(server.ledger).gpus[0]
    assert (gpu0.memory_used_mib or 0) > 0 and gpu0.processes == ()  # freeing, no process
    assert wait_for(lambda: used_mib(server.ledger)[0] == 0, 4.0)
    assert time.monotonic() - t0 >= 1.4


@pytest.mark.parametrize("own_port", [False, True])
def test_leave_port_keeps_a_port_bound(sims: SimServers, own_port: bool) -> None:
    port = free_port()
    server = sims.start("--fault", f"leave-port={port}", port=port if own_port else None)
    assert wait_for(lambda: port_listening(port), 5.0)
    assert server.terminate() == 0
    time.sleep(0.2)
    assert port_listening(port)
    owners = [
        c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid
    ]
    assert owners and all(psutil.Process(p).name() == "sim::listener" for p in owners)
    for pid in owners:
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not port_listening(port), 2.0)


def test_shm_leftover_files_stay_after_stop(sims: SimServers) -> None:
    server = sims.start("--fault", "shm-leftover")
    pattern = f"/dev/shm/cleanslate-sim-{server.pid}-*"
    assert len(glob.glob(pattern)) == 2
    assert server.terminate() == 0
    leftovers = glob.glob(pattern)
    try:
        assert len(leftovers) == 2
    finally:
        for path in leftovers:
            os.unlink(path)


def test_slow_start_delays_the_port(sims: SimServers) -> None:
    t0 = time.monotonic()
    server = sims.start("--fault", "slow-start=4", ready=False)
    # The context is allocated while loading, the port is not open yet.
    assert wait_for(lambda: used_mib(server.ledger)[0] > 0, 3.5)
    assert not server.healthy() and server.proc.poll() is None
    server.wait_ready()
    assert time.monotonic() - t0 >= 4.0
