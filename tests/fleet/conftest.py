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

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import pytest

from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
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
