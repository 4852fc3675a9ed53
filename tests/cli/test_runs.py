"""Every bench recorded (issue 38 item 4): ``bench`` stores its result under an id (in its JSON
and its last line), ``cleanslate runs`` lists runs and benches, ``report BENCH_ID`` renders one
bench, several or ``--compare``; a store that refuses the write keeps the result in the JSON
file. Against the fake server (a real process on 127.0.0.1) and a real SQLite store; the CLI
runs in this process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cleanslate.store import RunRecord, Store
from tests.bench.conftest import start_fake_server_process
from tests.cli.inproc import Exit, run_main
from tests.store.documents import recorded_run

BENCH = ["--model", "m", "--workload", "random:input_len=8,output_len=4", "--no-live",
         "--num-prompts", "4", "--no-observe"]


def _bench(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str,
           store: str, *args: str) -> tuple[Exit, dict[str, Any]]:
    res = run_main(capsys, monkeypatch, "bench", "--url", url, *BENCH, "--store", store,
                   "--json", "-", *args)
    return res, json.loads(res.out)


def _dead_pid() -> int:
    """A PID that no process has here (the highest PID the kernel allows, plus one)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


@pytest.mark.slow  # 5 s: two benches, the figure drawn twice
def test_a_bench_is_recorded_listed_and_reported(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        tmp_path: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    store = f"sqlite:///{tmp_path / 'cs.db'}"
    res, first = _bench(capsys, monkeypatch, url, store, "--concurrency", "1,2")
    assert res.code == 0, res.err
    bench_id = first["bench_id"]
    assert bench_id.startswith("b-") and first["run_id"] is None
    assert f"bench recorded: {bench_id}" in res.err  # stdout holds the JSON alone
    res, second = _bench(capsys, monkeypatch, url, store, "--concurrency", "2")
    assert res.code == 0 and second["bench_id"] != bench_id

    # A run in the store, recorded ready whose server is gone: `runs` says it exited.
    run = RunRecord.from_document({**recorded_run(), "id": "r-gone", "status": "ready",
                                   "host": "local", "model": "[red]m[/red]",
                                   "pid": _dead_pid(), "supervisor_pid": _dead_pid(),
                                   "boot_id": None, "started_at": 10.0})
    opened = Store(store)
    opened.save_run(run)
    opened.close()
    listed = run_main(capsys, monkeypatch, "runs", "--store", store, "--json")
    assert listed.code == 0, listed.err
    doc = json.loads(listed.out)
    assert [b["bench_id"] for b in doc["benches"]] == [second["bench_id"], bench_id]
    assert doc["benches"][1]["levels"] == ["c=1", "c=2"]
    assert doc["benches"][1]["best_output_throughput"] > 0
    assert [(r["run_id"], r["state"], r["cause"]) for r in doc["runs"]] == [
        ("r-gone", "exited", "gone")]
    text = run_main(capsys, monkeypatch, "runs", "--store", store)
    assert text.code == 0 and bench_id in text.out and "exited (gone)" in text.out
    assert "[red]m[/red]" in text.out  # the store's text printed as text, not markup

    page = tmp_path / "one.html"
    one = run_main(capsys, monkeypatch, "report", bench_id, "--store", store, "--html",
                   str(page), "--png", str(tmp_path / "png"))
    assert one.code == 0, one.err
    html = page.read_text()
    assert bench_id in html and "Latency against throughput" in html
    assert f"cleanslate report {bench_id} --html FILE" in html
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == ["throughput-latency.png"]

    both = tmp_path / "both.html"
    two = run_main(capsys, monkeypatch, "report", bench_id, "--compare", second["bench_id"],
                   "--store", store, "--html", str(both))
    assert two.code == 0, two.err
    assert "Benches, level by level" in two.out
    assert bench_id in both.read_text() and second["bench_id"] in both.read_text()
    csv = run_main(capsys, monkeypatch, "report", bench_id, second["bench_id"], "--store",
                   store, "--format", "csv")
    rows = csv.out.strip().splitlines()
    assert csv.code == 0 and rows[0].startswith("bench,label,") and len(rows) == 1 + 3


def test_report_of_an_unknown_id_names_what_it_looked_for(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cs.db'}"
    Store(store).close()
    res = run_main(capsys, monkeypatch, "report", "b-nope", "--store", store)
    assert res.code == 2 and "Traceback" not in res.err
    assert "no study 'b-nope' and no bench 'b-nope'" in res.err
    assert "cleanslate runs" in res.err
    missing = run_main(capsys, monkeypatch, "report", str(tmp_path / "bench.json"))
    assert missing.code == 2 and "no file" in missing.err


def test_report_takes_a_bench_json_file_given_as_its_argument(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        tmp_path: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    out = tmp_path / "bench.json"
    res = run_main(capsys, monkeypatch, "bench", "--url", url, *BENCH, "--no-store",
                   "--json", str(out), "--concurrency", "1")
    assert res.code == 0 and "bench recorded" not in res.out + res.err
    assert json.loads(out.read_text())["bench_id"] is None  # not recorded
    shown = run_main(capsys, monkeypatch, "report", str(out), "--format", "json")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["levels"][0]["label"] == "c=1"


def test_a_store_that_refuses_the_write_keeps_the_result_in_the_json_file(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        tmp_path: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    db = tmp_path / "cs.db"
    Store(f"sqlite:///{db}").close()
    read_only = f"sqlite:///file:{db}?mode=ro&uri=true"  # refused even to root
    out = tmp_path / "bench.json"
    res = run_main(capsys, monkeypatch, "bench", "--url", url, *BENCH, "--store", read_only,
                   "--json", str(out), "--concurrency", "1")
    assert res.code == 2 and "Traceback" not in res.err
    assert "the bench result was not recorded: it is in" in res.err and str(out) in res.err
    assert "--no-store" in res.err
    kept = json.loads(out.read_text())
    assert kept["levels"][0]["completed"] == 4
    assert os.stat(out).st_mode & 0o777 == 0o600
    assert Store(f"sqlite:///{db}", create=False).benches() == []


@pytest.mark.slow  # 2 s: two probes
def test_a_find_max_search_is_recorded_with_its_probes_levels(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        tmp_path: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    store = f"sqlite:///{tmp_path / 'cs.db'}"
    res, doc = _bench(capsys, monkeypatch, url, store, "--find-max", "concurrency", "--slo",
                      "median_tpot_ms=100000", "--start", "1", "--max-load", "2",
                      "--warmup", "1")
    assert res.code == 0, res.err
    assert doc["tool"] == "cleanslate bench --find-max" and doc["bench_id"].startswith("b-")
    assert f"bench recorded: {doc['bench_id']}" in res.err
    opened = Store(store, create=False)
    (record,) = opened.benches()
    opened.close()
    assert record.id == doc["bench_id"] and record.kind == "find_max"
    assert record.labels() == ["c=1", "c=2"] and record.options["find_max"] == "concurrency"
    shown = run_main(capsys, monkeypatch, "report", record.id, "--store", store, "--format",
                     "json")
    assert shown.code == 0, shown.err
    assert [lv["label"] for lv in json.loads(shown.out)["levels"]] == ["c=1", "c=2"]


def test_a_ready_run_whose_pids_now_name_other_processes_is_exited(tmp_path: Path) -> None:
    """`runs` proves a ready run's processes by PID and recorded start time: a PID the
    kernel gave to another process since (here: this test's own, with another start time)
    is not the run; the right start time is."""
    import psutil

    from cleanslate.cli.runs import run_state

    me = os.getpid()
    started = psutil.Process(me).create_time()
    doc = {**recorded_run(), "status": "ready", "host": "local", "boot_id": None,
           "pid": me, "create_time": started - 1000.0,
           "supervisor_pid": me, "supervisor_create_time": started - 1000.0}
    reused = RunRecord.model_validate(doc)
    assert run_state(reused, tmp_path)[:2] == ("exited", "gone")
    alive = RunRecord.model_validate({**doc, "create_time": started})
    assert run_state(alive, tmp_path)[0] == "ready"
