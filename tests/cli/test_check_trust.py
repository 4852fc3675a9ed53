"""``cleanslate check`` against the false-CLEAN and bad-input reproductions of issue 12.

Each test names the findings of *its own* processes (by PID or port): other software on a
developer's machine may be running, so a test asserts that its stray is reported, or that the
verdict is not CLEAN, never that the whole host is clean.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from cleanslate.store import RunRecord, Store
from tests._kit import free_port
from tests.conftest import Processes, run_cli

#: Listens on a port, then sleeps. argv[1]: port, argv[2]: a file to create when listening.
LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "open(sys.argv[2], 'w').close(); time.sleep(120)\n"
)

#: A stray that hides: it starts as an SGLang launcher with a run marker, then renames itself,
#: rewrites its argv and environment by re-executing an innocent listener without the marker.
HIDING_STRAY = (
    "import os, sys\n"
    "env = {k: v for k, v in os.environ.items() if k != 'CLEANSLATE_RUN'}\n"
    "os.execve(sys.executable, [sys.executable, '-c', os.environ['LISTENER_CODE'],"
    " sys.argv[1], sys.argv[2]], env)\n"
)


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def _findings(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in doc["hosts"][0]["findings"] if f["kind"] == kind]


def _listener(procs: Processes, tmp_path: Path, port: int) -> int:
    ready = tmp_path / f"listening-{uuid.uuid4().hex}"
    proc = procs.python(LISTENER, str(port), str(ready))
    _wait_for(ready)
    return proc.pid


def _hiding_stray(procs: Processes, tmp_path: Path, port: int) -> int:
    ready = tmp_path / f"listening-{uuid.uuid4().hex}"
    proc = procs.start(
        [sys.executable, "-c", HIDING_STRAY, str(port), str(ready), "-m", "sglang.launch_server"],
        env={**os.environ, "CLEANSLATE_RUN": f"r-hiding-{uuid.uuid4().hex[:6]}",
             "LISTENER_CODE": LISTENER})
    _wait_for(ready)
    # It is what it says it is now: an innocent python, no marker, no engine argv.
    assert b"CLEANSLATE_RUN" not in Path(f"/proc/{proc.pid}/environ").read_bytes()
    assert b"sglang" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    return proc.pid


def _store_with_run(tmp_path: Path, port: int) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = f"r-test-{uuid.uuid4().hex[:6]}"
    Store(url).save_run(RunRecord(
        id=run_id, host="local", engine="sglang", model="m", argv=("sglang",),
        marker=run_id, port=port, url=f"http://127.0.0.1:{port}",
        log_path=str(tmp_path / "log"), artifacts_dir=str(tmp_path), status="stopped"))
    return url, run_id


# --- --until-clean and a respawning stray ---------------------------------------------------

RESPAWN_LLAMA = (
    "import os, subprocess, sys, time\n"
    "child = ('import ctypes, os, time\\n'\n"
    "         'ctypes.CDLL(None).prctl(15, os.environ[\"NAME\"].encode(), 0, 0, 0)\\n'\n"
    "         'time.sleep(0.2)\\n')\n"
    "while True:\n"
    "    subprocess.run([sys.executable, '-c', child])\n"
    "    time.sleep(0.15)\n"
)


def test_until_clean_does_not_accept_a_respawned_stray(procs: Processes) -> None:
    """A parent with an innocent name restarts an engine-looking child (comm ``llama-server``)
    every ~0.35 s: the first clean reading was reported CLEAN."""
    procs.python(RESPAWN_LLAMA, env={**os.environ, "NAME": "llama-server"})
    time.sleep(0.5)
    args = ("check", "--gpu-backend", "none", "--engine", "llamacpp", "--until-clean",
            "--deadline", "5", "--interval", "0.2")
    result = run_cli(*args, "--json")
    doc = result.json()
    assert doc["verdict"] == "dirty" and result.returncode == 1, doc["until_clean"]
    assert doc["until_clean"]["clean_after_s"] is None
    strays = [f for f in _findings(doc, "stray_process") + _findings(doc, "respawned")
              if f["evidence"].get("comm") == "llama-server"]
    assert strays, doc["hosts"][0]["findings"]
    human = run_cli(*args)
    assert human.stdout.strip().splitlines()[-1].startswith("DIRTY")
    assert "Traceback" not in human.stderr


# --- ports: engines' defaults, recorded runs, baselines --------------------------------------


def test_a_renamed_reexeced_listener_on_a_recorded_port_is_dirty(
    procs: Processes, tmp_path: Path
) -> None:
    """The issue's reproduction: renamed, argv rewritten, re-exec'd without CLEANSLATE_RUN,
    listening on the port of a run recorded in the store. Plain ``check`` looked at no port."""
    port = free_port()
    url, run_id = _store_with_run(tmp_path, port)
    pid = _hiding_stray(procs, tmp_path, port)
    result = run_cli("check", "--gpu-backend", "none", "--store", url, "--json")
    assert result.returncode == 1, result.stderr
    found = [f for f in _findings(result.json(), "port_in_use") if f["port"] == port]
    assert len(found) == 1 and found[0]["pid"] == pid
    assert run_id in found[0]["message"] and found[0]["severity"] == "error"
    human = run_cli("check", "--gpu-backend", "none", "--store", url)
    assert str(port) in human.stdout and human.stdout.strip().splitlines()[-1] == "DIRTY"
    # With --no-default-ports, no one asked about this port: it is not looked at.
    bare = run_cli("check", "--gpu-backend", "none", "--store", url, "--no-default-ports",
                   "--json")
    assert not [f for f in _findings(bare.json(), "port_in_use") if f["port"] == port]


def test_a_listener_on_an_engine_default_port(procs: Processes, tmp_path: Path) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 8080))
        except OSError:
            pytest.skip("port 8080 (llama.cpp's default) is in use on this machine")
    pid = _listener(procs, tmp_path, 8080)
    result = run_cli("check", "--gpu-backend", "none", "--engine", "llamacpp", "--json")
    found = [f for f in _findings(result.json(), "port_in_use") if f["port"] == 8080]
    assert found and found[0]["pid"] == pid and result.returncode == 1
    assert "default port of llamacpp" in found[0]["message"]
    # vLLM's default is 8000: 8080 is not in its scope.
    other = run_cli("check", "--gpu-backend", "none", "--engine", "vllm", "--json")
    assert not [f for f in _findings(other.json(), "port_in_use") if f["port"] == 8080]


def test_baseline_reports_new_listeners_and_processes(procs: Processes, tmp_path: Path) -> None:
    old_port, new_port = free_port(), free_port()
    old = _listener(procs, tmp_path, old_port)
    base = tmp_path / "baseline.json"
    saved = run_cli("check", "--gpu-backend", "none", "--save-baseline", str(base), "--json")
    assert saved.returncode in (0, 1, 3), saved.stderr
    doc = json.loads(base.read_text())
    assert doc["version"] == 2 and doc["boot_id"]
    assert any(entry["port"] == old_port for entry in doc["listeners"])
    assert any(pid == old for pid, _ in doc["processes"])

    new = _hiding_stray(procs, tmp_path, new_port)
    result = run_cli("check", "--gpu-backend", "none", "--baseline", str(base), "--json")
    assert result.returncode == 1
    listeners = {f["port"]: f for f in _findings(result.json(), "new_listener")}
    assert new_port in listeners and listeners[new_port]["pid"] == new
    assert listeners[new_port]["severity"] == "error"
    assert old_port not in listeners  # there at the baseline
    processes = {f["pid"]: f for f in _findings(result.json(), "new_process")}
    assert new in processes and processes[new]["severity"] == "warning"
    assert old not in processes


def test_an_old_baseline_still_loads(tmp_path: Path) -> None:
    base = tmp_path / "v1.json"
    base.write_text(json.dumps({"version": 1, "host": "local", "saved_at": "2026-01-01T00:00:00Z",
                                "gpu_backend": "none", "gpus": [], "device_holders": [],
                                "shm": [], "kmsg_last_us": None}))
    result = run_cli("check", "--gpu-backend", "none", "--baseline", str(base), "--json")
    assert result.returncode in (0, 1, 3), result.stderr
    notes = [f["message"] for f in _findings(result.json(), "probe_error")]
    assert any("older format" in n for n in notes), notes


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_a_port_out_of_range_is_refused(port: str) -> None:
    result = run_cli("check", "--gpu-backend", "none", "--port", port)
    assert result.returncode == 2
    assert "--port" in result.stderr and "Traceback" not in result.stderr


def test_check_never_creates_a_store(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLEANSLATE_STORE"}

    def check(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cleanslate", "check", "--gpu-backend",
                               "none", "--json", *args], cwd=tmp_path, env={**env, **extra},
                              capture_output=True, text=True, timeout=60, check=False)

    assert check().returncode in (0, 1, 3)
    assert check(CLEANSLATE_STORE=f"sqlite:///{tmp_path / 'env.db'}").returncode in (0, 1, 3)
    named = check("--store", str(tmp_path / "named.db"))
    assert named.returncode == 2 and "no store" in named.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- bad input: exit 2 with the reason, never a traceback ------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe{\"host\": 1}", "not UTF-8"),
        (b"[" * 100_000, "not JSON"),
        (b"[1, 2]", "not a cleanslate baseline"),
        (b"{\"version\": 99, \"host\": \"h\", \"saved_at\": \"x\", \"gpu_backend\": \"none\"}",
         "newer"),
        (b"", "not JSON"),
    ],
    ids=["latin1", "deep", "list", "future", "empty"],
)
def test_a_bad_baseline_file_exits_2(tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "b.json"
    bad.write_bytes(content)
    result = run_cli("check", "--gpu-backend", "none", "--baseline", str(bad))
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and str(bad) in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unwritable_save_baseline_exits_2(tmp_path: Path) -> None:
    cases = [tmp_path, tmp_path / "missing" / "b.json"]
    if os.geteuid() == 0 and Path("/sys/kernel").is_dir():
        cases.append(Path("/sys/kernel/cleanslate-baseline.json"))  # not writable, even by root
    for path in cases:
        result = run_cli("check", "--gpu-backend", "none", "--save-baseline", str(path))
        assert result.returncode == 2, (path, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        assert str(path) in result.stderr or str(path.parent) in result.stderr


def test_a_read_only_folder_for_save_baseline_exits_2(tmp_path: Path) -> None:
    """A read-only file system (root ignores a folder's mode bits, not a read-only mount)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare for a private read-only mount")
    folder = tmp_path / "ro"
    folder.mkdir()
    script = (f"mount -t tmpfs -o ro none {folder} && exec {sys.executable} -m cleanslate check "
              f"--gpu-backend none --save-baseline {folder}/b.json")
    done = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60, check=False)
    if "mount:" in done.stderr:
        pytest.skip(f"cannot mount here: {done.stderr.strip()[:200]}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "b.json" in done.stderr


def test_a_baseline_path_with_markup_is_printed_as_text(tmp_path: Path) -> None:
    (tmp_path / "[").mkdir()
    path = tmp_path / "[" / "x] [bold]b.json"  # the path reads ".../[/x] [bold]b.json"
    assert "[/x]" in str(path)
    result = run_cli("check", "--gpu-backend", "none", "--save-baseline", str(path))
    assert result.returncode in (0, 1, 3), result.stderr
    assert "Traceback" not in result.stderr
    assert f"saved to {path}" in " ".join(result.stderr.split())
    assert path.exists()


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--settle", "-1"], "--settle"),
        (["--settle", "nan"], "--settle"),
        (["--deadline", "inf"], "--deadline"),
        (["--timeout", "nan"], "--timeout"),
        (["--tolerance-mib", "-5"], "--tolerance-mib"),
    ],
)
def test_bad_numbers_exit_2(args: list[str], where: str) -> None:
    result = run_cli("check", "--gpu-backend", "none", "--until-clean", *args)
    assert result.returncode == 2, result.stderr
    assert where in result.stderr and "Traceback" not in result.stderr
