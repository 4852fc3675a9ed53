"""Issue 23: a recorded cgroup path was only checked to end in ``cleanslate-<run id>``, so a plain
folder of that name with a text ``cgroup.procs`` made ``stop`` kill the PIDs it listed.

Now the path must be, on the host, its own ``realpath``, a directory of a cgroup v2 file system
(``statfs`` magic), owned by the run's user and the very directory its supervisor created (the
recorded inode); anything else is ignored (``cgroup_refused``) and signals nothing. Each victim
is a daemon (re-parented to the namespace's init: not this test's descendant, which teardown
would protect anyway) that this test ends by PID.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch._supervise_script import cgroup_parent
from cleanslate.launch.lifecycle import stop_server
from cleanslate.store import RunRecord, RunStatus, Store
from cleanslate.teardown import TeardownReport
from cleanslate.teardown._host import cgroup_op
from cleanslate.teardown.scope import CGROUP
from tests.hosts.conftest import ssh_home, sshd  # noqa: F401
from tests.teardown._reuse import Strangers, start_time, strangers  # noqa: F401

RUN = "r-20261201-000000-cgrp"


def record(tmp_path: Path, cgroup: str, *, cgroup_id: int | None = None) -> RunRecord:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    machine = Path("/etc/machine-id").read_text().strip()
    return RunRecord(
        id=RUN, host="local", engine="command", model="m", argv=("x",), marker=RUN,
        port=39998, url="http://127.0.0.1:39998", log_path=str(tmp_path / "server.log"),
        artifacts_dir=str(tmp_path), status=RunStatus.READY, started_at=time.time() - 60.0,
        boot_id=boot, machine_id=machine, uid=0, cgroup=cgroup, cgroup_id=cgroup_id)


def stop(tmp_path: Path, run: RunRecord) -> TeardownReport:
    store = Store(f"sqlite:///{tmp_path / 'cs.db'}")
    try:
        store.save_run(run)
        return asyncio.run(stop_server(LocalExecutor(), store, run, grace_s=1.0,
                                       gpu_backend="none", verify_deadline_s=0.1,
                                       verify_settle_s=0.0))
    finally:
        store.close()


def assert_untouched(pid: int, ticks: str, report: TeardownReport) -> None:
    assert start_time(pid) == ticks
    assert report.rounds == () and report.killed == () and not report.cgroup_killed
    assert pid not in {t.pid for t in report.targets}


@pytest.fixture
def cgroups() -> Iterator[list[str]]:
    """Real cgroups made by the test (the run's name under this process's cgroup), moved out
    of and removed at the end."""
    parent, why = cgroup_parent()
    if parent is None or os.geteuid() != 0:
        pytest.skip(f"no cgroup v2 to create a cgroup in: {why or 'not root'}")
    made: list[str] = []
    yield made
    for path in reversed(made):
        procs = Path(path, "cgroup.procs")
        if procs.exists():
            for pid in procs.read_text().split():
                Path(parent, "cgroup.procs").write_text(pid)
            os.rmdir(path)


def make_cgroup(cgroups: list[str], *members: int) -> str:
    parent, _ = cgroup_parent()
    path = f"{parent}/cleanslate-{RUN}"
    os.mkdir(path)
    cgroups.append(path)
    for pid in members:
        Path(path, "cgroup.procs").write_text(str(pid))
    return path


def test_a_plain_folder_named_like_the_runs_cgroup_selects_nothing(
        tmp_path: Path, strangers: Strangers) -> None:  # noqa: F811
    victim = strangers.spawn_at(0, comm="editor", uid=0)
    ticks = start_time(victim)
    fake = tmp_path / f"cleanslate-{RUN}"
    fake.mkdir()
    (fake / "cgroup.procs").write_text(f"{victim}\n")
    (fake / "cgroup.kill").write_text("")
    report = stop(tmp_path, record(tmp_path, str(fake)))
    assert_untouched(victim, ticks, report)
    assert report.cgroup_refused is not None
    assert "not in a cgroup v2 file system" in report.cgroup_refused
    assert report.cgroup is None and not report.cgroup_removed
    assert (fake / "cgroup.kill").read_text() == "" and fake.exists()


def test_a_symbolic_link_to_a_cgroup_is_not_followed(
        tmp_path: Path, strangers: Strangers, cgroups: list[str]) -> None:  # noqa: F811
    victim = strangers.spawn_at(0, comm="editor", uid=0)
    ticks = start_time(victim)
    real = make_cgroup(cgroups, victim)
    link = tmp_path / f"cleanslate-{RUN}"
    link.symlink_to(real)
    report = stop(tmp_path, record(tmp_path, str(link), cgroup_id=os.stat(real).st_ino))
    assert_untouched(victim, ticks, report)
    assert report.cgroup_refused is not None and "symbolic link" in report.cgroup_refused


def test_a_cgroup_of_another_owner_or_another_inode_selects_nothing(
        tmp_path: Path, strangers: Strangers, cgroups: list[str]) -> None:  # noqa: F811
    """A cgroup of the run's name that its supervisor did not create: another user's (a
    delegated subtree), or one made after the run's own was removed (another inode)."""
    victim = strangers.spawn_at(0, comm="editor", uid=0)
    ticks = start_time(victim)
    path = make_cgroup(cgroups, victim)
    ino = os.stat(path).st_ino
    report = stop(tmp_path, record(tmp_path, path, cgroup_id=ino + 1))
    assert_untouched(victim, ticks, report)
    assert report.cgroup_refused is not None
    assert "not the cgroup the run's supervisor created" in report.cgroup_refused
    os.chown(path, 65534, 65534)
    report = stop(tmp_path, record(tmp_path, path, cgroup_id=ino))
    assert_untouched(victim, ticks, report)
    assert report.cgroup_refused is not None and "owned by uid 65534" in report.cgroup_refused
    assert Path(path).is_dir()


def test_the_runs_own_cgroup_is_used(tmp_path: Path, strangers: Strangers,  # noqa: F811
                                     cgroups: list[str]) -> None:
    """The check admits the real thing: its members are the run's, ended, and the cgroup is
    removed."""
    member = strangers.spawn_at(0, comm="ghost", uid=0)
    path = make_cgroup(cgroups, member)
    data = asyncio.run(cgroup_op(LocalExecutor(), path, uid=0, cgroup_id=os.stat(path).st_ino))
    assert data["ok"] and data["members"] == [member]
    report = stop(tmp_path, record(tmp_path, path, cgroup_id=os.stat(path).st_ino))
    assert report.cgroup_refused is None and report.cgroup == path
    assert {t.pid: t.why for t in report.targets} == {member: CGROUP}
    assert report.cgroup_removed and not Path(path).exists()
    assert not Path(f"/proc/{member}").exists() or \
        Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.slow  # an SSH session and two Python starts on the host: 1.6-3 s here
def test_the_check_runs_on_the_remote_host(tmp_path: Path, cgroups: list[str],
                                           sshd: object, ssh_home: Path,  # noqa: F811
                                           ) -> None:
    """Over SSH the same script runs on the host (its python3): the plain folder is refused
    there, the real cgroup admitted."""
    from cleanslate.hosts.ssh import SSHExecutor

    fake = tmp_path / f"cleanslate-{RUN}"
    fake.mkdir()
    (fake / "cgroup.procs").write_text("1\n")
    real = make_cgroup(cgroups)

    async def both() -> tuple[dict[str, object], dict[str, object]]:
        executor = SSHExecutor("plain")
        try:
            return (await cgroup_op(executor, str(fake), uid=0),
                    await cgroup_op(executor, real, uid=0, cgroup_id=os.stat(real).st_ino))
        finally:
            await executor.close()

    refused, admitted = asyncio.run(both())
    assert "not in a cgroup v2 file system" in str(refused.get("refused")), refused
    assert admitted.get("ok") is True and admitted.get("members") == [], admitted
