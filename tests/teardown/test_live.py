"""Teardown scope with real processes and the real CLI.

- a process that only shares a recorded run's process group and session numbers (PID reuse, a
  shared store) survives ``cleanslate stop`` of that run;
- a record from another boot or another machine signals nothing (and says so);
- ``clean --pid 1`` and ``clean --pid $$`` are refused, run inside a private PID namespace where
  PID 1 and the shell are this test's own processes;
- a grandchild that double-forks, calls ``setsid``, renames itself and re-executes without the
  run's marker is still found through the run's cgroup, and without one through the tree its
  supervisor recorded; without cgroups a run still ends CLEAN;
- command lines with rich markup (``[/x]``, ``[bold]``) are printed as text.

Every process signalled here is one this test started (by PID) or one ``cleanslate`` ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.store import RunRecord, Store
from tests.conftest import CliResult, Processes, recorded_rows, run_cli

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def wait_for(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def host_ids() -> tuple[str, str]:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    machine = Path("/etc/machine-id").read_text().strip()
    return boot, machine


def create_time(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).create_time())


class Lab:
    """One test's store, simulated GPU ledger and CLI environment."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = f"sqlite:///{root}/cs.db"
        self.env = {"CLEANSLATE_SIM_GPU_DIR": str(root / "gpus")}
        (root / "gpus").mkdir()

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
            ) -> CliResult:
        return run_cli(*args, env={**self.env, **(env or {})}, timeout=timeout)

    def stop(self, run_id: str, *extra: str) -> CliResult:
        return self.cli("stop", run_id, "--store", self.store, "--deadline", "20",
                        "--gpu-backend", "sim", "--grace", "3", *extra)

    def record(self, **fields: Any) -> RunRecord:
        """Store a fabricated run record (as another controller, or another host, left it)."""
        port = free_port()
        values: dict[str, Any] = dict(
            id="r-20200101-000000-dead", host="local", engine="sim", model="sim", argv=(),
            marker="r-20200101-000000-dead", port=port, url=f"http://127.0.0.1:{port}",
            log_path=str(self.root / "none.log"), artifacts_dir=str(self.root),
            status="ready")
        values.update(fields)
        run = RunRecord(**values)
        store = Store(self.store)
        store.save_run(run)
        store.close()
        return run

    def run(self, run_id: str) -> RunRecord:
        store = Store(self.store)
        try:
            return store.get_run(run_id)
        finally:
            store.close()

    def runs(self) -> list[dict[str, Any]]:
        return recorded_rows(self.root / "cs.db")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    yield lab
    for run in lab.runs():
        if run["status"] in ("starting", "ready") and not run["id"].startswith("r-2020"):
            lab.stop(run["id"], "--json")


def sleeper(procs: Processes, *argv: str) -> subprocess.Popen[bytes]:
    """A process in a session (and group) of its own, like any daemon started with setsid."""
    proc = procs.python("import time; time.sleep(120)", *argv, start_new_session=True)
    assert wait_for(lambda: create_time(proc.pid) > 0, 5)
    return proc


# -- group and session numbers ------------------------------------------------------------------


def test_unrelated_setsid_process_with_a_runs_numbers_survives_stop(
    lab: Lab, procs: Processes
) -> None:
    """PID reuse: the recorded run's group and session numbers now belong to an unrelated
    process started after the run (``stop OLD_RUN`` and a ``tune`` rerun used to kill it)."""
    stranger = sleeper(procs)
    boot, machine = host_ids()
    started = create_time(stranger.pid)
    run = lab.record(pid=stranger.pid, create_time=started - 3600.0, pgid=stranger.pid,
                     sid=stranger.pid, supervisor_pid=stranger.pid,
                     supervisor_create_time=started - 3600.0, started_at=started - 60.0,
                     boot_id=boot, machine_id=machine)
    stopped = lab.stop(run.id, "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    assert stranger.pid not in {t["pid"] for t in report["targets"]}
    assert report["rounds"] == []
    time.sleep(0.3)
    assert alive(stranger.pid)
    assert stranger.poll() is None


def test_record_from_another_boot_signals_nothing(lab: Lab, procs: Processes) -> None:
    """Even a record whose PID and start time match a live process: another boot's PIDs name
    nothing on this one. The host is verified and the record closed."""
    bystander = sleeper(procs)
    _boot, machine = host_ids()
    run = lab.record(pid=bystander.pid, create_time=create_time(bystander.pid),
                     pgid=bystander.pid, sid=bystander.pid,
                     started_at=create_time(bystander.pid) - 1.0,
                     boot_id="00000000-0000-0000-0000-000000000000", machine_id=machine)
    stopped = lab.stop(run.id, "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    assert "rebooted" in report["refused"] and report["targets"] == []
    assert report["verify"]["verdict"] == "clean"
    assert alive(bystander.pid)
    after = lab.run(run.id)
    assert after.status == "stopped" and after.cause == "host_rebooted"
    text = lab.stop(run.id)  # the plain output says it too
    assert "nothing signalled" in text.stdout and "rebooted" in text.stdout
    assert alive(bystander.pid)


def test_record_from_another_machine_is_refused(lab: Lab, procs: Processes) -> None:
    bystander = sleeper(procs)
    boot, _machine = host_ids()
    run = lab.record(pid=bystander.pid, create_time=create_time(bystander.pid),
                     pgid=bystander.pid, sid=bystander.pid,
                     started_at=create_time(bystander.pid) - 1.0, boot_id=boot,
                     machine_id="0123456789abcdef0123456789abcdef")
    stopped = lab.stop(run.id)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    assert "0123456789abcdef0123456789abcdef" in stopped.stdout + stopped.stderr
    assert "refused" in stopped.stderr
    assert alive(bystander.pid)
    assert lab.run(run.id).status == "ready"  # it may be running there: left as it is


# -- never selected -----------------------------------------------------------------------------


def in_pid_namespace(script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c SCRIPT`` as PID 1 of a new PID namespace (with its own /proc)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (util-linux) for a private PID namespace")
    env = {**os.environ, "PY": sys.executable}
    return subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def test_clean_pid_1_is_refused() -> None:
    done = in_pid_namespace(
        '"$PY" -m cleanslate clean --pid 1 --yes --gpu-backend none --deadline 5 --grace 1; '
        'echo "rc=$?"')
    assert "rc=2" in done.stdout, done.stdout + done.stderr
    assert "refusing to end PID 1" in done.stderr and "PID 1 (init)" in done.stderr


def test_clean_pid_of_the_calling_shell_is_refused() -> None:
    # The outer shell is PID 1; the inner one runs cleanslate and names itself with $$.
    done = in_pid_namespace(
        "sh -c '\"$PY\" -m cleanslate clean --pid $$ --yes --gpu-backend none --deadline 5 "
        "--grace 1; echo \"rc=$?\"'; echo outer-alive")
    assert "rc=2" in done.stdout, done.stdout + done.stderr
    assert "outer-alive" in done.stdout
    assert "an ancestor of this cleanslate process" in done.stderr


def test_clean_pid_of_a_job_in_the_callers_session_is_refused() -> None:
    # setsid: a session whose leader is inside the namespace (else it reads as session 0).
    done = in_pid_namespace(
        "setsid -w sh -c 'sleep 60 & \"$PY\" -m cleanslate clean --pid $! --yes "
        "--gpu-backend none --deadline 5 --grace 1; echo \"rc=$?\"; kill $!'")
    assert "rc=2" in done.stdout, done.stdout + done.stderr
    assert "session" in done.stderr


# -- cgroups ------------------------------------------------------------------------------------


def serve_file(lab: Lab, config: dict[str, Any], *extra: str,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    path = lab.root / "server.yaml"
    path.write_text(json.dumps(config))
    result = lab.cli("serve", str(path), "--store", lab.store, "--detach", "--json",
                     "--gpu-backend", "sim", *extra, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(result.json())


def test_cgroup_finds_a_ghost_that_left_every_other_link(lab: Lab) -> None:
    pidfile = lab.root / "ghost.pid"
    port = free_port()
    doc = serve_file(lab, {
        "engine": "command", "model": "sim", "port": port, "ready_timeout_s": 60,
        "smoke_timeout_s": 10,
        "argv": [sys.executable, str(HERE / "_ghost_server.py"), str(pidfile), sys.executable,
                 "-m", "cleanslate.sim", "serve", "--port", "{port}", "--model-path",
                 "{model}"]})
    if doc["cgroup"] is None:
        pytest.skip(f"this host gives runs no cgroup: {doc['cgroup_note']}")
    ghost = int(pidfile.read_text())
    assert alive(ghost)
    fields = stat(ghost)
    assert fields is not None
    assert int(fields[2]) == int(fields[3])  # a session (and group) of its own, not the run's
    assert int(fields[2]) not in (doc["pgid"], doc["supervisor_pid"], doc["pid"])
    assert Path(f"/proc/{ghost}/environ").read_bytes() == b""  # no marker
    assert Path(f"/proc/{ghost}/cmdline").read_bytes().startswith(b"innocent-looking")
    assert str(ghost) in Path(doc["cgroup"], "cgroup.procs").read_text().split()
    # The naive kill: supervisor and server SIGKILLed; the ghost is re-parented to PID 1.
    os.kill(doc["supervisor_pid"], signal.SIGKILL)
    os.kill(doc["pid"], signal.SIGKILL)
    assert wait_for(lambda: not alive(doc["pid"]), 10)
    assert alive(ghost)
    stopped = lab.stop(doc["run_id"], "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    whys = {t["pid"]: t["why"] for t in report["targets"]}
    assert whys.get(ghost) == "cgroup", report["targets"]
    assert report["cgroup"] == doc["cgroup"] and report["cgroup_removed"]
    assert report["verify"]["verdict"] == "clean"
    assert not alive(ghost)
    assert not Path(doc["cgroup"]).exists()
    assert {t["user"] for t in report["targets"]} == {"root"}


def test_without_a_cgroup_the_recorded_tree_finds_the_ghost(lab: Lab) -> None:
    """Issue 35: the same ghost, ``CLEANSLATE_CGROUP=0``: no cgroup, the group and session
    numbers select nothing, and the ghost is found through the tree its supervisor recorded
    (``tree.txt``), after the supervisor and the server are SIGKILLed."""
    pidfile = lab.root / "ghost.pid"
    port = free_port()
    doc = serve_file(lab, {
        "engine": "command", "model": "sim", "port": port, "ready_timeout_s": 60,
        "smoke_timeout_s": 10,
        "argv": [sys.executable, str(HERE / "_ghost_server.py"), str(pidfile), sys.executable,
                 "-m", "cleanslate.sim", "serve", "--port", "{port}", "--model-path",
                 "{model}"]}, env={"CLEANSLATE_CGROUP": "0"})
    assert doc["cgroup"] is None
    ghost = int(pidfile.read_text())
    tree = Path(lab.run(doc["run_id"]).artifacts_dir, "tree.txt")
    assert wait_for(lambda: f"\n{ghost} " in tree.read_text(), 5)
    os.kill(doc["supervisor_pid"], signal.SIGKILL)
    os.kill(doc["pid"], signal.SIGKILL)
    assert wait_for(lambda: not alive(doc["pid"]), 10)
    assert alive(ghost)
    stopped = lab.stop(doc["run_id"], "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    whys = {t["pid"]: t["why"] for t in report["targets"]}
    assert whys.get(ghost) == "recorded", report["targets"]
    assert report["verify"]["verdict"] == "clean"
    assert not alive(ghost)


def test_without_cgroups_a_run_still_ends_clean(lab: Lab) -> None:
    """``CLEANSLATE_CGROUP=0``: no cgroup, the reason recorded, and teardown by the recorded
    PIDs, the marker and the tree the supervisor recorded (group numbers select nothing)."""
    doc = serve_file(lab, {"engine": "sim", "model": "sim", "port": free_port(),
                           "ready_timeout_s": 60, "flags": {"tp-size": 2}},
                     env={"CLEANSLATE_CGROUP": "0"})
    assert doc["cgroup"] is None and "CLEANSLATE_CGROUP=0" in doc["cgroup_note"]
    assert lab.run(doc["run_id"]).cgroup is None
    os.kill(doc["pid"], signal.SIGKILL)  # the workers are orphaned
    stopped = lab.stop(doc["run_id"], "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    assert report["cgroup"] is None and not report["cgroup_killed"]
    workers = [t for t in report["targets"] if t["comm"].startswith("sim::")]
    assert len(workers) == 2 and all(not alive(t["pid"]) for t in workers)
    assert report["verify"]["verdict"] == "clean"


# -- external text ------------------------------------------------------------------------------


def test_markup_in_command_lines_is_printed_as_text(lab: Lab, procs: Processes) -> None:
    """An argv with ``[/x]`` crashed ``clean --engine``, ``clean --pid`` and ``serve`` (rich
    MarkupError): any local user could make a process unremovable."""
    odd = sleeper(procs, "-m", "cleanslate.sim", "[/x]", "[bold]")
    for args in (("--pid", str(odd.pid)), ("--engine", "sim")):
        listed = lab.cli("clean", *args, "--gpu-backend", "none")  # stdin is not a TTY
        assert listed.returncode == 2, listed.stdout + listed.stderr
        assert "[/x] [bold]" in listed.stdout and "--yes" in listed.stderr
        assert "Traceback" not in listed.stderr
    ended = lab.cli("clean", "--pid", str(odd.pid), "--yes", "--gpu-backend", "none",
                    "--deadline", "10", "--grace", "2")
    assert ended.returncode == 0, ended.stdout + ended.stderr
    assert "[/x] [bold]" in ended.stdout
    assert odd.wait(timeout=10) is not None

    served = lab.cli("serve", "--engine", "sim", "--model", "sim", "--port", str(free_port()),
                     "--store", lab.store, "--detach", "--gpu-backend", "sim", "--",
                     "--log-level", "[/x][bold]")
    assert served.returncode == 0, served.stdout + served.stderr
    assert "--log-level [/x][bold]" in served.stdout
    run_id = next(r["id"] for r in lab.runs())
    stopped = lab.stop(run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "[/x][bold]" in stopped.stdout and "Traceback" not in stopped.stderr
