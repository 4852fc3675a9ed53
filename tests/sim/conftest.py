"""Fixtures for the simulated engine: real servers in a fresh ledger, ended by PID.

Every server a test starts carries a unique ``CLEANSLATE_RUN`` marker; at the end the fixture
ends the launcher and every process carrying that marker (workers, setsid'd grandchildren, port
holders), by PID, and removes the ``/dev/shm`` files the server's faults left.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.sim import SimGpuBackend
from cleanslate.probe.snapshot import GpuReading
from tests._kit import free_port


def port_listening(port: int) -> bool:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return True
    return False


def read_gpus(ledger: Path) -> GpuReading:
    """Read the ledger through the real ``sim`` backend (a child Python, as on a remote host)."""
    return asyncio.run(SimGpuBackend(str(ledger)).read(LocalExecutor(), 10.0))


def used_mib(ledger: Path) -> dict[int, int]:
    reading = read_gpus(ledger)
    assert reading.ok, reading.error
    return {g.index: g.memory_used_mib or 0 for g in reading.gpus}


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def marked_pids(marker: str) -> list[int]:
    """Processes (of this user) whose environment carries ``CLEANSLATE_RUN=marker``."""
    out = []
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real != os.getuid():
                continue
            if proc.environ().get("CLEANSLATE_RUN") == marker:
                out.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


class SimServer:
    """One ``python -m cleanslate.sim serve`` process started by a test."""

    def __init__(self, ledger: Path, log: Path, args: list[str], port: int) -> None:
        self.ledger = ledger
        self.log_path = log
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.marker = f"test-sim-{uuid.uuid4().hex[:12]}"
        env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": str(ledger), "CLEANSLATE_RUN": self.marker}
        self._log = open(log, "wb")  # noqa: SIM115
        argv = [sys.executable, "-m", "cleanslate.sim", "serve", "--port", str(port), *args]
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log()}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise AssertionError(f"server not ready in {timeout} s:\n{self.log()}")

    def workers(self) -> list[psutil.Process]:
        return sorted(psutil.Process(self.pid).children(), key=lambda p: p.pid)

    def terminate(self, timeout: float = 15.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def end(self) -> None:
        """End the launcher and everything carrying its marker, by PID."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for pid in marked_pids(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in marked_pids(self.marker):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).wait(5)
        self._log.close()


class SimServers:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ledger = tmp / "gpus"
        self.ledger.mkdir()
        self.servers: list[SimServer] = []

    def start(self, *args: str, ready: bool = True, port: int | None = None) -> SimServer:
        port = port or free_port()
        log = self.tmp / f"server-{len(self.servers)}.log"
        server = SimServer(self.ledger, log, list(args), port)
        self.servers.append(server)
        if ready:
            server.wait_ready()
        return server

    def end_all(self) -> None:
        for server in self.servers:
            server.end()
            for path in glob.glob(f"/dev/shm/cleanslate-sim-{server.pid}-*"):
                with contextlib.suppress(OSError):
                    os.unlink(path)

