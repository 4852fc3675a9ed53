"""``stop`` of a run whose server died before it records how it died: killed by a signal (from
the exit status the run's supervisor kept), or gone with no status (the supervisor died too).
Before, both were recorded ``stopped`` with no cause although the state said exit -9."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

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


def _exited_by_itself(lab: Lab) -> dict[str, object]:
    """A detached sim run whose server exited 0 by itself (``exit-after``: the smoke test's 8
    requests are served, the next ends it), once its supervisor has recorded the status."""
    import urllib.request

    run = served(lab.serve(free_port(), "--fault", "exit-after=8"))
    body = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 4}).encode()
    with contextlib.suppress(OSError):
        urllib.request.urlopen(urllib.request.Request(
            str(run["url"]) + "/v1/completions", body, {"Content-Type": "application/json"}),
            timeout=10).read()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _state(_record(lab, str(run["run_id"]))).get(
            "exit_code") is None:
        time.sleep(0.1)
    assert _state(_record(lab, str(run["run_id"])))["exit_code"] == 0
    return run


@pytest.mark.slow  # 4.7-4.9 s here: the server's start dominates
def test_a_server_that_exited_0_by_itself_is_recorded_crashed_by_stop(lab: Lab) -> None:
    run = _exited_by_itself(lab)
    stopped = lab.stop(str(run["run_id"]))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    record = _record(lab, str(run["run_id"]))
    assert (record["status"], record["cause"]) == ("crashed", "exited")
    assert record["detail"] == "before `stop`: the server exited with status 0"


@pytest.mark.slow  # 4.9 s here
def test_a_stop_for_a_reason_of_a_server_that_had_exited_is_crashed(lab: Lab) -> None:
    """The caller's reason (a level's bad output, a dead controller) does not make a server
    that had ended by itself ``stopped``: the reason stays in the detail."""
    import asyncio

    from cleanslate.hosts import executor_for
    from cleanslate.store import Store
    from cleanslate.tune import trial as trial_mod

    run = _exited_by_itself(lab)
    store = Store(lab.store)
    (record,) = [r for r in store.runs() if r.id == run["run_id"]]
    asyncio.run(trial_mod.stop_server(executor_for(None), store, record, grace_s=2,
                                      gpu_backend="sim", verify_deadline_s=20,
                                      status="stopped", cause="bad_output",
                                      detail="c=4: 4 of 4 sampled responses show degenerate"))
    after = _record(lab, str(run["run_id"]))
    assert (after["status"], after["cause"]) == ("crashed", "exited")
    assert after["detail"] == ("before `stop`: the server exited with status 0; stopped for "
                               "bad_output: c=4: 4 of 4 sampled responses show degenerate")
