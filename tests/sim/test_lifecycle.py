"""The simulated server's processes and memory, as `ps` and the `sim` GPU backend see them."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.sim.conftest import SimServers, read_gpus, used_mib, wait_for

pytestmark = pytest.mark.slow


def test_tp4_starts_four_named_workers_holding_memory(sims: SimServers) -> None:
    server = sims.start("--tp-size", "4")
    workers = server.workers()
    assert len(workers) == 4
    for rank, proc in enumerate(workers):
        with open(f"/proc/{proc.pid}/comm") as fh:
            comm = fh.read().strip()
        # The kernel keeps 15 bytes of the name, as for `sglang::scheduler_TP0`.
        assert comm == "sim::scheduler_"
        assert proc.cmdline() == [f"sim::scheduler_TP{rank}"]
        assert proc.environ()["CLEANSLATE_RUN"] == server.marker
    reading = read_gpus(server.ledger)
    assert reading.ok and reading.backend == "sim"
    held = [g for g in reading.gpus if (g.memory_used_mib or 0) > 0]
    assert [g.index for g in held] == [0, 1, 2, 3]
    assert {g.processes[0].pid for g in held} == {p.pid for p in workers}
    assert all(g.source == "sim" and g.memory_total_mib == 143771 for g in reading.gpus)
    assert all(g.memory_used_mib == g.processes[0].used_mib for g in held)

    t0 = time.monotonic()
    assert server.terminate() == 0
    assert wait_for(lambda: not any(used_mib(server.ledger).values()), 2.0)
    assert time.monotonic() - t0 < 2.5
    assert not any(psutil.pid_exists(p.pid) and p.status() != "zombie" for p in workers)


def test_sigkill_of_the_launcher_orphans_the_workers(sims: SimServers) -> None:
    server = sims.start("--tp-size", "2")
    workers = server.workers()
    os.kill(server.pid, signal.SIGKILL)
    server.proc.wait(5)
    time.sleep(0.3)
    for proc in workers:
        assert proc.is_running() and proc.status() != "zombie"
        assert proc.ppid() != server.pid
    assert [i for i, mib in used_mib(server.ledger).items() if mib] == [0, 1]
    for proc in workers:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
    assert not any(used_mib(server.ledger).values())


def test_a_dead_worker_takes_the_server_down(sims: SimServers) -> None:
    server = sims.start("--tp-size", "2")
    os.kill(server.workers()[1].pid, signal.SIGKILL)
    assert server.proc.wait(10) == 1
    assert "scheduler_TP1" in server.log() and "exited with status" in server.log()
    assert wait_for(lambda: not any(used_mib(server.ledger).values()), 2.0)


def test_log_and_banner_declare_a_simulation(sims: SimServers) -> None:
    server = sims.start()
    first = server.log().splitlines()[0]
    assert "SIMULATED" in first
    assert server.terminate() == 0


def test_busy_port_fails_start(sims: SimServers) -> None:
    first = sims.start()
    second = sims.start(ready=False, port=first.port)
    assert second.proc.wait(30) == 1
    assert "address already in use" in second.log()
    assert first.healthy()
