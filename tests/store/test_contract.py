"""The store's contract, run on every database it supports: SQLite and PostgreSQL.

Like Optuna's storage tests (``optuna.testing.pytest_storages``): one suite, each test on a fresh
SQLite file and on a fresh database of a real PostgreSQL server (the ``store_url`` fixture of
``tests/store/conftest.py``). Leases and slots: ``test_leases.py``.
What every implementation must do: records go in and come back equal and typed; unknown ids are
input errors that help; runs are listed by status and study, oldest first; studies and trials
are created and updated in place; nothing secret is ever written; ``create=False`` writes
nothing and reads a database without cleanslate's tables as empty; every row carries its schema
version, rows without one load, and rows of a newer one are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, select
from sqlalchemy.orm import Session

from cleanslate.bench import LevelResult
from cleanslate.errors import InputError
from cleanslate.redact import REDACTED
from cleanslate.store import (
    SCHEMA_VERSION,
    RunRecord,
    RunStatus,
    Store,
    StudyStatus,
    TrialRecord,
    TrialStatus,
)
from cleanslate.store._tables import RunRow, StudyRow, TrialRow
from cleanslate.teardown import TeardownReport
from cleanslate.verdict.check import CheckReport
from cleanslate.verdict.findings import Finding, Verdict
from tests.store.documents import check_report, finding, level, teardown_report


def run_record(run_id: str = "r-1", **changes: Any) -> RunRecord:
    """A run with every nested document filled in, and nothing secret in it."""
    fields: dict[str, Any] = {
        "id": run_id, "host": "local", "engine": "sim", "model": "sim-llama-8b",
        "argv": ("python", "-m", "cleanslate", "sim", "serve", "--port", "30000"),
        "flags": {"max-running-requests": 64, "time-scale": 0.25}, "env": {"X": "1"},
        "marker": run_id, "port": 30000, "gpus": (0,), "url": "http://127.0.0.1:30000",
        "log_path": f"/runs/{run_id}/server.log", "artifacts_dir": f"/runs/{run_id}",
        "status": RunStatus.STOPPED, "pid": 53, "pgid": 53, "sid": 53, "create_time": 10.5,
        "supervisor_pid": 52, "supervisor_create_time": 10.25, "started_at": 100.0,
        "ready_at": 101.5, "stopped_at": 110.0, "phases": {"launch_s": 0.5, "ready_s": 1.0},
        "verdict_before": check_report("clean"), "verdict_after": check_report("clean"),
        "teardown": teardown_report(), "shm_before": ("sim_x",), "study": "s", "trial": 0,
        "boot_id": "b-1", "machine_id": "m-1", "cgroup": None, "user": "root",
    }
    fields.update(changes)
    return RunRecord.model_validate(fields)


def trial_record(number: int = 0, **changes: Any) -> TrialRecord:
    fields: dict[str, Any] = {
        "study": "s", "number": number, "params": {"max-running-requests": 64},
        "flags": {"max-running-requests": 64, "time-scale": 0.25},
        "status": TrialStatus.FEASIBLE, "value": 1500.0, "best_level": "c=8",
        "levels": (level("c=1", output_throughput=300.0), level("c=8", output_throughput=1500.0)),
        "level_verdicts": {"c=1": "ok", "c=8": "ok"}, "phases": {"total_s": 12.5},
        "run_id": "r-1", "argv": ("python", "-m", "cleanslate"), "host": "local",
        "verdict_before": "clean", "verdict_after": "clean", "started_at": 100.0,
        "finished_at": 112.5,
    }
    fields.update(changes)
    return TrialRecord.model_validate(fields)


def _documents(store: Store, table: Any) -> list[dict[str, Any]]:
    """The JSON documents of a table as the database holds them (not through the store)."""
    with Session(store.engine) as session:
        return [dict(d) for d in session.scalars(select(table.data))]


# -- runs -----------------------------------------------------------------------------------------


def test_a_run_comes_back_equal_and_typed(store: Store) -> None:
    run = run_record()
    store.save_run(run)
    back = store.get_run("r-1")
    assert back == run
    assert isinstance(back.status, RunStatus) and back.status == RunStatus.STOPPED
    assert isinstance(back.verdict_before, CheckReport)
    assert isinstance(back.verdict_after, CheckReport)
    assert back.verdict_after.verdict == Verdict.CLEAN
    assert isinstance(back.teardown, TeardownReport) and back.teardown.verify is None
    assert back.teardown.targets[0].why == "supervisor"


def test_saving_a_run_again_replaces_it(store: Store) -> None:
    store.save_run(run_record(status=RunStatus.READY, verdict_after=None, stopped_at=None))
    assert store.get_run("r-1").status == RunStatus.READY
    assert [r.id for r in store.runs(status=RunStatus.READY)] == ["r-1"]
    store.save_run(store.get_run("r-1").model_copy(update={
        "status": "crashed", "verdict_after": check_report("dirty", finding("left behind"))}))
    back = store.get_run("r-1")
    assert back.status == RunStatus.CRASHED and back.verdict_after is not None
    assert back.verdict_after.verdict == Verdict.DIRTY
    assert store.runs(status=RunStatus.READY) == []
    assert [r.id for r in store.runs()] == ["r-1"]


def test_an_unknown_run_is_an_input_error_naming_recent_runs(store: Store) -> None:
    with pytest.raises(InputError) as empty:
        store.get_run("nope")
    assert "no run 'nope'" in empty.value.message
    assert "no runs are recorded" in (empty.value.hint or "")
    for i in range(7):
        store.save_run(run_record(f"r-{i}", started_at=100.0 + i))
    with pytest.raises(InputError) as info:
        store.get_run("nope")
    assert info.value.hint == "recent runs: r-6, r-5, r-4, r-3, r-2"


def test_runs_by_status_and_study_oldest_first(store: Store) -> None:
    store.save_run(run_record("b", started_at=2.0, study="s", status=RunStatus.READY))
    store.save_run(run_record("a", started_at=1.0, study="s", status=RunStatus.STOPPED))
    store.save_run(run_record("c", started_at=3.0, study=None, trial=None,
                              status=RunStatus.READY))
    assert [r.id for r in store.runs()] == ["a", "b", "c"]
    assert [r.id for r in store.runs(study="s")] == ["a", "b"]
    assert [r.id for r in store.runs(status=RunStatus.READY)] == ["b", "c"]
    assert [r.id for r in store.runs(status=RunStatus.READY, study="s")] == ["b"]
    assert store.runs(study="other") == []


# -- studies and trials ---------------------------------------------------------------------------


def test_studies_are_created_once_and_updated(store: Store) -> None:
    assert store.study("s") is None and store.studies() == []
    created = store.save_study("s", {"name": "s", "engine": "sim"}, StudyStatus.RUNNING)
    store.save_study("t", {"name": "t"}, StudyStatus.RUNNING)
    again = store.save_study("s", {"name": "s", "engine": "sim", "seed": 1},
                             StudyStatus.FINISHED)
    assert again == created
    study = store.study("s")
    assert study is not None
    assert study.status == StudyStatus.FINISHED and isinstance(study.status, StudyStatus)
    assert study.spec == {"name": "s", "engine": "sim", "seed": 1}
    assert study.created_at == created and study.updated_at >= created
    assert store.studies() == ["s", "t"]


def test_study_time_adds_up(store: Store) -> None:
    assert store.add_study_time("unknown", 2.5) == 2.5
    store.save_study("s", {"name": "s"}, StudyStatus.RUNNING)
    assert store.add_study_time("s", 1.5) == 1.5
    assert store.add_study_time("s", 2.0) == 3.5
    study = store.study("s")
    assert study is not None and study.elapsed_s == 3.5


def test_trials_are_inserted_then_updated_in_place(store: Store) -> None:
    first = store.save_trial(trial_record(0, status=TrialStatus.RUNNING, value=None,
                                          best_level=None, levels=(), level_verdicts={}))
    second = store.save_trial(trial_record(1, status=TrialStatus.RUNNING, value=None,
                                           best_level=None, levels=(), level_verdicts={}))
    assert first.id is not None and second.id is not None and first.id != second.id
    done = store.save_trial(first.model_copy(update={
        "status": "feasible", "value": 1500.0, "best_level": "c=8",
        "levels": trial_record().levels, "level_verdicts": {"c=1": "ok", "c=8": "ok"}}))
    assert done.id == first.id
    trials = store.trials("s")
    assert [t.number for t in trials] == [0, 1]
    assert trials[0] == done
    assert isinstance(trials[0].levels[1], LevelResult)
    assert trials[0].metric("output_throughput") == 1500.0
    assert [t.number for t in store.trials("s", status=TrialStatus.RUNNING)] == [1]
    assert [t.number for t in store.trials("s", status=TrialStatus.FEASIBLE)] == [0]
    assert store.trials("other") == []


def test_a_trial_comes_back_typed(store: Store) -> None:
    saved = store.save_trial(trial_record(
        status=TrialStatus.INFEASIBLE, verdict_after="dirty",
        findings_after=(finding("a process was left"),),
        level_verdicts={"c=1": "ok", "c=8": "slo_miss"}))
    [back] = store.trials("s")
    assert back == saved
    assert back.status == TrialStatus.INFEASIBLE and back.verdict_after == Verdict.DIRTY
    assert isinstance(back.findings_after[0], Finding)
    assert back.level_verdicts["c=8"] == "slo_miss"


# -- redaction ------------------------------------------------------------------------------------

SECRETS = ("hf_contract_secret_1", "sk-contract-abcdef12", "pg-contract-pass-3",
           "bearer-contract-tok-4")


def test_nothing_secret_is_written_and_records_read_back_redacted(store: Store) -> None:
    store.save_run(run_record(
        env={"HF_TOKEN": "hf_contract_secret_1", "DB": "postgresql://u:pg-contract-pass-3@h/d"},
        argv=("vllm", "serve", "m", "--api-key", "sk-contract-abcdef12"),
        flags={"api-key": "sk-contract-abcdef12"},
        log_tail="loaded hf_contract_secret_1\nAuthorization: Bearer bearer-contract-tok-4\n",
        verdict_after=check_report("dirty", finding("stray x --api-key sk-contract-abcdef12")),
        teardown=teardown_report("curl -H 'Authorization: Bearer bearer-contract-tok-4'")))
    store.save_trial(trial_record(
        flags={"api-key": "sk-contract-abcdef12"}, detail="HF_TOKEN=hf_contract_secret_1",
        findings_after=(finding("x --api-key sk-contract-abcdef12"),)))
    store.save_study("s", {"name": "s", "env": {"HF_TOKEN": "hf_contract_secret_1"}},
                     StudyStatus.RUNNING)
    with Session(store.engine) as session:
        raw = json.dumps([*_documents(store, RunRow), *_documents(store, TrialRow),
                          *session.scalars(select(StudyRow.spec))])
    for secret in SECRETS:
        assert secret not in raw, secret
    run = store.get_run("r-1")
    assert run.env["HF_TOKEN"] == REDACTED and run.argv[-1] == REDACTED
    assert run.marker == "r-1" and run.log_path == "/runs/r-1/server.log"  # identity kept
    [trial] = store.trials("s")
    assert trial.flags["api-key"] == REDACTED


# -- create=False ---------------------------------------------------------------------------------


def test_a_reading_store_writes_nothing_and_reads_no_tables_as_empty(store_url: str) -> None:
    if store_url.startswith("sqlite"):
        with pytest.raises(InputError, match="no store at"):
            Store(store_url, create=False)
        Path(store_url.removeprefix("sqlite:///")).touch()  # a database without our tables
    reader = Store(store_url, create=False)
    try:
        assert reader.runs() == [] and reader.studies() == []
        assert reader.study("s") is None and reader.trials("s") == []
        with pytest.raises(InputError, match="no run 'r-1'") as info:
            reader.get_run("r-1")
        assert "holds no cleanslate records" in (info.value.hint or "")
        assert not inspect(reader.engine).has_table(RunRow.__tablename__)
    finally:
        reader.close()
    writer = Store(store_url)
    writer.save_run(run_record())
    writer.close()
    reader = Store(store_url, create=False)
    try:
        assert reader.get_run("r-1") == run_record()
    finally:
        reader.close()


# -- schema versions ------------------------------------------------------------------------------


def test_every_row_carries_the_schema_version(store: Store) -> None:
    store.save_run(run_record())
    store.save_trial(trial_record())
    for table in (RunRow, TrialRow):
        [document] = _documents(store, table)
        assert document["schema_version"] == SCHEMA_VERSION
    assert "schema_version" not in store.get_run("r-1").model_dump(mode="json")
    assert store.get_run("r-1").schema_version == SCHEMA_VERSION


def _raw_rows(store: Store, run: dict[str, Any], trial: dict[str, Any]) -> None:
    with Session(store.engine) as session, session.begin():
        session.add(RunRow(id=run["id"], host=run["host"], engine=run["engine"],
                           model=run["model"], status=run["status"], data=run,
                           started_at=run["started_at"], updated_at=1.0, study=run["study"],
                           trial=run["trial"]))
        session.add(TrialRow(study=trial["study"], number=trial["number"],
                             status=trial["status"], data=trial, started_at=1.0,
                             updated_at=1.0))


def test_rows_without_a_schema_version_load_as_version_1(store: Store) -> None:
    """What cleanslate wrote before records were typed: the same JSON, no version."""
    run = run_record().model_dump(mode="json")
    trial = trial_record().model_dump(mode="json")
    assert "schema_version" not in run and "schema_version" not in trial
    _raw_rows(store, run, trial)
    back = store.get_run("r-1")
    assert back.schema_version == 1 and back == run_record(schema_version=1)
    [old] = store.trials("s")
    assert old.schema_version == 1 and old.levels == trial_record().levels
    store.save_run(back)  # saved again: at the current version
    assert _documents(store, RunRow)[0]["schema_version"] == SCHEMA_VERSION


def test_rows_of_a_newer_schema_are_refused(store: Store) -> None:
    newer = SCHEMA_VERSION + 1
    _raw_rows(store, {**run_record().model_dump(mode="json"), "schema_version": newer},
              {**trial_record().model_dump(mode="json"), "schema_version": newer})
    for read in (lambda: store.get_run("r-1"), store.runs, lambda: store.trials("s")):
        with pytest.raises(InputError) as info:
            read()
        assert f"schema version {newer}" in info.value.message
        assert "newer cleanslate" in (info.value.hint or "")


def test_an_invalid_row_is_an_input_error_naming_the_field(store: Store) -> None:
    bad = {**run_record().model_dump(mode="json"), "status": "exploded"}
    _raw_rows(store, bad, trial_record().model_dump(mode="json"))
    with pytest.raises(InputError) as info:
        store.get_run("r-1")
    assert "not valid" in info.value.message and "status" in info.value.message
