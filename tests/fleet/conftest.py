"""Fixtures of namespaced test hosts (see :mod:`tests.fleet.hosts` for how they work).

- ``fleet`` (per module): ``fleet-a`` and ``fleet-b``, clean, and ``fleet-c`` with a decoy
  ``sglang::scheduler`` holding 30000 MiB on its GPU 0. Tests that use it leave the hosts as they
  found them (stop their runs). It ends with its module: the test session's own namespace sees
  every process of the hosts' namespaces (under other PIDs), so a decoy that outlived the module
  would make another module's local check DIRTY.
- ``make_fleet`` (per test): ``make_fleet(["fleet-a", "fleet-b"], decoys={"fleet-b": Decoy()})``
  starts a fresh fleet under the test's ``tmp_path``, ended when the test ends.
- ``fleet_env``: the test process's ``HOME`` and ``CLEANSLATE_SIM_GPU_DIR`` switched to the
  module fleet's (for code that runs in-process).

They skip, with the reason, where the hosts cannot run (no root, no ``unshare``, no sshd).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO

import pytest

from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
from tests.conftest import Processes
from tests.fleet.hosts import Decoy, Fleet, fleet_unavailable, start_fleet

#: The module's fleet: two clean hosts and one with a decoy.
SESSION_HOSTS = ("fleet-a", "fleet-b", "fleet-c")
DECOY_HOST = "fleet-c"


def skip_unless_available() -> None:
    """Skip the test, with the reason, where namespaced hosts cannot run."""
    reason = fleet_unavailable()
    if reason is not None:
        pytest.skip(f"namespaced test hosts cannot run here: {reason}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    skip_unless_available()
    started = start_fleet(tmp_path_factory.mktemp("fleet"), SESSION_HOSTS,
                          decoys={DECOY_HOST: Decoy()})
    try:
        yield started
    finally:
        started.stop()


MakeFleet = Callable[..., Fleet]


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[MakeFleet]:
    skip_unless_available()
    fleets: list[Fleet] = []

    def make(aliases: Iterable[str] = ("fleet-a", "fleet-b"), *,
             decoys: Mapping[str, Decoy] | None = None, gpus: int = 8) -> Fleet:
        made = start_fleet(tmp_path / f"fleet{len(fleets)}", aliases, decoys=decoys, gpus=gpus)
        fleets.append(made)
        return made

    try:
        yield make
    finally:
        for made in fleets:
            made.stop()


@pytest.fixture
def fleet_env(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    monkeypatch.setenv("HOME", str(fleet.home))
    monkeypatch.setenv(SIM_GPU_DIR_ENV, str(fleet.ledger_path))
    for name in ("SSH_AUTH_SOCK", "CLEANSLATE_SSH_ACCEPT_NEW", "CLEANSLATE_SSH_CONFIG",
                 "CLEANSLATE_STORE"):
        monkeypatch.delenv(name, raising=False)
    return fleet


class Cli:
    """``cleanslate ...`` processes of the fleet's client (its ``HOME`` and ledger path, in its
    root directory), started by this test and ended by PID (``procs``)."""

    def __init__(self, fleet: Fleet, procs: Processes) -> None:
        self.fleet, self.procs = fleet, procs
        self.logs: dict[str, Path] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        path = self.fleet.root / f"{name}.log"
        self.logs[name] = path
        fh: IO[bytes] = path.open("wb")
        try:
            return self.procs.start([sys.executable, "-m", "cleanslate", *args],
                                    env=self.fleet.client_env(), cwd=self.fleet.root,
                                    stdout=fh, stderr=subprocess.STDOUT)
        finally:
            fh.close()

    def worker(self, name: str, study_name: str, store: str, host: str, gpu: int,
               port: int) -> subprocess.Popen[bytes]:
        return self.start(name, "worker", "--study", study_name, "--store", store,
                          "--host", host, "--gpus", str(gpu), "--port", str(port))

    def tail(self, name: str) -> str:
        return f"--- {name} ---\n" + self.logs[name].read_text(errors="replace")[-3000:]

    def wait_all(self, procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in procs.values():
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, "\n".join(self.tail(n) for n in procs)
