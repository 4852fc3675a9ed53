"""``bench --run ID`` (issue 38 items 1-2): a recorded run benched from its record, refused when
it is not serving; a bench that stops at the level whose requests all failed for one cause,
with the fix as a flag; the server's crash at a level with its cause from the run's log; and
``stop`` saying that the run's server had exited before it, when and why.

The fast tests run the command in this process against real SQLite stores and the fake OpenAI
server in a thread; the sim's crash fault runs through real ``serve``, ``bench`` and ``stop``
processes (slow)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from cleanslate.store import RunRecord, RunStatus, Store
from cleanslate.testing.fake_openai import fake_openai_thread
from tests._kit import free_port
from tests.cli.inproc import run_main
from tests.conftest import recorded_rows

SMALL = ("--workload", "random:input_len=8,output_len=4", "--no-live", "--no-observe")
CRASH_LINE = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"


def _store(tmp_path: Path, *runs: RunRecord) -> str:
    url = f"sqlite:///{tmp_path}/cs.db"
    store = Store(url)
    for run in runs:
        store.save_run(run)
    return url


def _run(run_id: str, *, url: str = "http://127.0.0.1:9", engine: str = "sim",
         status: RunStatus = RunStatus.READY, **fields: Any) -> RunRecord:
    """A run record as `serve` writes one (no process behind it: the tests that use it send
    requests to a fake server, or are refused before any)."""
    port = int(url.rsplit(":", 1)[1])
    return RunRecord(id=run_id, host="local", engine=engine, model="m", argv=("engine",),
                     marker=run_id, port=port, url=url, log_path=f"/nonexistent/{run_id}.log",
                     artifacts_dir=f"/nonexistent/{run_id}", status=status, **fields)


def test_an_unknown_run_id_is_exit_2_naming_the_closest_ids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path, _run("r-20261206-081000-aaaa"), _run("r-20261206-093000-ffff"))
    res = run_main(capsys, monkeypatch, "bench", "--run", "r-20261206-081000-aaab",
                   "--store", store, *SMALL)
    assert res.code == 2, res.err
    assert "no run 'r-20261206-081000-aaab'" in res.err
    assert "closest ids: r-20261206-081000-aaaa" in res.err
    assert "Traceback" not in res.err


def test_run_and_url_together_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path, _run("r-1"))
    res = run_main(capsys, monkeypatch, "bench", "--run", "r-1", "--url", "http://127.0.0.1:9",
                   "--store", store, *SMALL)
    assert res.code == 2
    assert "--url" in res.err and "not both" in res.err
    res = run_main(capsys, monkeypatch, "bench", *SMALL)
    assert res.code == 2 and "--run ID" in res.err



def test_find_max_against_a_run_of_another_host_is_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path, _run("r-far").model_copy(update={"host": "gpu-a"}))
    res = run_main(capsys, monkeypatch, "bench", "--run", "r-far", "--store", store,
                   "--find-max", "concurrency", "--slo", "p99_tpot_ms=100", *SMALL)
    assert res.code == 2
    assert "runs of this machine only" in " ".join(res.err.split())


def test_a_run_that_is_not_ready_is_refused_with_its_state_when_and_cause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ended = time.mktime((2026, 12, 6, 12, 3, 10, 0, 0, -1))
    store = _store(tmp_path,
                   _run("r-crashed", status=RunStatus.CRASHED, cause="python_exception",
                        detail=CRASH_LINE, stopped_at=ended),
                   _run("r-starting", status=RunStatus.STARTING),
                   _run("r-stopped", status=RunStatus.STOPPED, stopped_at=ended))
    res = run_main(capsys, monkeypatch, "bench", "--run", "r-crashed", "--store", store, *SMALL)
    assert res.code == 2
    assert f"run r-crashed is crashed (python_exception, 12:03:10): {CRASH_LINE}" in \
        " ".join(res.err.split())
    res = run_main(capsys, monkeypatch, "bench", "--run", "r-starting", "--store", store,
                   *SMALL)
    assert res.code == 2 and "run r-starting is starting" in res.err
    res = run_main(capsys, monkeypatch, "bench", "--run", "r-stopped", "--store", store, *SMALL)
    assert res.code == 2 and "run r-stopped is stopped (12:03:10)" in res.err


def test_a_transformers_run_is_benched_without_ignore_eos_and_an_explicit_option_wins(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`transformers serve` answers HTTP 422 to ignore_eos: the adapter says so, and the
    record's bench leaves it out; --ignore-eos typed on the command line is sent anyway, and
    the bench stops at its first level with the fix as a flag."""
    with fake_openai_thread("reject-fields=ignore_eos,min_tokens") as server:
        store = _store(tmp_path, _run("r-tf", url=server.url, engine="transformers"))
        out = tmp_path / "out.json"
        res = run_main(capsys, monkeypatch, "bench", "--run", "r-tf", "--store", store,
                       "--concurrency", "1,2", "--num-prompts", "3", "--json", str(out),
                       *SMALL)
        assert res.code == 0, res.err
        doc = json.loads(out.read_text())
        assert [lv["completed"] for lv in doc["levels"]] == [3, 3]
        assert doc["url"] == server.url and doc["model"] == "m"
        assert doc["ended_early"] is None
        res = run_main(capsys, monkeypatch, "bench", "--run", "r-tf", "--store", store,
                       "--concurrency", "1,2", "--num-prompts", "3", "--ignore-eos",
                       "--json", str(out), *SMALL)
    assert res.code == 1
    doc = json.loads(out.read_text())
    assert [lv["label"] for lv in doc["levels"]] == ["c=1"]  # c=2 would fail the same way
    assert "--no-ignore-eos" in doc["ended_early"]
    assert "every one of 3 requests at c=1 failed with http_422" in doc["ended_early"]


def test_a_422_on_ignore_eos_stops_a_bare_url_bench_and_names_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_openai_thread("reject-fields=ignore_eos") as server:
        res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "m",
                       "--concurrency", "1,2,4", "--num-prompts", "3", "--no-store",
                       "--json", "-", *SMALL)
    assert res.code == 1
    doc = json.loads(res.out)
    assert len(doc["levels"]) == 1
    assert "run again with --no-ignore-eos" in doc["ended_early"]
    assert "run again with --no-ignore-eos" in res.err
    assert "BenchConfig" not in res.out + res.err
    assert "crash" not in doc["levels"][0]  # no crash: the server answered every request


def test_a_server_never_reached_is_no_crash_and_ends_the_bench_naming_url(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    res = run_main(capsys, monkeypatch, "bench", "--url", url, "--model", "m", "--concurrency",
                   "1,2", "--num-prompts", "2", "--no-store", "--json", "-", *SMALL)
    assert res.code == 1
    doc = json.loads(res.out)
    assert len(doc["levels"]) == 1 and "crash" not in doc["levels"][0]
    assert f"nothing accepts connections at {url}: check --url" in doc["ended_early"]


@pytest.mark.slow
def test_a_bare_url_crash_is_told_from_the_connections(
        sims: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sim crashes at the first level (no run record: the connections are all there is):
    a crash, not 'nothing listens', since the server had accepted the requests it cut."""
    server = sims.start("--model-path", "sim", "--fault", "crash-at-concurrency=2")
    res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "sim",
                   "--concurrency", "8,16", "--num-prompts", "8", "--no-store", "--json", "-",
                   *SMALL)
    assert res.code == 1, res.err
    (level,) = json.loads(res.out)["levels"]
    assert level["crash"]["source"] == "connections" and level["crash"]["label"] == "c=8"
    assert "the server crashed at c=8: " in res.err
    assert "(from what the connections showed)" in " ".join(res.err.split())


@pytest.mark.slow
def test_the_sims_crash_under_bench_run_is_reported_with_its_cause_and_stop_says_so(
        tmp_path: Path, cli: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sim crashes above 4 requests in flight: c=2 completes, c=8 is the crash with the
    log's cause (exit 1), c=16 is not run; `stop` says the server had exited before it, when,
    with which status and why; a second `stop` leaves the run crashed. `serve` runs as a
    process; bench and stop in this one (no interpreter start each)."""
    store, run_id = _serve(tmp_path, cli, monkeypatch, "crash-at-concurrency=4")
    out = tmp_path / "bench.json"
    res = run_main(capsys, monkeypatch, "bench", "--run", run_id, "--store", store,
                   "--concurrency", "2,8,16", "--num-prompts", "8", "--json", str(out), *SMALL)
    assert res.code == 1, res.out + res.err
    text = " ".join((res.out + res.err).split())
    assert f"the server crashed at c=8: python_exception: {CRASH_LINE} (from the run's log)" \
        in text
    assert "CRASHED" in text
    doc = json.loads(out.read_text())
    assert [lv["label"] for lv in doc["levels"]] == ["c=2", "c=8"]
    assert doc["levels"][0]["completed"] == 8 and "crash" not in doc["levels"][0]
    assert doc["levels"][1]["crash"] == {"label": "c=8", "cause": "python_exception",
                                         "line": CRASH_LINE, "source": "log"}
    assert doc["ended_early"].startswith("the server crashed at c=8: python_exception")
    stopped = run_main(capsys, monkeypatch, "stop", run_id, "--store", store,
                       "--gpu-backend", "sim")
    assert stopped.code == 0, stopped.out + stopped.err
    said = " ".join((stopped.out + stopped.err).split())
    assert "CLEAN" in said
    assert re.search(r"the server had exited before the stop: crashed at \d\d:\d\d:\d\d, "
                     r"exit status 1, python_exception: AttributeError", said), said
    # A second stop verifies the host again; the run stays crashed, with its cause.
    again = run_main(capsys, monkeypatch, "stop", run_id, "--store", store, "--gpu-backend",
                     "sim")
    assert again.code == 0, again.out + again.err
    assert "had exited before the stop" not in again.out + again.err
    (row,) = recorded_rows(tmp_path / "cs.db")
    assert (row["status"], row["cause"]) == ("crashed", "python_exception")


@pytest.mark.slow
def test_stop_json_carries_how_the_server_had_exited(
        tmp_path: Path, cli: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose server exited by itself (the sim's exit-after fault: after 8 requests, the
    smoke test's among them, status 0): the bench's crash is read from the exit status
    (no crash pattern in the log), and `stop --json` has it under server_exited."""
    store, run_id = _serve(tmp_path, cli, monkeypatch, "exit-after=8")
    res = run_main(capsys, monkeypatch, "bench", "--run", run_id, "--store", store,
                   "--concurrency", "1,2", "--num-prompts", "6", "--json", "-", *SMALL)
    assert res.code == 1, res.out + res.err
    crash = next(lv["crash"] for lv in json.loads(res.out)["levels"] if "crash" in lv)
    assert crash["cause"] == "exited" and crash["source"] == "exit_status"
    stopped = run_main(capsys, monkeypatch, "stop", run_id, "--store", store, "--gpu-backend",
                       "sim", "--json")
    assert stopped.code == 0, stopped.out + stopped.err
    ended = json.loads(stopped.out)["server_exited"]
    assert ended["exit_status"] == 0 and ended["cause"] == "exited"
    assert ended["exited_at"] is not None and ended["source"] == "exit_status"


@pytest.mark.slow
def test_stop_after_the_supervisor_was_killed_says_so_and_the_bench_still_ran(
        tmp_path: Path, cli: Any, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The newcomer's `kill -9` of the supervisor: the engine keeps serving (bench --run
    completes), and `stop` ends it, CLEAN, saying the supervisor was gone and no exit status
    could be recorded (the server had not exited: no server_exited)."""
    store, run_id = _serve(tmp_path, cli, monkeypatch)
    (row,) = recorded_rows(tmp_path / "cs.db")
    supervisor = row["supervisor_pid"]
    os.kill(supervisor, signal.SIGKILL)
    res = run_main(capsys, monkeypatch, "bench", "--run", run_id, "--store", store,
                   "--concurrency", "2", "--num-prompts", "2", *SMALL)
    assert res.code == 0, res.out + res.err
    stopped = run_main(capsys, monkeypatch, "stop", run_id, "--store", store, "--gpu-backend",
                       "sim")
    assert stopped.code == 0, stopped.out + stopped.err
    said = " ".join((stopped.out + stopped.err).split())
    assert "CLEAN" in said and "had exited before the stop" not in said
    assert f"the run's supervisor (PID {supervisor}) was gone before the stop; its server " \
        "was still running" in said


def _serve(tmp_path: Path, cli: Any, monkeypatch: pytest.MonkeyPatch,
           *faults: str) -> tuple[str, str]:
    """`serve --detach` of the sim with ``faults``, its simulated GPUs in ``tmp_path`` (for
    this process too): (the store's URL, the run's id)."""
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(gpus))
    store = f"sqlite:///{tmp_path}/cs.db"
    # a port of its own: the sim's default port may be another test's server in a full run
    served = cli("serve", "--engine", "sim", "--model", "m", "--store", store, "--detach",
                 "--port", str(free_port()), "--json", "--gpu-backend", "sim",
                 "--ready-timeout", "60", "--", "--tp-size",
                 "1", *(x for fault in faults for x in ("--fault", fault)), timeout=120)
    assert served.returncode == 0, served.stdout + served.stderr
    return store, str(served.json()["run_id"])
