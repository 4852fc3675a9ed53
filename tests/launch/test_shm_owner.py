"""Teardown removes only the run's user's ``/dev/shm`` files (issue 23, Build 7).

``/dev/shm`` is world-writable: another user can create a file whose name matches the engine's
globs after the run started, and teardown used to delete it. Real files in the session's
private ``/dev/shm``, one of them owned by uid ``nobody``, and a real teardown that removes
what :func:`shm_remover` picks.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanslate.engines import engine_class
from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.lifecycle import shm_remover
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.store import RunRecord
from cleanslate.teardown import ScopeSpec, teardown

NOBODY = 65534

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a file of uid nobody needs root to make"),
    pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm"),
]


def _run(**fields: object) -> RunRecord:
    run_id = f"r-shm-{uuid.uuid4().hex[:8]}"
    return RunRecord(id=run_id, host="local", engine="sim", model="sim", argv=("x",),
                     marker=run_id, port=1, url="http://127.0.0.1:1",
                     log_path="/nonexistent/log", artifacts_dir="/nonexistent",
                     started_at=time.time() - 5.0, **fields)  # type: ignore[arg-type]


@pytest.fixture
def files() -> Iterator[tuple[Path, Path]]:
    tag = uuid.uuid4().hex[:8]
    ours = Path(f"/dev/shm/cleanslate-sim-{tag}-ours")
    theirs = Path(f"/dev/shm/cleanslate-sim-{tag}-theirs")
    ours.write_bytes(b"\1" * 4096)
    theirs.write_bytes(b"\1" * 4096)
    os.chown(theirs, NOBODY, NOBODY)
    try:
        yield ours, theirs
    finally:
        ours.unlink(missing_ok=True)
        theirs.unlink(missing_ok=True)


def _teardown(run: RunRecord) -> tuple[str, ...]:
    pick = shm_remover(run, engine_class("sim").leftovers)
    report = asyncio.run(teardown(LocalExecutor(), ScopeSpec(marker=run.marker,
                                                             exclude_roots=frozenset(
                                                                 {os.getpid()})),
                                  grace_s=1.0, remove_shm=pick))
    return report.shm_removed


def test_another_users_file_is_left(files: tuple[Path, Path]) -> None:
    ours, theirs = files
    removed = _teardown(_run(uid=os.geteuid()))
    assert ours.name in removed and theirs.name not in removed
    assert not ours.exists() and theirs.exists()
    assert theirs.stat().st_uid == NOBODY


def test_a_record_without_a_uid_uses_the_probing_user(files: tuple[Path, Path]) -> None:
    """Records made before the uid was kept: the user the probe ran as on the host."""
    ours, theirs = files
    removed = _teardown(_run())
    assert ours.name in removed and theirs.name not in removed
    assert theirs.exists()


def test_a_run_of_another_user_removes_none_of_ours(files: tuple[Path, Path]) -> None:
    ours, theirs = files
    snapshot = asyncio.run(probe_host(LocalExecutor(), NoGpuBackend(), timeout=10.0))
    picked = shm_remover(_run(uid=NOBODY), engine_class("sim").leftovers)(snapshot)
    assert theirs.name in picked and ours.name not in picked
