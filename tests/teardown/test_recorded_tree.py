"""Issue 35: without a cgroup, a same-user process that reused a dead run's group number and held
its GPU was SIGTERMed by ``stop`` (it passed every check a number had: window, owner, holding).

Now numbers select nothing; what the run's supervisor recorded does (``tree.txt``: each
descendant's PID and start time, read strictly). Real processes: the supervisor script itself,
processes placed at exact PIDs in the session's private PID namespace (``tests/teardown/
_reuse.py``), the simulated GPU ledger. Every process signalled is this test's own, by PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.lifecycle import stop_server
from cleanslate.sim.ledger import allocate
from cleanslate.store import RunRecord, RunStatus, Store
from cleanslate.teardown import TREE_FILE, TeardownReport
from cleanslate.teardown._tree import MAX_BYTES, parse_tree
from cleanslate.teardown.scope import RECORDED
from tests._kit import alive
from tests.teardown._reuse import Strangers, start_time, stat_field, strangers  # noqa: F401

HERE = Path(__file__).resolve().parent
SUPERVISOR = HERE.parent.parent / "src" / "cleanslate" / "launch" / "_supervise_script.py"
RUN = "r-20261206-000000-tree"
HZ = os.sysconf("SC_CLK_TCK")
BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
MACHINE = Path("/etc/machine-id").read_text().strip()
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"


def run_dir(tmp_path: Path) -> Path:
    """The run's own folder in the store's artifacts folder (where ``stop`` reads it)."""
    folder = tmp_path / "artifacts" / RUN
    folder.mkdir(parents=True, mode=0o700)
    return folder


def record(folder: Path, **fields: object) -> RunRecord:
    values: dict[str, object] = dict(
        id=RUN, host="local", engine="command", model="m", argv=("x",), marker=RUN,
        port=39997, url="http://127.0.0.1:39997", log_path=str(folder / "server.log"),
        artifacts_dir=str(folder), status=RunStatus.READY, started_at=time.time() - 60.0,
        boot_id=BOOT, machine_id=MACHINE, uid=os.geteuid(), gpus=(0,),
        env={"CLEANSLATE_SIM_GPU_DIR": str(folder.parent.parent / "gpus")})
    values.update(fields)
    return RunRecord(**values)  # type: ignore[arg-type]


def stop(tmp_path: Path, run: RunRecord, gpu: str = "none",
         said: list[str] | None = None) -> TeardownReport:
    store = Store(f"sqlite:///{tmp_path / 'cs.db'}")
    try:
        store.save_run(run)
        return asyncio.run(stop_server(LocalExecutor(), store, run, grace_s=1.0,
                                       gpu_backend=gpu, verify_deadline_s=0.1,
                                       verify_settle_s=0.0,
                                       progress=said.append if said is not None else None))
    finally:
        store.close()


def tree_text(entries: list[tuple[int, int]], boot: str = BOOT) -> str:
    return f"cleanslate-tree 1 {boot} {HZ}\n" + "".join(f"{p} {t}\n" for p, t in entries)


def children_of(parent: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if stat_field(int(entry.name), 1) == str(parent):
                    out.append(int(entry.name))
            except FileNotFoundError:
                continue
    return out


def untouched(pid: int, ticks: str, report: TeardownReport) -> None:
    assert start_time(pid) == ticks and alive(pid)
    assert pid not in {t.pid for t in report.targets}
    assert report.rounds == () and report.killed == ()


# -- the file, parsed strictly ------------------------------------------------------------------


def test_parse_takes_only_what_the_supervisor_writes() -> None:
    good = parse_tree(tree_text([(1234, 5678), (99, 100)]).encode())
    assert good.boot_id == BOOT and good.entries == ((1234, 5678 / HZ), (99, 100 / HZ))
    torn = parse_tree((tree_text([(1234, 5678)]) + "4321 12").encode())  # a write under way
    assert torn.entries == ((1234, 5678 / HZ),)
    header = tree_text([])
    for bad in (b"", b"1234 5678\n", header.replace("tree 1", "tree 2").encode(),
                (header + "1234 5678 9\n").encode(), (header + "1234\n").encode(),
                (header + "-5 10\n").encode(), (header + "1 10\n").encode(),
                (header + "12 1e3\n").encode(), (header + " 12 13\n").encode(),
                (header + "12 13\n\n").encode(), (header + "kill -9 1\n").encode(),
                (header + "１２ 13\n").encode(), header.replace(f" {HZ}\n", " 0\n").encode(),
                header.encode() + b"12 13\xff\n", b"x" * (MAX_BYTES + 1)):
        with pytest.raises(ValueError) as caught:
            parse_tree(bad)
        assert "kill" not in str(caught.value)  # the content is never quoted


# -- the supervisor records; stop selects by the record ----------------------------------------


def test_a_setsid_grandchild_that_left_the_run_is_found_by_the_recorded_tree(
        tmp_path: Path) -> None:
    """The engine starts a ghost (double fork, ``setsid``, renamed, re-executed with an empty
    environment: no marker, another group and session), then the supervisor and the engine are
    SIGKILLed, so the ghost is re-parented away from the run: only the tree names it."""
    folder = run_dir(tmp_path)
    pidfile = tmp_path / "ghost.pid"
    spec = {"argv": [sys.executable, str(HERE / "_ghost_server.py"), str(pidfile), "/bin/sleep",
                     "300"], "env": {"CLEANSLATE_RUN": RUN}, "log": str(folder / "server.log"),
            "state": str(folder / "state.json"), "daemonize": True, "cgroup": None}
    (folder / "spec.json").write_text(json.dumps(spec))
    began = time.time()
    subprocess.run([sys.executable, "-I", "-S", str(SUPERVISOR), str(folder / "spec.json")],
                   check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not (folder / "state.json").exists() or not pidfile.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    state = json.loads((folder / "state.json").read_text())
    ghost, root, sup = int(pidfile.read_text()), int(state["pid"]), int(state["supervisor_pid"])
    try:
        ghost_ticks = start_time(ghost)
        tree = folder / TREE_FILE
        while f"\n{ghost} {ghost_ticks}\n" not in tree.read_text():
            assert time.monotonic() < deadline, tree.read_text()
            time.sleep(0.01)
        assert tree.stat().st_mode & 0o777 == 0o600
        assert f"\n{root} {start_time(root)}\n" in tree.read_text()
        fields = stat_field(ghost, 2), stat_field(ghost, 3)
        assert str(root) not in fields and str(sup) not in fields  # left group and session
        assert b"CLEANSLATE_RUN" not in Path(f"/proc/{ghost}/environ").read_bytes()
        run = record(folder, pid=root, pgid=root, sid=int(state["sid"]),
                     create_time=None, supervisor_pid=sup, supervisor_create_time=None,
                     started_at=began)
        os.kill(sup, signal.SIGKILL)  # this test's supervisor and engine, by PID
        os.kill(root, signal.SIGKILL)
        while alive(root) or alive(sup) or stat_field(ghost, 1) == str(sup):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        report = stop(tmp_path, run)
        assert {t.pid: t.why for t in report.targets}.get(ghost) == RECORDED, report.targets
        assert not alive(ghost)
    finally:
        for pid in (ghost, root, sup):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_reused_group_number_of_the_same_user_holding_the_runs_gpu_is_left_alone(
        tmp_path: Path, strangers: Strangers) -> None:  # noqa: F811
    """The case measured in issue 35: the dead run's group and session number is carried by a
    process of the run's own user, started after the run, holding the run's GPU (the
    number's leader is gone, so nothing says it was reused). It used to be SIGTERMed."""
    number = strangers.dead_pid()
    member = strangers.spawn_at(number, comm="train", uid=os.geteuid(), mode="orphan")
    assert member != number and stat_field(member, 2) == str(number)
    folder = run_dir(tmp_path)
    allocate(str(tmp_path / "gpus"), 0, 20_000, "train", pid=member)  # the run's GPU 0
    # What the dead run's supervisor recorded: its own processes, all gone now.
    (folder / TREE_FILE).write_text(tree_text([(number, 1), (number + 1, 2)]))
    ticks = start_time(member)
    run = record(folder, pid=number, pgid=number, sid=number, supervisor_pid=number,
                 create_time=round(time.time() - 59.6, 2),
                 supervisor_create_time=round(time.time() - 59.6, 2))
    report = stop(tmp_path, run, gpu="sim")
    untouched(member, ticks, report)
    why = {t.pid: str(t.protected) for t in report.left_alone}.get(member, "")
    assert "not among the processes the run's supervisor recorded" in why, report.left_alone
    assert report.verify is not None and report.verify.verdict != "clean"


#: Each planted file, and what ``stop`` says of it (``None``: the file is read, and its entry
#: names no process of the run).
PLANTS = {"wrong start time": None, "garbage line": "line 3 is not", "symbolic link":
          "symbolic link", "another owner": "owned by", "another boot": None,
          "before the run": None}


@pytest.mark.parametrize("plant", PLANTS)
def test_a_planted_tree_selects_nothing(tmp_path: Path, strangers: Strangers,  # noqa: F811
                                        plant: str) -> None:
    """A tree file that the supervisor did not write, naming a live process of the run's user
    (started after the run): it selects nothing, whatever it lists."""
    victim = strangers.spawn_at(0, comm="editor", uid=os.geteuid())
    ticks = start_time(victim)
    folder = run_dir(tmp_path)
    tree = folder / TREE_FILE
    good = tree_text([(victim, int(ticks))])
    run = record(folder)
    if plant == "wrong start time":
        tree.write_text(tree_text([(victim, int(ticks) + 3 * HZ)]))
    elif plant == "garbage line":
        tree.write_text(good + f"{victim} {ticks} 0\n")
    elif plant == "symbolic link":
        (tmp_path / "elsewhere").write_text(good)
        tree.symlink_to(tmp_path / "elsewhere")
    elif plant == "another owner":
        tree.write_text(good)
        os.chown(tree, 65534, 65534)
    elif plant == "another boot":
        tree.write_text(tree_text([(victim, int(ticks))], boot=OTHER_BOOT))
    else:
        tree.write_text(good)
        run = record(folder, started_at=time.time() + 30.0)
    said: list[str] = []
    report = stop(tmp_path, run, said=said)
    untouched(victim, ticks, report)
    refused = [line for line in said if "process tree file" in line]
    expected = PLANTS[plant]
    assert (refused == [] if expected is None else expected in " ".join(refused)), said


def test_the_same_tree_written_right_selects_its_process(
        tmp_path: Path, strangers: Strangers) -> None:  # noqa: F811
    """The control of the test above: the file as the supervisor writes it is honoured."""
    victim = strangers.spawn_at(0, comm="editor", uid=os.geteuid())
    folder = run_dir(tmp_path)
    (folder / TREE_FILE).write_text(tree_text([(victim, int(start_time(victim)))]))
    report = stop(tmp_path, record(folder))
    assert {t.pid: t.why for t in report.targets} == {victim: RECORDED}
    assert not alive(victim)


def test_the_recorder_judges_a_reused_pid_anew(tmp_path: Path,
                                               strangers: Strangers) -> None:  # noqa: F811
    """The supervisor reads only new PIDs on most passes; a new process whose parent's PID was
    the tree's is recorded only if that parent is still the process judged (its start time):
    here a recorded child exits and another user's-like daemon takes its PID and starts a
    child of its own before the next pass. Neither is recorded."""
    from cleanslate.launch._supervise_script import TreeRecorder

    tree = tmp_path / TREE_FILE
    recorder = TreeRecorder(str(tree), BOOT)
    child = subprocess.Popen(["sleep", "60"])
    try:
        recorder.scan()
        number, ticks = child.pid, start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert f"\n{number} {ticks}\n" in tree.read_text()
    leader = strangers.spawn_at(number, comm="other", uid=os.geteuid(), mode="family")
    assert leader == number and start_time(leader) != ticks
    deadline = time.monotonic() + 5
    while not (members := children_of(leader)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    strangers.started.append((members[0], start_time(members[0])))
    recorder.scan()
    lines = tree.read_text().splitlines()[1:]
    assert f"{number} {ticks}" in lines
    assert not {line.split()[0] for line in lines} & {str(members[0])}
    assert f"{number} {start_time(leader)}" not in lines
    assert parse_tree(tree.read_bytes()).boot_id == BOOT
