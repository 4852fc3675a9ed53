"""Adding an engine is one new file: ``tests/engines/toy_engine.py`` registers engine ``toy``
(its launch, process signature and ``/dev/shm`` globs), and ``check``, ``clean`` (teardown by
signature), ``serve`` and ``stop`` pick it up with no other edit.

Each command runs the unchanged CLI in a child process that imports the toy module first, as a
plug-in would be loaded; without that import the same host reads clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._kit import alive, free_port
from tests.conftest import CliResult, Processes, run_cli

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOY = Path(__file__).with_name("toy_engine.py")
LOAD_TOY = "import tests.engines.toy_engine; from cleanslate.cli import main; main()"


def toy_cli(*args: str, timeout: float = 60) -> CliResult:
    """``cleanslate ARGS`` in a process that has imported the toy engine's module."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", LOAD_TOY, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return CliResult(done.returncode, done.stdout, done.stderr)


def findings(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for host in doc["hosts"] for f in host["findings"] if f["kind"] == kind]


def workers() -> list[int]:
    """PIDs whose kernel name is the toy's worker (``toy::worker``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "toy::worker":
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def wait_healthy(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, "the toy server did not answer /health"
            time.sleep(0.1)


@pytest.mark.quiet_host
def test_check_reports_a_toy_stray_and_clean_ends_it_by_signature(procs: Processes) -> None:
    port = free_port()
    server = procs.start([sys.executable, str(TOY), "--model", "m", "--port", str(port)])
    wait_healthy(port)
    (worker,) = workers()

    unaware = run_cli("check", "--json", "--gpu-backend", "none")
    assert not [f for f in findings(unaware.json(), "stray_process")
                if f["pid"] in (server.pid, worker)]
    assert not findings(unaware.json(), "shm_leftover")

    dirty = toy_cli("check", "--json", "--gpu-backend", "none")
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    strays = {f["pid"]: f["evidence"]["engine"] for f in findings(dirty.json(), "stray_process")}
    assert strays == {server.pid: "toy", worker: "toy"}
    (shm,) = findings(dirty.json(), "shm_leftover")
    assert {k: shm["evidence"][k] for k in ("name", "size_bytes", "pattern", "uid")} == {
        "name": f"toy-engine-{server.pid}", "size_bytes": 3, "pattern": "toy-engine-*",
        "uid": os.geteuid()}

    cleaned = toy_cli("clean", "--engine", "toy", "--yes", "--json", "--gpu-backend", "none",
                      "--deadline", "20")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    report = cleaned.json()
    assert {t["pid"]: t["why"] for t in report["targets"]} == {server.pid: "engine",
                                                               worker: "engine"}
    assert report["verify"]["verdict"] == "clean"
    assert not alive(server.pid) and not alive(worker)
    Path(f"/dev/shm/toy-engine-{server.pid}").unlink()


class Lab:
    def __init__(self, root: Path) -> None:
        self.store = f"sqlite:///{root}/cs.db"
        self.runs: list[str] = []

    def serve(self, port: int) -> CliResult:
        result = toy_cli("serve", "--engine", "toy", "--model", "toy-model", "--port", str(port),
                         "--store", self.store, "--detach", "--json", "--gpu-backend", "none",
                         "--ready-timeout", "30", "--smoke-timeout", "5")
        if result.returncode == 0:
            self.runs.append(result.json()["run_id"])
        return result

    def stop(self, run_id: str) -> CliResult:
        return toy_cli("stop", run_id, "--store", self.store, "--json", "--gpu-backend", "none",
                       "--deadline", "20", "--grace", "5")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    yield lab
    for run_id in lab.runs:
        lab.stop(run_id)  # a no-op for a run already stopped


@pytest.mark.quiet_host
def test_serve_launches_the_toy_engine_and_stop_removes_its_run(lab: Lab) -> None:
    port = free_port()
    served = lab.serve(port)
    assert served.returncode == 0, served.stdout + served.stderr
    doc = served.json()
    assert doc["engine"] == "toy" and doc["url"] == f"http://127.0.0.1:{port}"
    assert doc["argv"] == [sys.executable, str(TOY), "--model", "toy-model", "--port", str(port)]
    assert doc["verdict_before"]["verdict"] == "clean"
    assert doc["smoke"]["passed"] is True
    assert doc["flag_validation"] == "checked"  # against `toy_engine.py --help`
    (worker,) = workers()

    dirty = toy_cli("check", "--json", "--gpu-backend", "none", "--port", str(port))
    strays = {f["pid"]: f["evidence"] for f in findings(dirty.json(), "stray_process")}
    assert {e["run_marker"] for e in strays.values()} == {doc["run_id"]}  # with the supervisor
    assert strays[doc["pid"]]["engine"] == strays[worker]["engine"] == "toy"
    assert findings(dirty.json(), "port_in_use")
    assert [f["evidence"]["pattern"] for f in findings(dirty.json(), "shm_leftover")] == \
        ["toy-engine-*"]

    stopped = lab.stop(doc["run_id"])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    assert report["verify"]["verdict"] == "clean"
    assert report["shm_removed"] == [f"toy-engine-{doc['pid']}"]
    assert not alive(doc["pid"]) and not alive(worker)
    after = toy_cli("check", "--json", "--gpu-backend", "none", "--port", str(port))
    assert after.json()["verdict"] == "clean", json.dumps(after.json(), indent=1)
