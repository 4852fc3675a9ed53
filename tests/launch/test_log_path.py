"""A run record from a shared store cannot make cleanslate read an arbitrary file as its log."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.ready import log_tail, run_log_path
from cleanslate.store import RunRecord


def _run(folder: str, log: str, run_id: str = "r-20261201-000000-abcd") -> RunRecord:
    return RunRecord(id=run_id, host="local", engine="sim", model="m", argv=("x",),
                     marker=run_id, port=8000, url="http://127.0.0.1:8000", log_path=log,
                     artifacts_dir=folder)


def test_only_the_runs_own_log_is_read(tmp_path: Path) -> None:
    run_id = "r-20261201-000000-abcd"
    folder = tmp_path / run_id
    folder.mkdir()
    (folder / "server.log").write_text("engine says hello\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("root's secret\n")
    own = _run(str(folder), f"{folder}/server.log")
    assert run_log_path(own) == f"{folder}/server.log"
    assert "hello" in asyncio.run(log_tail(LocalExecutor(), own))
    for bad in (_run(str(folder), str(secret)),                        # another file
                _run(str(tmp_path), f"{tmp_path}/server.log"),          # not the run's folder
                _run(f"{folder}/../{run_id}", f"{folder}/../{run_id}/server.log"),
                _run("/etc", "/etc/passwd")):
        assert run_log_path(bad) is None
        assert asyncio.run(log_tail(LocalExecutor(), bad)) == ""
