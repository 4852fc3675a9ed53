"""Studies on namespaced test hosts (issue 15's must-shows, through the CLI): two hosts x two
simulated slots measure a 12-trial grid once each; a slot whose GPU a
decoy holds is quarantined with the decoy's PID in its findings and the decoy is never
signalled; a worker SIGKILLed mid-trial has its run torn down by marker on its host and its
trial run by another worker, against a real PostgreSQL.

Ports: the test hosts share one network (every host is 127.0.0.1), so every slot of every host
needs its own port. A study file gives a slot the same port on every host (``slots[i].port``,
or the study's port plus ``i``), so one host's slots are the study's (``hosts: [fleet-a]``) and
the other host's are ``cleanslate worker --host fleet-b --port P`` processes sharing the store,
as a second machine's workers would be.

Two tests pin core bugs found here (fixed in the core since): a slot that ended closed the SSH
connection its host's other slots share, cutting their commands in flight (the controller once
ended with an error in a launch), and a starting worker stopped on Optuna's refusal to fail a
trial another process had failed a moment before.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._kit import free_port, free_ports
from tests.conftest import Processes, recorded_rows
from tests.fleet.conftest import Cli, MakeFleet
from tests.fleet.hosts import Decoy, Fleet

pytestmark = pytest.mark.slow


GRID = """\
name: NAME
engine: sim
model: sim
HOSTS
fixed: {tp-size: 1, time-scale: 0.25}
space:
  max-running-requests: [16, 32, 64]
  chunked-prefill-size: [512, 1024]
  disable-radix-cache: [true, false]
strategy: grid
workload: {kind: random, input_len: 128, output_len: 16}
concurrency: [4]
duration_s_per_level: DURATION
ready_timeout_s: 60
smoke_timeout_s: 15
grace_s: 5
verify_deadline_s: 20
retries: 1
lease_timeout_s: 10
"""


def study(fleet: Fleet, name: str, hosts: str, duration: float = 1.0,
          half: bool = False) -> Path:
    """The 12-trial grid on ``hosts``; ``half``: its 6 trials with the radix cache on."""
    text = GRID.replace("NAME", name).replace("HOSTS", hosts).replace("DURATION", f"{duration:g}")
    if half:
        text = text.replace("  disable-radix-cache: [true, false]\n", "")
    path = fleet.root / f"{name}.yaml"
    path.write_text(text)
    return path


def two_slots(host: str, p0: int, p1: int) -> str:
    return f"hosts: [{host}]\nslots: [{{gpus: [0], port: {p0}}}, {{gpus: [1], port: {p1}}}]"


def config(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


def results(trials: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [t for t in trials
            if t.get("study", name) == name and t["status"] in ("feasible", "infeasible")]


def wait_for(predicate: Any, timeout: float, what: str, poll: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


# -- two hosts x two slots ----------------------------------------------------------------------


def test_two_hosts_x_two_slots_measure_a_grid_once_each(
        make_fleet: MakeFleet, procs: Processes, figure: Any) -> None:
    fleet = make_fleet(["fleet-a", "fleet-b"], gpus=2)
    cli = Cli(fleet, procs)
    pa0, pa1, pb0, pb1 = free_ports(4)
    db = fleet.root / "four.db"
    store = f"sqlite:///{db}"
    four = study(fleet, "four", two_slots("fleet-a", pa0, pa1))

    started = time.monotonic()
    registered = fleet.cli("tune", str(four), "--store", store, "--register", timeout=120)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    running = {"tune": cli.start("tune", "tune", str(four), "--store", store),
               "w-b0": cli.worker("w-b0", "four", store, "fleet-b", 0, pb0),
               "w-b1": cli.worker("w-b1", "four", store, "fleet-b", 1, pb1)}
    cli.wait_all(running, timeout=600)
    four_s = time.monotonic() - started

    trials = results(recorded_rows(db, "cs_trials"), "four")
    assert len(trials) == 12
    assert len({config(t["params"]) for t in trials}) == 12  # each configuration exactly once
    for t in trials:
        assert t["verdict_before"] == "clean" and t["verdict_after"] == "clean", t
    slots = Counter(lease["slot"] for lease in recorded_rows(db, "cs_leases")
                    if lease["study"] == "four" and lease["outcome"] == "result")
    assert set(slots) == {f"fleet-a/gpus=0/port={pa0}", f"fleet-a/gpus=1/port={pa1}",
                          f"fleet-b/gpus=0/port={pb0}", f"fleet-b/gpus=1/port={pb1}"}, slots
    assert sum(slots.values()) == 12
    runs = [r for r in recorded_rows(db) if r["study"] == "four"]
    assert {r["host"] for r in runs} == {"fleet-a", "fleet-b"}
    assert all(r["status"] not in ("starting", "ready") for r in runs)
    for host in fleet.hosts.values():  # every run's memory is given back on its host
        assert host.ledger_entries() == [], host.alias

    figure(f"12-trial sim grid on namespaced sshd hosts, 2 hosts x 2 slots: {four_s:.1f} s "
           f"on {os.cpu_count()} CPUs (the speed-up against one slot is measured side by side "
           "in benchmarks/fleet.py, not here)")


# -- a decoy on a slot's GPU -----------------------------------------------------------------------


def test_a_decoy_on_a_slots_gpu_quarantines_that_slot_and_is_never_signalled(
        make_fleet: MakeFleet, procs: Processes) -> None:
    fleet = make_fleet(["fleet-a", "fleet-b"], gpus=2,
                       decoys={"fleet-b": Decoy(gpu=1, used_mib=20_000)})
    dirty = fleet["fleet-b"]
    assert dirty.decoy_pid is not None
    ticks = dirty.start_ticks(dirty.decoy_pid)
    cli = Cli(fleet, procs)
    pb0, pb1, pa0 = free_ports(3)
    db = fleet.root / "dirty.db"
    store = f"sqlite:///{db}"
    path = study(fleet, "dirty", two_slots("fleet-b", pb0, pb1))
    path.write_text(path.read_text().replace("  disable-radix-cache: [true, false]\n", ""))
    registered = fleet.cli("tune", str(path), "--store", store, "--register", timeout=120)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    running = {"tune": cli.start("tune", "tune", str(path), "--store", store),
               "w-a0": cli.worker("w-a0", "dirty", store, "fleet-a", 0, pa0)}
    cli.wait_all(running, timeout=600)
    assert "quarantined" in cli.logs["tune"].read_text()

    trials = results(recorded_rows(db, "cs_trials"), "dirty")
    assert len(trials) == 6 and len({config(t["params"]) for t in trials}) == 6
    refused = [t for t in recorded_rows(db, "cs_trials") if t["status"] == "infra_failed"]
    assert [t["cause"] for t in refused] == ["host_not_clean"], refused
    assert {r["port"] for r in recorded_rows(db) if r["study"] == "dirty"} <= {pb0, pa0}

    report = fleet.cli("report", "dirty", "--store", store, "--format", "json")
    assert report.returncode == 0, report.stderr
    [document] = report.json()["studies"]
    slots = {s["slot"]: s for s in document["slots"]}
    bad = slots[f"fleet-b/gpus=1/port={pb1}"]
    assert bad["state"] == "quarantined" and bad["trials"] == 0, bad
    assert bad["reason"], bad
    assert any(str(dirty.decoy_pid) in f["message"] for f in bad["findings"]), bad["findings"]
    good = [slots[f"fleet-b/gpus=0/port={pb0}"], slots[f"fleet-a/gpus=0/port={pa0}"]]
    assert all(s["state"] == "ok" for s in good), good
    assert sum(s["trials"] for s in good) == 6
    # The decoy: never signalled, the same process, still holding its memory.
    assert dirty.decoy_signals() == []
    assert dirty.pid_alive(dirty.decoy_pid, ticks)
    assert [(e["gpu"], e["pid"]) for e in dirty.ledger_entries()] == [(1, dirty.decoy_pid)]


# -- a worker SIGKILLed mid-trial, on PostgreSQL ---------------------------------------------------


def test_a_worker_sigkilled_mid_trial_on_a_fleet_host_is_cleaned_up_and_its_trial_rerun(
        make_fleet: MakeFleet, procs: Processes, postgres_url: str, figure: Any) -> None:
    import psycopg

    fleet = make_fleet(["fleet-a", "fleet-b"], gpus=2)
    name = f"fleet_kill_{os.getpid()}_{int(time.time())}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url.rsplit("/", 1)[0] + "/" + name
    try:
        _sigkill_mid_trial(fleet, Cli(fleet, procs), url, figure)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _rows(url: str, table: str, study_name: str) -> list[dict[str, Any]]:
    """The JSON documents of a PostgreSQL store's table for one study (with the row's state
    for leases), read directly."""
    import psycopg

    columns = "data, state, id" if table == "cs_leases" else "data, null, null"
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            rows = conn.execute(f"select {columns} from {table} where study = %s",
                                (study_name,)).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [{**data, **({"state": state, "id": row_id} if state else {})}
            for data, state, row_id in rows]


def _sigkill_mid_trial(fleet: Fleet, cli: Cli, url: str, figure: Any) -> None:
    pa0, pa1, pb0 = free_ports(3)
    path = study(fleet, "kill", two_slots("fleet-a", pa0, pa1), duration=3.0, half=True)
    registered = fleet.cli("tune", str(path), "--store", url, "--register", timeout=120)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    # Three workers, separate processes, from the start: the victim on fleet-a's GPU 0.
    victim = cli.worker("victim", "kill", url, "fleet-a", 0, pa0)
    others = {"w-a1": cli.worker("w-a1", "kill", url, "fleet-a", 1, pa1),
              "w-b0": cli.worker("w-b0", "kill", url, "fleet-b", 0, pb0)}

    def victims_run() -> dict[str, Any] | None:
        return next((r for r in _rows(url, "cs_runs", "kill")
                     if r["status"] == "ready" and r["port"] == pa0), None)

    run = wait_for(victims_run, 180, "a ready run of the victim", poll=0.1)
    host = fleet["fleet-a"]
    assert run["host"] == "fleet-a" and host.pid_alive(run["pid"]), run
    [lease] = [lease for lease in _rows(url, "cs_leases", "kill")
               if lease["run_id"] == run["id"]]
    victim.send_signal(signal.SIGKILL)  # the worker this test started, by PID
    victim.wait(timeout=10)
    killed_at = time.monotonic()
    assert host.pid_alive(run["pid"]), "the killed worker's server should outlive it"

    def rerun() -> dict[str, Any] | None:
        return next((t for t in _rows(url, "cs_trials", "kill")
                     if t["params"] == lease["params"] and t["number"] != lease["trial"]), None)

    wait_for(rerun, 180, "the trial of the expired lease to run again")
    figure(f"worker SIGKILLed mid-trial on a namespaced host: its trial ran again "
           f"{time.monotonic() - killed_at:.1f} s later on another worker")
    cli.wait_all(others, timeout=600)

    assert not host.pid_alive(run["pid"]), "the killed worker's server was not torn down"
    stopped = next(r for r in _rows(url, "cs_runs", "kill") if r["id"] == run["id"])
    assert stopped["status"] not in ("starting", "ready"), stopped
    assert stopped["teardown"]["targets"], stopped["teardown"]
    assert host.ledger_entries() == [] and fleet["fleet-b"].ledger_entries() == []
    trials = results(_rows(url, "cs_trials", "kill"), "kill")
    assert len(trials) == 6
    assert len({config(t["params"]) for t in trials}) == 6  # no duplicate
    leases = {lease["id"]: lease for lease in _rows(url, "cs_leases", "kill")}
    assert leases[lease["id"]]["state"] == "expired", leases[lease["id"]]
    died = [t for t in _rows(url, "cs_trials", "kill") if t["number"] == lease["trial"]]
    assert [(t["status"], t["cause"]) for t in died] == [("infra_failed", "controller_died")]
    workers = {lease["worker"] for lease in leases.values() if lease["outcome"] == "result"}
    assert len(workers) == 2  # the two that lived measured the rest


# -- the SSH connection that one host's slots share ------------------------------------------------


def test_a_slot_that_ends_leaves_the_connection_of_its_hosts_other_slots_alone(
        make_fleet: MakeFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two slots of one host in one controller: the first ends (as a quarantined slot does)
    while the other runs a command on the host; that command must not fail."""
    import asyncio

    from cleanslate.hosts.base import Executor
    from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
    from cleanslate.store import Store
    from cleanslate.tune.controller import open_optuna
    from cleanslate.tune.fleet import QUARANTINE, Fleet, SlotEnd
    from cleanslate.tune.study import Slot, StudySpec
    from cleanslate.tune.view import TuneView

    fleet = make_fleet(["fleet-a"], gpus=2)
    monkeypatch.setenv("HOME", str(fleet.home))
    monkeypatch.setenv(SIM_GPU_DIR_ENV, str(fleet.ledger_path))
    pa0, pa1 = free_ports(2)
    spec = StudySpec.model_validate({
        "name": "s", "engine": "sim", "model": "sim", "hosts": ["fleet-a"],
        "slots": [{"gpus": [0], "port": pa0}, {"gpus": [1], "port": pa1}],
        "space": {"max-running-requests": [16, 32]}, "strategy": "grid", "concurrency": [1]})
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    seen: dict[int, Any] = {}

    async def work(self: Fleet, slot: Slot, executor: Executor) -> SlotEnd:
        if slot.index == 0:  # busy on the host: a launch, a check, a teardown
            seen[0] = await executor.run(["sleep", "3"], timeout=20)
            return SlotEnd(slot=slot, why="done")
        await asyncio.sleep(1.0)  # the other slot's command is running by now
        seen[1] = await executor.run(["true"], timeout=20)
        return SlotEnd(slot=slot, why=QUARANTINE, message="a test")

    monkeypatch.setattr(Fleet, "_work", work)
    try:
        runner = Fleet(store=store, spec=spec, study=open_optuna(store, spec), view=TuneView(),
                       stop=asyncio.Event(), gpu_backend="sim")
        asyncio.run(runner.run(spec.slot_list()))
    finally:
        store.close()
    assert seen[1].ok, seen[1]
    assert seen[0].ok, f"slot 0's command was cut off when slot 1 ended: {seen[0]}"


# -- two workers starting at once after a death ----------------------------------------------------


def test_a_worker_starting_leaves_a_trial_another_process_failed_meanwhile_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving seen with two workers started at once after a SIGKILL: this worker's
    ``_resume`` reads trial 0 RUNNING, the other worker fails it, then this one tells it."""
    import asyncio

    import optuna

    from cleanslate.hosts import LocalExecutor
    from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
    from cleanslate.store import Store
    from cleanslate.tune.controller import _resume, open_optuna
    from cleanslate.tune.fleet import LEASE_ATTR, Fleet
    from cleanslate.tune.study import StudySpec
    from cleanslate.tune.view import TuneView

    (tmp_path / "gpus").mkdir()
    monkeypatch.setenv(SIM_GPU_DIR_ENV, str(tmp_path / "gpus"))
    spec = StudySpec.model_validate({
        "name": "s", "engine": "sim", "model": "sim", "gpus": [0], "port": free_port(),
        "space": {"max-running-requests": [16, 32]}, "strategy": "grid", "concurrency": [1]})
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        store.save_study("s", spec.model_dump(mode="json"), "running")
        study = open_optuna(store, spec)
        fleet = Fleet(store=store, spec=spec, study=study, view=TuneView(),
                      stop=asyncio.Event(), gpu_backend="sim")
        trial = study.ask(fleet.dists)
        trial.set_user_attr(LEASE_ATTR, 1)  # a lease that is not active any more
        running = optuna.trial.TrialState.RUNNING
        stale = study.get_trials(deepcopy=True, states=(running,))
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)  # the other worker
        real = study.get_trials
        (failed,) = real(deepcopy=True)

        def read(deepcopy: bool = True, states: Any = None) -> Any:
            return stale if states == (running,) else real(deepcopy=deepcopy, states=states)

        monkeypatch.setattr(study, "get_trials", read)
        interrupted = asyncio.run(_resume(LocalExecutor(), store, spec, study, TuneView(), fleet))
        assert interrupted == []  # nothing of this study was running when read from the store
        # Left alone: still the one trial, failed as the other worker told it, with the same
        # attributes and values (nothing re-told, re-queued or marked by this worker).
        (after,) = real(deepcopy=True)
        assert after.number == failed.number
        assert after.state == optuna.trial.TrialState.FAIL
        assert after.user_attrs == failed.user_attrs and after.system_attrs == failed.system_attrs
        assert after.values == failed.values and after.datetime_complete == failed.datetime_complete
    finally:
        store.close()
