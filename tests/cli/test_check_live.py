"""``cleanslate check`` against real processes that each test starts and ends by PID.

Each test names the findings of *its own* processes (by PID): other software on a developer's
machine may be running, so only the tests that need a CLEAN verdict narrow the scope with
``--engine`` to a signature no one else uses here.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, run_cli

PRCTL_RENAME = (
    "import ctypes, os, sys, time\n"
    "ctypes.CDLL(None).prctl(15, os.environ['RENAME_TO'].encode(), 0, 0, 0)\n"
    "open(sys.argv[1], 'w').close()\n"
    "time.sleep(float(sys.argv[2]))\n"
)


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def _findings(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in doc["hosts"][0]["findings"] if f["kind"] == kind]


def _renamed(procs: Processes, tmp_path: Path, name: str, seconds: float) -> int:
    ready = tmp_path / f"ready-{uuid.uuid4().hex}"
    # The new name travels in the environment so that the cmdline stays innocent.
    proc = procs.python(PRCTL_RENAME, str(ready), str(seconds),
                        env={**os.environ, "RENAME_TO": name})
    _wait_for(ready)
    return proc.pid


def test_this_machine_with_no_server_is_clean() -> None:
    """The README's promise on a fresh CPU-only machine: CLEAN, exit 0. In CI nothing else runs,
    so this also catches a test that left a process behind; on a developer's machine other
    work may be running, and the test then only checks that the verdict is explained."""
    result = run_cli("check")
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 and not os.environ.get("CI"):
        assert lines[-1] in ("DIRTY", "UNKNOWN")
        pytest.skip("this developer machine is busy: " + " ".join(lines[-4:]))
    assert result.returncode == 0, result.stdout
    assert lines[-1] == "CLEAN"


def test_json_is_the_only_stdout(cli: Any) -> None:
    result = cli("check", "--gpu-backend", "none", "--json")
    doc = result.json()  # the whole of stdout parses as one document
    assert set(doc) >= {"verdict", "checked_at", "elapsed_s", "hosts"}
    assert doc["verdict"] in {"clean", "dirty", "unknown"}
    assert result.returncode == {"clean": 0, "dirty": 1, "unknown": 3}[doc["verdict"]]
    host = doc["hosts"][0]
    assert set(host) >= {"host", "verdict", "gpu_backend", "gpus", "findings"}
    assert host["gpu_backend"] == "none"


def test_engine_cmdline_is_a_stray(procs: Processes) -> None:
    proc = procs.python("import time; time.sleep(60)", "-m", "sglang.launch_server")
    time.sleep(0.3)
    result = run_cli("check", "--gpu-backend", "none", "--json")
    assert result.returncode == 1
    strays = {f["pid"]: f for f in _findings(result.json(), "stray_process")}
    assert proc.pid in strays
    assert strays[proc.pid]["severity"] == "error"
    assert strays[proc.pid]["evidence"]["engine"] == "sglang"


def test_renamed_worker_with_innocent_cmdline_is_found(procs: Processes, tmp_path: Path) -> None:
    pid = _renamed(procs, tmp_path, "sglang::scheduler_TP0", 60)
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "sglang::schedul"
    result = run_cli("check", "--gpu-backend", "none", "--json")
    strays = {f["pid"]: f for f in _findings(result.json(), "stray_process")}
    assert pid in strays, result.stdout
    assert strays[pid]["evidence"]["comm"] == "sglang::schedul"
    assert "sglang" not in " ".join(strays[pid]["evidence"]["cmdline"])
    assert result.returncode == 1
    human = run_cli("check", "--gpu-backend", "none")
    assert str(pid) in human.stdout
    assert human.stdout.strip().splitlines()[-1] == "DIRTY"


def test_zombie(procs: Processes, tmp_path: Path) -> None:
    # The parent forks a child that renames itself and exits; the parent never reaps it.
    ready = tmp_path / "zombie-pid"
    code = (
        "import ctypes, os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ctypes.CDLL(None).prctl(15, b'VLLM::Worker', 0, 0, 0)\n"
        "    os._exit(0)\n"
        "open(sys.argv[1], 'w').write(str(pid))\n"
        "time.sleep(60)\n"
    )
    procs.python(code, str(ready))
    _wait_for(ready)
    time.sleep(0.2)
    child = int(ready.read_text())
    assert Path(f"/proc/{child}/stat").read_text().split(")")[1].split()[0] == "Z"
    result = run_cli("check", "--gpu-backend", "none", "--json")
    zombies = {f["pid"]: f for f in _findings(result.json(), "zombie")}
    # It exited: it holds no memory, port or device, so it is shown but does not make the host
    # dirty (a zombie leader whose threads still run would: see tests/verdict).
    assert zombies[child]["severity"] == "warning"
    assert "not reaped by its parent" in zombies[child]["message"]


def test_port_in_use_names_the_owner(procs: Processes, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = tmp_path / "listening"
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "open(sys.argv[2], 'w').close(); time.sleep(60)\n"
    )
    owner = procs.python(code, str(port), str(ready))
    _wait_for(ready)
    result = run_cli("check", "--gpu-backend", "none", "--port", str(port), "--json")
    found = _findings(result.json(), "port_in_use")
    assert len(found) == 1
    assert found[0]["port"] == port
    assert found[0]["pid"] == owner.pid
    assert found[0]["evidence"]["pids"] == [owner.pid]
    assert result.returncode == 1
    # A free port in scope is no finding.
    owner.kill()
    owner.wait()
    again = run_cli("check", "--gpu-backend", "none", "--port", str(port), "--json")
    assert _findings(again.json(), "port_in_use") == []


def test_shm_leftover(tmp_path: Path) -> None:
    path = Path("/dev/shm") / f"nccl-cleanslate-test-{uuid.uuid4().hex[:8]}"
    path.write_bytes(b"\0" * 4096)
    try:
        result = run_cli("check", "--gpu-backend", "none", "--engine", "llamacpp", "--json")
        found = [f for f in _findings(result.json(), "shm_leftover")
                 if f["evidence"]["name"] == path.name]
        assert len(found) == 1
        assert found[0]["severity"] == "warning"
        assert found[0]["evidence"]["size_bytes"] == 4096
        strict = run_cli("check", "--gpu-backend", "none", "--engine", "llamacpp", "--strict",
                         "--json")
        assert strict.returncode == 1
        # A baseline taken with the file present accepts it.
        base = tmp_path / "baseline.json"
        saved = run_cli("check", "--gpu-backend", "none", "--save-baseline", str(base), "--json")
        assert saved.returncode in (0, 1, 3)
        with_base = run_cli("check", "--gpu-backend", "none", "--baseline", str(base), "--json")
        assert not [f for f in _findings(with_base.json(), "shm_leftover")
                    if f["evidence"]["name"] == path.name]
    finally:
        path.unlink(missing_ok=True)


def test_checker_never_reports_itself_or_its_children(tmp_path: Path) -> None:
    # A checker whose own name looks like an engine worker: it must not find itself, nor the
    # collector it starts.
    code = (
        "import ctypes, sys\n"
        "ctypes.CDLL(None).prctl(15, b'sglang::checker', 0, 0, 0)\n"
        "from cleanslate.cli import main\n"
        "sys.argv = ['cleanslate', 'check', '--gpu-backend', 'none', '--engine', 'sglang',"
        " '--json']\n"
        "main()\n"
    )
    import subprocess

    done = subprocess.run([sys.executable, "-c", code, "-m", "sglang.fake"], capture_output=True,
                          text=True, timeout=60, check=False)
    doc = __import__("json").loads(done.stdout)
    own = {f["pid"] for f in doc["hosts"][0]["findings"]}
    for finding in doc["hosts"][0]["findings"]:
        assert "sglang::checker" not in str(finding["evidence"].get("comm")), finding
    assert os.getpid() not in own


@pytest.mark.quiet_host  # CLEAN is asserted: another run's marked process would make it DIRTY
def test_until_clean_returns_when_the_stray_exits(procs: Processes, tmp_path: Path) -> None:
    _renamed(procs, tmp_path, "llama-server", 1.0)
    started = time.monotonic()  # the stray has about 1 s left from here
    result = run_cli("check", "--gpu-backend", "none", "--engine", "llamacpp", "--until-clean",
                     "--deadline", "5", "--interval", "0.2", "--json")
    elapsed = time.monotonic() - started
    doc = result.json()
    assert result.returncode == 0, result.stdout
    assert doc["verdict"] == "clean"
    # The checker itself starts 0.3-0.9 s after `started` (interpreter start, more on a loaded
    # machine); the stray exits ~1 s after `started`. What must hold: it waited for the exit and
    # did not run to the 5 s deadline.
    assert doc["until_clean"]["clean_after_s"] <= 2.0
    assert 0.9 <= elapsed < 4


def test_until_clean_fails_at_the_deadline_naming_the_stray(
    procs: Processes, tmp_path: Path
) -> None:
    pid = _renamed(procs, tmp_path, "llama-server", 60)
    started = time.monotonic()
    result = run_cli("check", "--gpu-backend", "none", "--engine", "llamacpp", "--until-clean",
                     "--deadline", "2", "--interval", "0.2")
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert str(pid) in result.stdout
    assert "DIRTY at the 2 s deadline" in result.stdout
    assert elapsed < 6


def _stand_in(tmp_path: Path, name: str, body: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def test_hanging_nvidia_smi_is_unknown_within_the_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pid"
    env = _stand_in(tmp_path, "nvidia-smi", f"echo $$ > {pidfile}\nexec sleep 600\n")
    env["CLEANSLATE_SIM_GPU_DIR"] = ""
    started = time.monotonic()
    result = run_cli("check", "--gpu-backend", "nvidia-smi", "--engine", "llamacpp",
                     "--timeout", "2", "--json", env=env)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stdout + result.stderr
    doc = result.json()
    assert doc["verdict"] == "unknown"
    errors = _findings(doc, "probe_error")
    assert any(f["severity"] == "unknown" and "nvidia-smi" in f["message"] for f in errors)
    assert elapsed < 8
    hung = int(pidfile.read_text())
    assert not Path(f"/proc/{hung}").exists(), "the hanging nvidia-smi was left running"


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--gpus", "0,x"], "--gpus"),
        (["--gpu-backend", "cuda"], "--gpu-backend"),
        (["--engine", "sglangx"], "--engine"),
        (["--deadline", "0", "--until-clean"], "--deadline"),
    ],
)
def test_bad_input_exits_2_without_traceback(args: list[str], where: str) -> None:
    result = run_cli("check", *args)
    assert result.returncode == 2
    assert where in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_baseline_file(tmp_path: Path) -> None:
    bad = tmp_path / "b.json"
    bad.write_text("{\n  \"host\": 1,\n")
    result = run_cli("check", "--baseline", str(bad))
    assert result.returncode == 2
    assert f"{bad}:3" in result.stderr
    missing = run_cli("check", "--baseline", str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert "--save-baseline" in missing.stderr
