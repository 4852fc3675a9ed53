"""``serve`` / ``stop`` / ``clean`` with the simulated engine: every fault ends right.

Each test runs the CLI as a user would, against its own store, ledger and free ports; a
finalizer stops (by the recorded PIDs, through ``cleanslate stop``) any run a failing test left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._kit import alive, free_port
from tests.conftest import Processes, run_cli
from tests.launch.conftest import Lab, served

pytestmark = pytest.mark.slow


def test_serve_ready_smoke_stop_clean(lab: Lab) -> None:
    port = free_port()
    doc = served(lab.serve(port))
    assert {"run_id", "url", "argv", "pid", "verdict_before"} <= set(doc)
    assert doc["verdict_before"]["verdict"] == "clean"
    assert doc["url"] == f"http://127.0.0.1:{port}"
    assert doc["smoke"]["passed"] is True
    dirty = lab.check("--port", str(port))
    assert dirty["verdict"] == "dirty"
    kinds = {f["kind"] for f in dirty["hosts"][0]["findings"]}
    assert {"stray_process", "gpu_memory_held", "gpu_process", "port_in_use"} <= kinds
    markers = {f["evidence"].get("run_marker") for f in dirty["hosts"][0]["findings"]}
    assert doc["run_id"] in markers
    stopped = lab.stop(doc["run_id"])
    report = stopped.json()
    assert stopped.returncode == 0, stopped.stdout
    assert report["verify"]["verdict"] == "clean"
    assert report["root_exit_s"] is not None  # SIGTERM was enough
    assert not alive(doc["pid"])
    assert lab.check("--port", str(port))["verdict"] == "clean"
    assert lab.runs()[0]["status"] == "stopped"


def test_oom_at_start(lab: Lab) -> None:
    result = lab.serve(free_port(), "--fault", "oom-at-start")
    assert result.returncode == 1
    doc = result.json()
    assert doc["cause"] == "oom"
    assert "OutOfMemoryError" in doc["log_tail"]
    assert "CUDA out of memory" in doc["detail"]
    assert doc["verdict_after"]["verdict"] == "clean"
    assert lab.runs()[0]["status"] == "failed"


def test_nan_fails_the_smoke_test(lab: Lab) -> None:
    result = lab.serve(free_port(), "--fault", "nan")
    assert result.returncode == 1
    doc = result.json()
    assert doc["cause"] == "nan"
    assert doc["verdict_after"]["verdict"] == "clean"


def test_hang_times_out_then_teardown_clean(lab: Lab) -> None:
    started = time.monotonic()
    result = lab.serve(free_port(), "--fault", "hang-after=0")
    assert result.returncode == 1
    doc = result.json()
    assert doc["cause"] == "timeout"
    assert doc["verdict_after"]["verdict"] == "clean"
    assert time.monotonic() - started < 60


def test_ignore_sigterm_escalates_to_sigkill(lab: Lab) -> None:
    doc = served(lab.serve(free_port(), "--fault", "ignore-sigterm"))
    stopped = lab.stop(doc["run_id"], "--grace", "2")
    report = stopped.json()
    assert stopped.returncode == 0, stopped.stdout
    assert report["killed"], "nothing needed SIGKILL"
    assert "SIGKILL" in [r["signal"] for r in report["rounds"]]
    assert report["verify"]["verdict"] == "clean"
    for pid in report["killed"]:
        assert not alive(pid)


def test_orphan_grandchild_found_by_marker_and_removed(lab: Lab) -> None:
    doc = served(lab.serve(free_port(), "--fault", "orphan-grandchild"))
    stopped = lab.stop(doc["run_id"], "--grace", "5")
    report = stopped.json()
    assert stopped.returncode == 0, stopped.stdout
    orphans = [t for t in report["targets"] if t["comm"].startswith("sim::grandchild")]
    assert orphans, report["targets"]
    assert orphans[0]["why"] in ("cgroup", "marker", "session", "descendant")
    assert report["verify"]["verdict"] == "clean"
    assert not alive(orphans[0]["pid"])


def test_slow_release_is_waited_for_and_reported(lab: Lab) -> None:
    doc = served(lab.serve(free_port(), "--fault", "slow-release=3"))
    stopped = lab.stop(doc["run_id"])
    report = stopped.json()
    assert stopped.returncode == 0
    until = report["verify"]["until_clean"]
    assert until["clean_after_s"] >= 2.0
    assert until["attempts"] > 1


def test_leave_port_is_port_in_use_until_the_orphan_is_gone(lab: Lab) -> None:
    port = free_port()
    doc = served(lab.serve(port, "--fault", f"leave-port={port}"))
    # A naive kill of the server: SIGTERM to its root process only.
    os.kill(doc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 15
    while alive(doc["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    found = lab.check("--port", str(port))
    ports = [f for f in found["hosts"][0]["findings"] if f["kind"] == "port_in_use"]
    assert ports and ports[0]["pid"] is not None
    holder = ports[0]["pid"]
    assert holder != doc["pid"]
    stopped = lab.stop(doc["run_id"])
    assert stopped.returncode == 0, stopped.stdout
    assert not alive(holder)
    assert not [f for f in lab.check("--port", str(port))["hosts"][0]["findings"]
                if f["kind"] == "port_in_use"]


def test_stop_leaves_unrelated_processes_and_clean_engine_refuses_without_yes(
    lab: Lab, procs: Processes
) -> None:
    doc = served(lab.serve(free_port()))
    # Started after the launch (the preflight would rightly refuse a host with it running), in
    # a session of its own: `clean` never ends members of its caller's session.
    bystander = procs.python("import time; time.sleep(120)", "-m", "sglang.launch_server",
                             start_new_session=True)
    assert lab.stop(doc["run_id"]).returncode == 0
    assert alive(bystander.pid)
    refused = run_cli("clean", "--engine", "sglang")  # stdin is not a TTY here
    assert refused.returncode == 2
    assert str(bystander.pid) in refused.stdout
    assert "--yes" in refused.stderr
    assert alive(bystander.pid)


def test_clean_pid_with_yes_ends_the_tree(procs: Processes, tmp_path: Path) -> None:
    ready = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            "open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(120)\n")
    parent = procs.python(code, str(ready), start_new_session=True)
    deadline = time.monotonic() + 10
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(ready.read_text())
    result = run_cli("clean", "--pid", str(parent.pid), "--yes", "--grace", "2",
                     "--gpu-backend", "none", "--deadline", "10", "--json")
    report = result.json()
    assert {t["pid"] for t in report["targets"]} == {parent.pid, child}
    assert not alive(child)
    parent.wait(timeout=10)


def test_port_taken_refuses_before_launch_naming_the_owner(
    lab: Lab, procs: Processes, tmp_path: Path
) -> None:
    port = free_port()
    ready = tmp_path / "listening"
    owner = procs.python(
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "open(sys.argv[2], 'w').close(); time.sleep(120)\n", str(port), str(ready))
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    result = lab.serve(port)
    assert result.returncode == 1
    doc = result.json()
    assert doc["cause"] == "host_not_clean"
    findings = doc["verdict_before"]["hosts"][0]["findings"]
    owners = [f["pid"] for f in findings if f["kind"] == "port_in_use"]
    assert owners == [owner.pid]
    assert lab.runs() == []  # nothing was launched


def _foreground(lab: Lab, procs: Processes, port: int, *engine_flags: str
                ) -> tuple[Any, dict[str, Any]]:
    """A foreground ``serve --json`` of the sim, and what its READY line on stderr says."""
    import subprocess

    proc = procs.start([sys.executable, "-m", "cleanslate", "serve", "--engine", "sim",
                        "--model", "sim", "--port", str(port), "--store", lab.store, "--json",
                        "--", "--tp-size", "1", *engine_flags], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env={**os.environ, **lab.env})
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode()
        if line.startswith("READY run "):
            words = line.split()
            return proc, {"run_id": words[2], "pid": int(words[4]), "url": words[6].rstrip(";")}
    raise AssertionError(f"no READY line; exit {proc.wait(timeout=60)}")


def test_foreground_serve_tears_down_on_sigterm(lab: Lab, procs: Processes) -> None:
    proc, ready = _foreground(lab, procs, free_port())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    doc = json.loads(out)  # one document, printed at the end
    assert doc["status"] == "stopped" and doc["cause"] is None
    assert doc["started"]["pid"] == ready["pid"] and doc["started"]["url"] == ready["url"]
    assert doc["teardown"]["verify"]["verdict"] == "clean"
    assert not alive(ready["pid"])


def test_foreground_serve_records_a_sigkilled_server_killed(lab: Lab, procs: Processes) -> None:
    proc, ready = _foreground(lab, procs, free_port())
    os.kill(ready["pid"], signal.SIGKILL)  # the server this test started, by PID
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    doc = json.loads(out)
    assert (doc["status"], doc["cause"]) == ("crashed", "killed")
    assert "SIGKILL" in doc["detail"]
    assert doc["teardown"]["verify"]["verdict"] == "clean"
    record = next(r for r in lab.runs() if r["id"] == ready["run_id"])
    assert (record["status"], record["cause"]) == ("crashed", "killed")


def test_foreground_serve_records_a_server_that_exits_0_by_itself_crashed(
        lab: Lab, procs: Processes) -> None:
    """vLLM's API server exits 0 after its engine core died (vllm PR #52178): exit 0 is not a
    stop that anyone asked for. The smoke test sends 8 requests; the 9th ends the server."""
    import urllib.request

    proc, ready = _foreground(lab, procs, free_port(), "--fault", "exit-after=8")
    body = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 4}).encode()
    with contextlib.suppress(OSError):
        urllib.request.urlopen(urllib.request.Request(
            ready["url"] + "/v1/completions", body, {"Content-Type": "application/json"}),
            timeout=10).read()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    doc = json.loads(out)
    assert (doc["status"], doc["cause"]) == ("crashed", "exited"), doc
    assert doc["detail"] == "while serving: the server exited with status 0"
    assert doc["teardown"]["verify"]["verdict"] == "clean"
    record = next(r for r in lab.runs() if r["id"] == ready["run_id"])
    assert (record["status"], record["cause"]) == ("crashed", "exited")
