"""A run is recorded ``launching`` before its supervisor starts (issue 35), and a ``launching``
record left by a launcher that died is torn down by the run's marker and cgroup alone.

In-process with the simulated engine: :func:`launch` saves the record through its ``record``
callback; the test then keeps only that record in the store, as a launcher SIGKILLed before
it saved the PIDs would, and stops it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cleanslate.engines import get_engine
from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.launcher import LaunchRequest, launch, new_run_id
from cleanslate.launch.lifecycle import stop_server
from cleanslate.store import RunRecord, RunStatus, Store
from tests._kit import free_port
from tests.launch.test_start_cleanup import marked

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    return Store(f"sqlite:///{tmp_path}/cs.db")


def test_a_launching_record_is_saved_first_and_torn_down_by_marker_and_cgroup(
        store: Store) -> None:
    async def scenario() -> None:
        executor = LocalExecutor()
        adapter = get_engine("sim")
        port, run_id = free_port(), new_run_id()
        flags = {"tp-size": 1}
        request = LaunchRequest(
            run_id=run_id, adapter=adapter, model="sim", port=port,
            argv=tuple(adapter.build_argv("sim", port, flags)), flags=flags,
            env=adapter.prepare_env({}, store.artifacts), gpus=(0,),
            run_dir=f"{store.artifacts}/{run_id}")
        seen: list[tuple[RunRecord, list[int]]] = []

        def record(run: RunRecord) -> None:
            seen.append((run, marked(run_id)))  # what ran when the record was written
            store.save_run(run)

        launched = await launch(executor, request, record=record)
        [(pending, running_then)] = seen
        assert running_then == [], "the record must be written before anything runs"
        assert pending.status == RunStatus.LAUNCHING and pending.status.running
        assert (pending.pid, pending.pgid, pending.sid, pending.cgroup_id) == (None,) * 4
        assert (pending.marker, pending.port, pending.gpus) == (run_id, port, (0,))
        assert pending.uid == launched.run.uid and pending.boot_id == launched.run.boot_id
        assert pending.machine_id == launched.run.machine_id
        if launched.run.cgroup is not None:  # the path recorded first is the one made
            assert pending.cgroup == launched.run.cgroup
        orphans = marked(run_id)
        assert launched.run.pid in orphans
        # The launcher "died" here: the store holds only the launching record.
        left = store.get_run(run_id)
        assert left.status == RunStatus.LAUNCHING
        report = await stop_server(executor, store, left, grace_s=5.0, gpu_backend="sim",
                                   verify_deadline_s=20.0, cause="controller_died")
        assert marked(run_id) == []
        assert {t.why for t in report.targets} <= {"marker", "cgroup", "descendant"}
        assert {t.pid for t in report.targets} >= set(orphans)
        assert report.verify is not None and report.verify.verdict == "clean"
        final = store.get_run(run_id)
        assert final.status == RunStatus.STOPPED and final.cause == "controller_died"
        # The cgroup the supervisor reported (its id verified on the host) was used.
        assert final.cgroup_id == launched.run.cgroup_id
        if launched.run.cgroup is not None:
            assert report.cgroup == launched.run.cgroup and report.cgroup_refused is None

    asyncio.run(scenario())
