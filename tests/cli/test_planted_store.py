"""The reproduction of issue 23: ``tune``, ``check`` and ``stop`` default to ``./cleanslate.db``;
a file of uid ``nobody``, planted in a world-writable working folder, was opened and its run
records acted on: ``stop`` and ``tune``'s recovery signalled the process a planted run record
named (here: the operator's own ``sleep``, by its PID and start time). Now ``stop`` and ``tune``
exit 2 naming the file and why, and ``check`` ignores it with a warning (it only reads the
store's ports; the host is still checked) unless it was named with ``--store``, which exits 2.

The folder is ``/tmp``-like (sticky), so that only the owner check can refuse the file."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

import cleanslate.cli as cli_mod
from cleanslate.store import RunRecord, RunStatus, Store
from tests.conftest import Processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a file of nobody")

NOBODY = 65534
RUN_ID = "r-20261201-000000-beef"
STUDY = """\
name: planted
engine: sim
model: sim
gpus: [0]
fixed: {tp-size: 1}
space: {max-running-requests: [16]}
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
concurrency: [2]
"""


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["cleanslate", *args])
    with pytest.raises(SystemExit) as info:
        cli_mod.main()
    return int(info.value.code or 0)


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            procs: Processes) -> tuple[Path, int]:
    """A working folder like ``/tmp`` holding ``cleanslate.db`` of ``nobody`` whose one run
    (of study ``planted``, said to be serving) names the operator's ``sleep``; the current
    folder is that folder. Returns the file and the ``sleep``'s PID."""
    monkeypatch.delenv("CLEANSLATE_STORE", raising=False)
    monkeypatch.delenv("CLEANSLATE_ARTIFACTS", raising=False)
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    victim = procs.start(["sleep", "60"])
    db = folder / "cleanslate.db"
    store = Store(f"sqlite:///{db}")
    store.save_run(RunRecord(
        id=RUN_ID, host="local", engine="sim", model="sim", argv=("sleep", "60"),
        marker=RUN_ID, port=39999, url="http://127.0.0.1:39999",
        log_path=f"{folder}/artifacts/{RUN_ID}/server.log",
        artifacts_dir=f"{folder}/artifacts/{RUN_ID}", status=RunStatus.READY,
        pid=victim.pid, create_time=psutil.Process(victim.pid).create_time(),
        started_at=time.time() - 5, study="planted", trial=0))
    store.close()
    os.chown(db, NOBODY, NOBODY)
    monkeypatch.chdir(folder)
    return db, victim.pid


def _unchanged(db: Path, victim_pid: int) -> None:
    assert psutil.pid_exists(victim_pid) and psutil.Process(victim_pid).status() != "zombie"
    os.chown(db, 0, 0)  # read it back as its owner would: still the planted record
    store = Store(f"sqlite:///{db}", create=False)
    try:
        assert store.get_run(RUN_ID).status == RunStatus.READY
    finally:
        store.close()


def test_stop_refuses_a_planted_store(planted: tuple[Path, int],
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    db, victim = planted
    assert _main(monkeypatch, "stop", RUN_ID, "--gpu-backend", "none", "--deadline", "2") == 2
    err = capsys.readouterr().err
    assert "--store" in err and str(db) in err and "owned by nobody" in err
    assert "Traceback" not in err
    _unchanged(db, victim)


def test_tune_refuses_a_planted_store(planted: tuple[Path, int], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    db, victim = planted
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    assert _main(monkeypatch, "tune", str(study), "--gpu-backend", "sim") == 2
    err = capsys.readouterr().err
    assert "owned by nobody" in err and str(db) in err
    _unchanged(db, victim)


def test_check_ignores_a_planted_default_store_and_refuses_a_named_one(
        planted: tuple[Path, int], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = planted
    code = _main(monkeypatch, "check", "--gpu-backend", "none", "--json")
    err = capsys.readouterr().err
    assert code != 2 and "warning: ignoring the store" in err and "owned by nobody" in err
    assert _main(monkeypatch, "check", "--gpu-backend", "none", "--store", str(db)) == 2
    assert "owned by nobody" in capsys.readouterr().err
