"""Issue 23: without a run cgroup, a dead run's recorded session and group numbers, reused by
another user's process that looks like an engine or holds the run's GPU, selected that process:
``stop`` SIGTERMed another user's sim server and GPU job, and a ``tune`` rerun did the same
through lease recovery (``recover_host``), then called the host clean.

Real processes, with the PID reuse made exact (``tests/teardown/_reuse.py``: ``ns_last_pid``
in the session's private PID namespace) and uid ``nobody`` as the other user. The dead run's
record is what a run without a cgroup leaves (``CLEANSLATE_CGROUP=0``, not root, a read-only
cgroup file system): its numbers, its leaders' start times, its user, no cgroup. Every process
signalled here is this test's own, by PID.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.lifecycle import stop_server
from cleanslate.sim.ledger import allocate
from cleanslate.store import RunRecord, RunStatus, Store
from cleanslate.teardown import TeardownReport
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import recover_host
from tests.teardown._reuse import Strangers, start_time, stat_field, strangers  # noqa: F401


def host_ids() -> tuple[str, str]:
    return (Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
            Path("/etc/machine-id").read_text().strip())


def dead_run(tmp_path: Path, number: int, *, study: str | None = None) -> RunRecord:
    """A run launched a minute ago as root without a cgroup, whose processes are all gone: its
    root was ``number`` (the group and session number too), its supervisor the same."""
    boot, machine = host_ids()
    began = time.time() - 60.0
    return RunRecord(
        id="r-20261201-000000-dead", host="local", engine="sim", model="sim", argv=("sim",),
        marker="r-20261201-000000-dead", port=39999, url="http://127.0.0.1:39999",
        log_path=str(tmp_path / "server.log"), artifacts_dir=str(tmp_path), status=RunStatus.READY,
        pid=number, pgid=number, sid=number, create_time=round(began + 0.4, 2),
        supervisor_pid=number, supervisor_create_time=round(began + 0.4, 2),
        started_at=began, gpus=(0,), boot_id=boot, machine_id=machine, user="root", uid=0,
        env={"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}, study=study)


def stop(tmp_path: Path, run: RunRecord) -> TeardownReport:
    store = Store(f"sqlite:///{tmp_path / 'cs.db'}")
    try:
        store.save_run(run)
        return asyncio.run(stop_server(LocalExecutor(), store, run, grace_s=1.0,
                                       gpu_backend="sim", verify_deadline_s=0.1,
                                       verify_settle_s=0.0))
    finally:
        store.close()


def untouched(pid: int, ticks: str, report: TeardownReport) -> str:
    """The process is alive as it was, nothing was signalled, and the report says why it was
    left alone (returned)."""
    assert start_time(pid) == ticks  # the same process, alive
    assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    assert report.rounds == () and report.killed == ()
    assert pid not in {t.pid for t in report.targets}
    reasons = {t.pid: t.protected for t in report.left_alone}
    assert reasons.get(pid), report.left_alone
    return str(reasons[pid])


@pytest.mark.parametrize("kind", ["sim server", "GPU job"])
def test_stop_leaves_another_users_process_with_the_runs_reused_numbers(
        tmp_path: Path, strangers: Strangers, kind: str) -> None:  # noqa: F811
    number = strangers.dead_pid()
    comm = "sim::scheduler" if kind == "sim server" else "train"
    stranger = strangers.spawn_at(number, comm=comm)
    assert stranger == number and stat_field(stranger, 1) == "1"  # a daemon: not ours
    if kind == "GPU job":
        allocate(str(tmp_path / "gpus"), 0, 20_000, "train", pid=stranger)  # the run's GPU
    ticks = start_time(stranger)
    report = stop(tmp_path, dead_run(tmp_path, number))
    why = untouched(stranger, ticks, report)
    assert "was reused" in why and f"PID {number}" in why
    assert report.verify is not None and report.verify.verdict != "clean"


def test_stop_leaves_another_users_member_of_a_reused_session_whose_leader_is_gone(
        tmp_path: Path, strangers: Strangers) -> None:  # noqa: F811
    """The session's leader (the reused number) has exited: nothing alive has the number as
    its PID, so only the member's owner says it is not the run's."""
    number = strangers.dead_pid()
    member = strangers.spawn_at(number, comm="train", mode="orphan")
    assert member != number and not Path(f"/proc/{number}").exists()
    assert stat_field(member, 3) == str(number) and stat_field(member, 1) == "1"
    allocate(str(tmp_path / "gpus"), 0, 20_000, "train", pid=member)
    ticks = start_time(member)
    report = stop(tmp_path, dead_run(tmp_path, number))
    assert "owned by uid 65534" in untouched(member, ticks, report)


def test_tune_lease_recovery_leaves_another_users_sim_server(
        tmp_path: Path, strangers: Strangers) -> None:  # noqa: F811
    """``recover_host`` (a ``tune`` rerun cleaning up after a dead controller) stops the
    study's dead run through the same rule, and does not call the host clean."""
    number = strangers.dead_pid()
    stranger = strangers.spawn_at(number, comm="sim::scheduler")
    allocate(str(tmp_path / "gpus"), 0, 20_000, "sim::scheduler", pid=stranger)
    ticks = start_time(stranger)
    spec = StudySpec.model_validate({
        "name": "v", "engine": "sim", "model": "sim", "space": {"fault": [None]},
        "concurrency": [1], "verify_deadline_s": 0.1, "grace_s": 1})
    store = Store(f"sqlite:///{tmp_path / 'cs.db'}")
    try:
        store.save_run(dead_run(tmp_path, number, study="v"))
        said: list[str] = []
        assert asyncio.run(recover_host(LocalExecutor(), store, spec, said.append)) == 1
        after = store.get_run("r-20261201-000000-dead")
    finally:
        store.close()
    assert after.teardown is not None
    assert "was reused" in untouched(stranger, ticks, after.teardown)
    assert after.verdict_after is not None and after.verdict_after.verdict != "clean"
