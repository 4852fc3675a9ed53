"""``stop`` of a run whose server died before it records how it died: killed by a signal (from
the exit status the run's supervisor kept), or gone with no status (the supervisor died too).
Before, both were recorded ``stopped`` with no cause although the state said exit -9."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests._kit import alive, free_port
from tests.launch.conftest import Lab, served


def _state(run: dict[str, object]) -> dict[str, object]:
    path = Path(str(run["artifacts_dir"])) / "state.json"
    return dict(json.loads(path.read_text()))


def _record(lab: Lab, run_id: str) -> dict[str, object]:
    return next(r for r in lab.runs() if r["id"] == run_id)


def test_a_sigkilled_server_is_recorded_killed_by_stop(lab: Lab) -> None:
    run = served(lab.serve(free_port()))
    os.kill(int(run["pid"]), signal.SIGKILL)  # the server this test started, by PID
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _state(_record(lab, run["run_id"])).get(
            "exit_code") is None:
        time.sleep(0.1)
    assert _state(_record(lab, run["run_id"]))["exit_code"] == -9
    stopped = lab.stop(run["run_id"])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    record = _record(lab, run["run_id"])
    assert record["status"] == "crashed"
    assert record["cause"] == "killed"
    assert "SIGKILL" in str(record["detail"])


def test_a_server_gone_with_its_supervisor_is_recorded_crashed(lab: Lab) -> None:
    run = served(lab.serve(free_port()))
    os.kill(int(run["supervisor_pid"]), signal.SIGKILL)
    os.kill(int(run["pid"]), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(int(run["pid"])):
        time.sleep(0.1)
    stopped = lab.stop(run["run_id"])
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    record = _record(lab, run["run_id"])
    assert record["status"] == "crashed" and record["cause"] == "exited"
    assert "exit status was not recorded" in str(record["detail"])


def test_a_serving_run_stopped_on_request_is_stopped(lab: Lab) -> None:
    run = served(lab.serve(free_port()))
    assert lab.stop(run["run_id"]).returncode == 0
    record = _record(lab, run["run_id"])
    assert record["status"] == "stopped" and record["cause"] is None
