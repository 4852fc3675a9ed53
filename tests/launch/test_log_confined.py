"""``stop`` reads a run's log and state only from the run's own folder in the store's own
artifacts folder, and never through a link: a symbolic link at ``<artifacts>/<run id>/server.log``
made ``stop`` copy the head of ``/etc/shadow`` into the stored ``log_tail``, and a record naming
a folder outside the artifacts folder had that folder's ``server.log`` read (its path was only
checked as text)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cleanslate.cli.stop import stop_run
from cleanslate.errors import InputError
from cleanslate.store import RunRecord, RunStatus, Store

#: What a shadow line looks like (no word redaction would hide: the test sees what is kept).
SECRET = "root:$6$Zx81kQpW$R2d2C3po:19000:0:99999:7:::"
RUN_ID = "r-20261201-000000-c0de"


@pytest.fixture
def store_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("CLEANSLATE_ARTIFACTS", raising=False)
    monkeypatch.delenv("CLEANSLATE_STORE", raising=False)
    return tmp_path / "cleanslate.db"


def _record(store_path: Path, folder: Path) -> None:
    """A run that was serving and whose server has exited (its state says so): ``stop`` then
    keeps the tail of its log."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.json").write_text(json.dumps({"exit_code": 1}))
    store = Store(f"sqlite:///{store_path}")
    store.save_run(RunRecord(
        id=RUN_ID, host="local", engine="sim", model="m", argv=("sim",), marker=RUN_ID,
        port=1, url="http://127.0.0.1:1", log_path=f"{folder}/server.log",
        artifacts_dir=str(folder), status=RunStatus.READY, started_at=time.time() - 5))
    store.close()


def _stopped(store_path: Path) -> RunRecord:
    code = stop_run(RUN_ID, f"sqlite:///{store_path}", grace=0.5, deadline=5,
                    gpu_backend="none", json_out=True, settle=0.0)
    assert code == 0
    store = Store(f"sqlite:///{store_path}", create=False)
    try:
        return store.get_run(RUN_ID)
    finally:
        store.close()


def test_a_link_as_the_runs_log_is_not_followed(store_path: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text(SECRET + "\n")
    folder = tmp_path / "artifacts" / RUN_ID
    _record(store_path, folder)
    (folder / "server.log").symlink_to(shadow)
    run = _stopped(store_path)
    assert run.status == "crashed"  # the state was read: it is the run's own, a plain file
    assert SECRET not in (run.log_tail or "")
    assert SECRET not in capsys.readouterr().out


def test_a_folder_outside_the_stores_artifacts_is_not_read(store_path: Path,
                                                           tmp_path: Path) -> None:
    folder = tmp_path / "elsewhere" / RUN_ID  # the right shape, the wrong place
    _record(store_path, folder)
    (folder / "server.log").write_text(SECRET + "\n")
    run = _stopped(store_path)
    assert SECRET not in (run.log_tail or "")
    assert run.status == "stopped"  # its state.json (exit 1) was not read either
    own = tmp_path / "artifacts" / RUN_ID  # the run's own folder, with its log: read
    own.mkdir(parents=True)
    (own / "server.log").write_text("engine: CUDA out of memory\n")
    (own / "state.json").write_text(json.dumps({"exit_code": 1}))
    store = Store(f"sqlite:///{store_path}")
    store.save_run(store.get_run(RUN_ID).model_copy(update={
        "artifacts_dir": str(own), "log_path": f"{own}/server.log",
        "status": RunStatus.READY}))
    store.close()
    run = _stopped(store_path)
    assert run.status == "crashed" and "out of memory" in (run.log_tail or "")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_an_artifacts_folder_of_another_user_is_refused(store_path: Path,
                                                        tmp_path: Path) -> None:
    folder = tmp_path / "artifacts" / RUN_ID
    _record(store_path, folder)
    os.chown(tmp_path / "artifacts", 65534, 65534)
    with pytest.raises(InputError) as info:
        stop_run(RUN_ID, f"sqlite:///{store_path}", grace=0.5, deadline=5,
                 gpu_backend="none", json_out=True, settle=0.0)
    assert "artifacts folder" in info.value.message and "nobody" in info.value.message
    assert info.value.where == "--store"
