"""The fleet's host snapshot in-process, with real probes: the slots of one host share one probe
and one record, a host the study has a snapshot of is not probed again, and a probe that hangs
does not hold up a study asked to stop (its process is ended when the fleet closes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.store import Store
from cleanslate.tune.controller import open_optuna
from cleanslate.tune.fleet import Fleet
from cleanslate.tune.study import StudySpec
from cleanslate.tune.view import TuneView

SPEC = {"name": "snap", "engine": "sim", "model": "sim", "strategy": "grid",
        "space": {"max-running-requests": [16]}, "concurrency": [2]}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(f"sqlite:///{tmp_path / 's.db'}")
    yield opened
    opened.close()


def _fleet(store: Store) -> Fleet:
    spec = StudySpec.model_validate(SPEC)
    return Fleet(store=store, spec=spec, study=open_optuna(store, spec), view=TuneView(),
                 stop=asyncio.Event())


def test_the_slots_of_a_host_share_one_probe_and_one_record(store: Store) -> None:
    said: list[str] = []

    async def main() -> None:
        fleet = _fleet(store)
        executor = LocalExecutor()
        try:
            await asyncio.gather(*(fleet.host_snapshot(executor, said.append)
                                   for _ in range(3)))
        finally:
            await fleet.close()
        again = _fleet(store)  # a controller that resumes the study
        try:
            await again.host_snapshot(executor, said.append)
        finally:
            await again.close()

    asyncio.run(main())
    [record] = store.hosts(study="snap")
    assert record.host == "local" and record.machine and record.snapshot.error is None
    assert said.count("doctor snapshot of local") == 1, said


def test_a_hung_probe_does_not_hold_up_a_study_asked_to_stop(store: Store,
                                                             tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    python.chmod(0o755)

    async def main() -> float:
        fleet = _fleet(store)
        try:
            waiting = asyncio.ensure_future(
                fleet.host_snapshot(LocalExecutor(python=str(python)), lambda _m: None))
            while not pid_file.exists():
                await asyncio.sleep(0.05)
            started = time.monotonic()
            fleet.stop.set()
            await waiting
            return time.monotonic() - started
        finally:
            await fleet.close()

    assert asyncio.run(main()) < 2.0
    assert store.hosts(study="snap") == []  # not recorded: the next run takes it
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the probe outlived the fleet"
