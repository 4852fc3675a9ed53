"""Fleets on this machine: several slots of one controller, workers as separate processes,
leases re-queued after a SIGKILL, and bad input refused before anything is written.

The slots are simulated GPUs of one ledger (``CLEANSLATE_SIM_GPU_DIR``); each slot's checks are
about its own GPUs and port, and the runs of the other slots are not strays there.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._kit import alive, free_port
from tests.conftest import Processes, recorded_rows, run_cli

GRID = """\
name: NAME
engine: sim
model: sim
SLOTS
fixed: {tp-size: 1, time-scale: 0.25}
space:
  max-running-requests: [16, 32, 64]
  chunked-prefill-size: [512, 1024]
  disable-radix-cache: [true, false]
strategy: grid
workload: {kind: random, input_len: 128, output_len: 16}
concurrency: [4]
duration_s_per_level: DURATION
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
lease_timeout_s: 10
"""


def _study(tmp_path: Path, name: str, slots: str, duration: float = 1.0,
           half: bool = False) -> Path:
    """The 12-trial grid on ``slots``; ``half``: its 6 trials with the radix cache on."""
    text = GRID.replace("NAME", name).replace("SLOTS", slots).replace("DURATION", f"{duration:g}")
    if half:
        text = text.replace("  disable-radix-cache: [true, false]\n", "")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    gpus = tmp_path / "gpus"
    gpus.mkdir(exist_ok=True)
    return {"CLEANSLATE_SIM_GPU_DIR": str(gpus)}


def _results(db: Path, study: str) -> list[dict[str, Any]]:
    return [t for t in recorded_rows(db, "cs_trials")
            if t["study"] == study and t["status"] in ("feasible", "infeasible")]


def _leases(db: Path, study: str) -> list[dict[str, Any]]:
    return [lease for lease in recorded_rows(db, "cs_leases") if lease["study"] == study]


def _config(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


def _overlapping(trials: list[dict[str, Any]]) -> bool:
    """Whether two trials ran at the same time (their start-to-finish intervals overlap)."""
    spans = sorted((t["started_at"], t["finished_at"]) for t in trials)
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


@pytest.mark.slow
def test_two_slots_measure_each_configuration_once_in_parallel(tmp_path: Path,
                                                               figure: Any) -> None:
    port = free_port()
    two = _study(tmp_path, "two", f"port: {port}\nslots: [{{gpus: [0]}}, {{gpus: [1]}}]")
    db = tmp_path / "s.db"
    started = time.monotonic()
    result = run_cli("tune", str(two), "--store", f"sqlite:///{db}", env=_env(tmp_path),
                     timeout=600)
    two_s = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    trials = _results(db, "two")
    assert len(trials) == 12
    assert len({_config(t["params"]) for t in trials}) == 12  # each one exactly once
    for t in trials:
        assert t["verdict_before"] == "clean" and t["verdict_after"] == "clean", t
    assert _overlapping(trials), "the two slots never ran trials at the same time"
    ports = Counter(run["port"] for run in recorded_rows(db) if run["study"] == "two")
    assert set(ports) == {port, port + 1} and min(ports.values()) >= 3, ports
    leases = _leases(db, "two")
    assert Counter((lease["state"], lease["outcome"]) for lease in leases) == {
        ("released", "result"): 12}

    figure(f"12-trial sim grid on 2 slots: {two_s:.1f} s on {os.cpu_count()} CPUs (against "
           "one slot: benchmarks/fleet.py, side by side)")

    report = run_cli("report", "two", "--store", f"sqlite:///{db}", "--format", "json")
    assert report.returncode == 0, report.stderr
    [document] = report.json()["studies"]
    slots = {s["slot"]: s for s in document["slots"]}
    assert {s["trials"] for s in slots.values()} and sum(
        s["trials"] for s in slots.values()) == 12
    assert all(s["state"] == "ok" and s["infra_failures"] == 0 for s in slots.values())


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = predicate()
        except sqlite3.OperationalError:
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_sigkilled_worker_loses_its_lease_and_its_trial_runs_again(
        tmp_path: Path, procs: Processes, figure: Any) -> None:
    port = free_port()
    study = _study(tmp_path, "fleet", f"port: {port}\ngpus: [0]", duration=2.0, half=True)
    db = tmp_path / "s.db"
    store = f"sqlite:///{db}"
    env = {**os.environ, **_env(tmp_path)}
    cleanslate = [sys.executable, "-m", "cleanslate"]
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("tune", "w1", "w2")}

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]

    controller = procs.start([*cleanslate, "tune", str(study), "--store", store], env=env,
                             stdout=logs["tune"], stderr=subprocess.STDOUT)
    _wait_for(lambda: _leases(db, "fleet"), 120, "the controller's first lease")
    victim = procs.start([*cleanslate, "worker", "--study", "fleet", "--store", store,
                          "--gpus", "1", "--port", str(port + 1)], env=env,
                         stdout=logs["w1"], stderr=subprocess.STDOUT)

    def victims_run() -> dict[str, Any] | None:
        return next((r for r in recorded_rows(db) if r["status"] == "ready"
                     and r["port"] == port + 1), None)

    run = _wait_for(victims_run, 180, "a ready run of the worker")
    [lease] = [lease for lease in _leases(db, "fleet") if lease["run_id"] == run["id"]]
    victim.send_signal(signal.SIGKILL)  # only the worker this test started
    victim.wait(timeout=10)
    killed_at = time.monotonic()
    assert alive(run["pid"]), "the killed worker's server should outlive it"
    other = procs.start([*cleanslate, "worker", "--study", "fleet", "--store", store,
                         "--gpus", "2", "--port", str(port + 2)], env=env,
                        stdout=logs["w2"], stderr=subprocess.STDOUT)

    def rerun() -> dict[str, Any] | None:
        return next((t for t in recorded_rows(db, "cs_trials")
                     if t["params"] == lease["params"] and t["number"] != lease["trial"]), None)

    _wait_for(rerun, 120, "the trial of the expired lease to run again")
    figure(f"SIGKILLed worker: its trial ran again {time.monotonic() - killed_at:.1f} s later")
    assert controller.wait(timeout=400) == 0, log("tune")
    assert other.wait(timeout=120) == 0, log("w2")
    assert not alive(run["pid"]), "the killed worker's server was not torn down"
    trials = _results(db, "fleet")
    assert len(trials) == 6
    assert len({_config(t["params"]) for t in trials}) == 6  # no duplicate
    by_id = {lease["id"]: lease for lease in _leases(db, "fleet")}
    assert by_id[lease["id"]]["state"] == "expired"
    died = [t for t in recorded_rows(db, "cs_trials") if t["number"] == lease["trial"]]
    assert [(t["status"], t["cause"]) for t in died] == [("infra_failed", "controller_died")]
    stopped = next(r for r in recorded_rows(db) if r["id"] == run["id"])
    assert stopped["status"] != "ready" and stopped["teardown"]["targets"]


DECOY = """
import sys, time
from cleanslate.sim import ledger
ledger.allocate(sys.argv[1], int(sys.argv[2]), 20000, "sglang::scheduler")
print("holding", flush=True)
time.sleep(3600)
"""


@pytest.mark.slow
def test_a_slot_that_stays_dirty_is_quarantined_and_the_study_goes_on(
        tmp_path: Path, procs: Processes) -> None:
    """A process this study did not start holds memory on slot 1's GPU: slot 1 is quarantined
    with that evidence, its trial runs on slot 0, and the decoy is never signalled."""
    env = _env(tmp_path)
    decoy = procs.python(DECOY, env["CLEANSLATE_SIM_GPU_DIR"], "1", stdout=subprocess.PIPE)
    assert decoy.stdout is not None and decoy.stdout.readline().strip() == b"holding"
    port = free_port()
    study = _study(tmp_path, "dirty", f"port: {port}\nretries: 1\n"
                   "slots: [{gpus: [0]}, {gpus: [1]}]")
    study.write_text(study.read_text().replace("  disable-radix-cache: [true, false]\n", "")
                     .replace("  chunked-prefill-size: [512, 1024]\n", ""))
    db = tmp_path / "s.db"
    result = run_cli("tune", str(study), "--store", f"sqlite:///{db}", env=env, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert decoy.poll() is None, "the decoy was signalled"
    assert "quarantined" in result.stdout
    trials = _results(db, "dirty")
    assert sorted(t["params"]["max-running-requests"] for t in trials) == [16, 32, 64]
    assert {run["port"] for run in recorded_rows(db) if run["study"] == "dirty"} == {port}
    refused = [t for t in recorded_rows(db, "cs_trials") if t["status"] == "infra_failed"]
    assert [t["cause"] for t in refused] == ["host_not_clean"]
    report = run_cli("report", "dirty", "--store", f"sqlite:///{db}", "--format", "json")
    [document] = report.json()["studies"]
    slots = {s["slot"]: s for s in document["slots"]}
    bad = slots[f"local/gpus=1/port={port + 1}"]
    assert bad["state"] == "quarantined" and bad["trials"] == 0 and bad["infra_failures"] == 1
    assert any(str(decoy.pid) in f["message"] for f in bad["findings"]), bad
    assert slots[f"local/gpus=0/port={port}"]["trials"] == 3
    table = run_cli("report", "dirty", "--store", f"sqlite:///{db}")
    assert "quarantined" in table.stdout and "slots of dirty" in table.stdout


# -- bad input: exit 2, nothing written ---------------------------------------------------------


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.mark.parametrize(("slots", "message"), [
    ("slots: [{gpus: [0, 1]}, {gpus: [1, 2]}]", "slots[1].gpus: GPU 1 is also in slots[0]"),
    ("slots: [{gpus: [0], port: 31000}, {gpus: [1], port: 31000}]",
     "slots[1].port: port 31000 is also the port of slots[0]"),
    ("port: 31000\nslots: [{gpus: [0]}, {gpus: [1], port: 31000}]",
     "slots[1].port: port 31000 is also the port of slots[0]"),
    ("hosts: [local, cleanslate-no-such-host.invalid]\ngpus: [0]",
     "host cleanslate-no-such-host.invalid does not resolve"),
])
def test_bad_slots_exit_2_and_write_nothing(tmp_path: Path, slots: str, message: str) -> None:
    study = _study(tmp_path, "bad", slots)
    db = tmp_path / "s.db"
    result = run_cli("tune", str(study), "--store", f"sqlite:///{db}", env=_env(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not db.exists()


def test_a_worker_on_a_missing_study_exits_2_and_leaves_the_store_alone(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    missing = run_cli("worker", "--study", "nope", "--store", f"sqlite:///{db}")
    assert missing.returncode == 2 and "no store at" in missing.stderr
    assert not db.exists()
    sqlite3.connect(db).execute("create table other (x int)").connection.close()
    before = _digest(db)
    result = run_cli("worker", "--study", "nope", "--store", f"sqlite:///{db}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no study 'nope'" in result.stderr and "Traceback" not in result.stderr
    assert _digest(db) == before


def test_the_plan_shows_no_store_writes_for_a_fleet_definition(tmp_path: Path) -> None:
    """``--check`` accepts hosts and slots and shows the study; ports come from the slots."""
    study = _study(tmp_path, "ok", "port: 31000\nslots: [{gpus: [0]}, {gpus: [1], port: 31010}]")
    result = run_cli("tune", str(study), "--check", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["trials"] == 12


TPE = """\
name: tpe
engine: sim
model: sim
port: PORT
slots: [{gpus: [0]}, {gpus: [1]}]
fixed: {tp-size: 1, time-scale: 0.25}
baseline: {max-running-requests: 45}
space:
  max-running-requests: {int: [16, 128], log: true}
strategy: tpe
budget: {trials: 4}
workload: {kind: random, input_len: 128, output_len: 16}
concurrency: [4]
duration_s_per_level: 1
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
"""


@pytest.mark.slow
def test_tpe_on_two_slots_asks_the_sampler_per_lease_within_the_budget(tmp_path: Path) -> None:
    study = tmp_path / "tpe.yaml"
    study.write_text(TPE.replace("PORT", str(free_port())))
    db = tmp_path / "s.db"
    result = run_cli("tune", str(study), "--store", f"sqlite:///{db}", env=_env(tmp_path),
                     timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    trials = _results(db, "tpe")
    assert len(trials) == 4
    assert 45 in [t["params"]["max-running-requests"] for t in trials]  # the baseline
    leases = _leases(db, "tpe")
    assert len(leases) == 4 and all(lease["outcome"] == "result" for lease in leases)
    assert not any(lease["key"].startswith("new:") for lease in leases)  # bound once asked
    assert sorted(lease["trial"] for lease in leases) == [0, 1, 2, 3]
    with sqlite3.connect(db) as conn:
        states = [r[0] for r in conn.execute("select state from trials order by number")]
    assert states == ["COMPLETE"] * 4


@pytest.mark.quiet_host
def test_a_run_that_cannot_be_torn_down_makes_its_slot_suspect_until_it_is_clean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An expired lease whose run is on a host that does not answer: the slot is suspect;
    a suspect slot takes a trial only after a check of its GPUs and port reads clean."""
    import asyncio

    from cleanslate.hosts import LocalExecutor
    from cleanslate.store import RunRecord, RunStatus, Store
    from cleanslate.store._leases import LeaseRecord, SlotRecord, SlotState
    from cleanslate.tune.controller import open_optuna
    from cleanslate.tune.fleet import Fleet, SlotEnd
    from cleanslate.tune.study import Slot, StudySpec
    from cleanslate.tune.view import TuneView

    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", _env(tmp_path)["CLEANSLATE_SIM_GPU_DIR"])
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    spec = StudySpec.model_validate({
        "name": "s", "engine": "sim", "model": "sim", "gpus": [0], "port": free_port(),
        "space": {"max-running-requests": [16, 32]}, "strategy": "grid", "concurrency": [1],
        "verify_deadline_s": 2, "retries": 0})
    store.save_study("s", spec.model_dump(mode="json"), "running")
    fleet = Fleet(store=store, spec=spec, study=open_optuna(store, spec), view=TuneView(),
                  stop=asyncio.Event(), gpu_backend="sim")
    away = "ssh://nobody@127.0.0.1:9?connect-timeout=1"  # nothing listens there
    run = RunRecord(id="r-away", host=away, engine="sim", model="sim", argv=("sim",),
                    marker="r-away", port=30000, gpus=(0,), url="http://127.0.0.1:30000",
                    log_path="/nowhere/server.log", artifacts_dir="/nowhere",
                    status=RunStatus.READY, study="s", trial=0)
    store.save_run(run)
    template = LeaseRecord(study="s", key="", worker="w-gone", host=away, gpus=(0,),
                           port=30000, slot=f"{away}/gpus=0/port=30000", run_id="r-away")
    claim = store.claim_lease(template, timeout_s=0.1, plan=fleet.plan, limit=2)
    assert claim.lease is not None
    store.bind_lease(claim.lease, trial=0)
    time.sleep(0.3)
    [expired] = store.expire_leases("s")
    asyncio.run(fleet.requeue(expired, lambda _m: None))
    [suspect] = store.slots("s")
    assert suspect.state == SlotState.SUSPECT and "r-away" in (suspect.reason or "")

    slot = Slot(host="local", gpus=(0,), port=spec.port or 30000)
    store.save_slot(SlotRecord(study="s", slot=slot.key, host="local", gpus=(0,),
                               port=slot.port, state=SlotState.SUSPECT, reason="a test"))
    end = SlotEnd(slot=slot, why="done")
    usable = asyncio.run(fleet.usable(slot, LocalExecutor(), spec, lambda: frozenset(),
                                      lambda _m: None, end))
    findings = [f.message for h in end.report.hosts for f in h.findings] if end.report else []
    assert usable, (end.message, findings)
    states = {s.slot: s.state for s in store.slots("s")}
    assert states[slot.key] == SlotState.OK
    store.close()


@pytest.mark.slow
def test_a_controller_and_two_workers_share_a_postgresql_store(
        tmp_path: Path, procs: Processes, postgres_url: str) -> None:
    """Three processes (``tune`` and two ``worker``) lease one grid from a real PostgreSQL:
    every configuration is measured once, and more than one process measured some."""
    import psycopg
    import sqlalchemy

    name = f"fleet_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url.rsplit("/", 1)[0] + "/" + name
    port = free_port()
    study = _study(tmp_path, "pg", f"port: {port}\ngpus: [0]")
    env = {**os.environ, **_env(tmp_path)}
    cleanslate = [sys.executable, "-m", "cleanslate"]
    logs = [(tmp_path / f"p{i}.log").open("wb") for i in range(3)]
    controller = procs.start([*cleanslate, "tune", str(study), "--store", url], env=env,
                             stdout=logs[0], stderr=subprocess.STDOUT)
    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        def started() -> bool:
            with engine.connect() as conn:
                return bool(conn.execute(sqlalchemy.text(
                    "select count(*) from cs_studies where name = 'pg'")).scalar())

        _wait_for(lambda: _ignore_missing(started), 120, "the study in the store")
        workers = [procs.start([*cleanslate, "worker", "--study", "pg", "--store", url,
                                "--gpus", str(i), "--port", str(port + i)], env=env,
                               stdout=logs[i], stderr=subprocess.STDOUT) for i in (1, 2)]
        codes = [p.wait(timeout=400) for p in (controller, *workers)]
        assert codes == [0, 0, 0], [(tmp_path / f"p{i}.log").read_text()[-2000:]
                                    for i in range(3)]
        with engine.connect() as conn:
            trials = [json.loads(r[0]) if isinstance(r[0], str) else r[0]
                      for r in conn.execute(sqlalchemy.text(
                          "select data from cs_trials where study = 'pg'"))]
            workers_used = conn.execute(sqlalchemy.text(
                "select count(distinct worker) from cs_leases where study = 'pg'")).scalar()
    finally:
        engine.dispose()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    results = [t for t in trials if t["status"] in ("feasible", "infeasible")]
    assert len(results) == 12
    assert len({_config(t["params"]) for t in results}) == 12
    assert workers_used is not None and workers_used >= 2


def _ignore_missing(check: Any) -> Any:
    """``check()``, or ``None`` while the tables it reads do not exist yet."""
    import sqlalchemy

    try:
        return check()
    except sqlalchemy.exc.ProgrammingError:
        return None


def test_a_worker_takes_the_secrets_the_store_does_not_keep_from_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store keeps ``env:`` secrets as ``***``: a worker takes them from its own
    environment, and refuses (exit 2, nothing written) when they are not there, rather than
    start servers with ``***`` as their token."""
    from cleanslate.store import Store
    from cleanslate.tune.controller import load_stored_study
    from cleanslate.tune.study import StudySpec

    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}")
    spec = StudySpec.model_validate({
        "name": "secret", "engine": "sim", "model": "sim", "gpus": [0],
        "env": {"HF_TOKEN": "hf_fleetsecretabcdefghijkl", "X": "1"},
        "space": {"max-running-requests": [16, 32]}, "strategy": "grid", "concurrency": [1]})
    store.save_study("secret", spec.model_dump(mode="json"), "running")
    store.close()
    before = _digest(db)
    monkeypatch.delenv("HF_TOKEN", raising=False)  # the worker's environment lacks it
    refused = run_cli("worker", "--study", "secret", "--store", f"sqlite:///{db}")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "HF_TOKEN" in refused.stderr and "Traceback" not in refused.stderr
    assert _digest(db) == before
    monkeypatch.setenv("HF_TOKEN", "hf_fromtheworkerenvxyz")
    reader = Store(f"sqlite:///{db}", create=False)
    try:
        loaded = load_stored_study(reader, "secret")
    finally:
        reader.close()
    assert loaded.env == {"HF_TOKEN": "hf_fromtheworkerenvxyz", "X": "1"}
