"""The records themselves: JSON as the store held it before records were typed, copies that
validate, schema versions and their upgrades, and the documents nested in a record."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from cleanslate.bench import LevelResult
from cleanslate.store import (
    SCHEMA_VERSION,
    GuidedStep,
    NewerSchemaError,
    RunRecord,
    RunStatus,
    StudyStatus,
    TrialRecord,
    TrialStatus,
    _records,
    level_metric,
)
from cleanslate.teardown import Target, TargetRecord, TeardownReport
from cleanslate.verdict.check import CheckReport
from tests.store.documents import STORES, check_report, level, recorded_run, teardown_report


def _missing_or_changed(old: Any, new: Any, path: str = "") -> list[str]:
    """Key paths of ``old`` that ``new`` lacks or holds another value at (keys ``new`` adds
    are allowed: fields added since, at their defaults)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [path]
        return [p for k, v in old.items()
                for p in (_missing_or_changed(v, new[k], f"{path}.{k}") if k in new
                          else [f"{path}.{k} (dropped)"])]
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return [path]
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True))
                for p in _missing_or_changed(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def test_records_written_by_the_old_main_read_and_dump_to_the_same_json() -> None:
    """Every run and trial of ``tests/report/data/stores.json`` (what main stored before records
    were typed) loads, and dumps every key it had with the same value."""
    data = json.loads(STORES.read_text())
    count = 0
    for study in data["studies"]:
        for model, documents in ((RunRecord, study["runs"]), (TrialRecord, study["trials"])):
            for document in documents:
                record = model.from_document(document)
                assert record.schema_version == 1
                dumped = record.model_dump(mode="json")
                assert _missing_or_changed(document, dumped) == []
                # And the dump is a fixed point: stored again, it reads back the same.
                assert model.from_document(record.to_document()).model_dump(mode="json") == \
                    dumped
                count += 1
    assert count == 20


def test_a_copy_with_changes_is_validated() -> None:
    run = RunRecord.model_validate(recorded_run())
    copy = run.model_copy(update={"status": "crashed", "verdict_before": check_report("dirty"),
                                  "teardown": teardown_report()})
    assert copy.status is RunStatus.CRASHED
    assert isinstance(copy.verdict_before, CheckReport) and copy.verdict_before.verdict == "dirty"
    assert isinstance(copy.teardown, TeardownReport)
    with pytest.raises(ValidationError):
        run.model_copy(update={"status": "exploded"})
    with pytest.raises(ValidationError):
        run.model_copy(update={"port": "not a port"})
    assert run.model_copy() == run


def test_a_run_keeps_its_verification_once() -> None:
    """The teardown's own ``verify`` is the run's ``verdict_after``: never stored twice."""
    report = TeardownReport.model_validate({**teardown_report(),
                                            "verify": check_report("clean")})
    run = RunRecord.model_validate(recorded_run()).model_copy(update={"teardown": report})
    assert run.teardown is not None and run.teardown.verify is None


def test_schema_version_is_stored_beside_the_fields_not_dumped() -> None:
    run = RunRecord.model_validate(recorded_run())
    assert run.schema_version == SCHEMA_VERSION
    assert "schema_version" not in run.model_dump(mode="json")
    assert run.to_document()["schema_version"] == SCHEMA_VERSION
    assert RunRecord.from_document(recorded_run()).schema_version == 1
    with pytest.raises(NewerSchemaError, match=f"schema version {SCHEMA_VERSION + 1}"):
        RunRecord.from_document({**recorded_run(), "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(ValidationError):
        RunRecord.from_document({**recorded_run(), "schema_version": "two"})


def test_an_old_document_goes_through_every_upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    """How the next layout change is made: a new version and the function from the last one."""
    steps: list[int] = []

    def rename(document: dict[str, Any]) -> dict[str, Any]:
        steps.append(document["schema_version"])
        document = dict(document)
        document["model"] = document.pop("served_model")
        return document

    monkeypatch.setattr(_records, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(_records.UPGRADES, SCHEMA_VERSION, rename)
    older = recorded_run()
    older["served_model"] = older.pop("model")
    older["schema_version"] = SCHEMA_VERSION
    run = RunRecord.from_document(older)
    assert run.model == "sim-llama-8b" and steps == [SCHEMA_VERSION]
    assert run.schema_version == SCHEMA_VERSION
    current = {**recorded_run(), "schema_version": SCHEMA_VERSION + 1}
    assert RunRecord.from_document(current).model == "sim-llama-8b"
    assert steps == [SCHEMA_VERSION]


def test_statuses_are_enums_that_read_as_their_values() -> None:
    assert [s.value for s in RunStatus] == ["launching", "starting", "ready", "stopped",
                                            "failed", "crashed"]
    assert RunStatus.LAUNCHING.running and RunStatus.STARTING.running
    assert [s.value for s in TrialStatus] == ["running", "feasible", "infeasible",
                                              "infra_failed"]
    assert RunStatus.READY.running and not RunStatus.STOPPED.running
    assert TrialStatus.INFEASIBLE.finished and not TrialStatus.INFRA_FAILED.finished
    assert StudyStatus("quarantine") is StudyStatus.QUARANTINE
    assert f"{TrialStatus.FEASIBLE}" == "feasible" and TrialStatus.FEASIBLE == "feasible"


def test_target_json_keeps_its_keys() -> None:
    """``protected`` appears only for a process that was left alone (``stop --json``)."""
    target = Target(pid=5, create_time=1.5, comm="python", command="x" * 300, why="root",
                    uid=0, user="root")
    assert target.as_dict() == {"pid": 5, "create_time": 1.5, "comm": "python",
                                "command": "x" * 200, "why": "root", "uid": 0,
                                "user": "root"}
    left = Target(pid=6, create_time=1.5, comm="sshd", command="sshd", why="session",
                  protected="in this cleanslate process's session")
    assert left.as_dict()["protected"] == "in this cleanslate process's session"
    assert TargetRecord.model_validate(left.as_dict()) == left.record()
    report = TeardownReport(targets=(target.record(),), left_alone=(left.record(),),
                            elapsed_s=0.5)
    dumped = report.model_dump(mode="json")
    assert "protected" not in dumped["targets"][0] and "protected" in dumped["left_alone"][0]


def test_level_metric_is_a_finite_number_or_none() -> None:
    lv = LevelResult.model_validate(level("c=8", output_throughput=1500.0,
                                          request_goodput=None, p99_ttft_ms=None))
    assert level_metric(lv, "output_throughput") == 1500.0
    assert level_metric(lv, "completed") == float(lv.completed)
    assert level_metric(lv, "request_goodput") is None
    assert level_metric(lv, "p99_ttft_ms") is None
    assert level_metric(lv, "no_such_key") is None
    assert level_metric(lv, "partial") is None  # a flag, not a number
    nan = LevelResult.model_validate(level("c=8", output_throughput=math.nan))
    assert level_metric(nan, "output_throughput") is None


def test_a_trial_finds_its_best_level() -> None:
    trial = TrialRecord(study="s", number=0, params={}, best_level="c=8",
                        levels=(LevelResult.model_validate(level("c=1", output_throughput=1.0)),
                                LevelResult.model_validate(level("c=8", output_throughput=8.0))))
    best = trial.level("c=8")
    assert best is not None and best.label == "c=8"
    assert trial.metric("output_throughput") == 8.0
    assert trial.level("c=99") is None
    assert trial.model_copy(update={"best_level": None}).metric("output_throughput") is None


def test_a_launching_run_is_written_as_the_current_version_and_refused_by_an_older_reader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``launching`` is a status a reader of version 2 cannot parse, version 4's fields
    (what watched a level, the configuration in effect) a reader of 3 would drop, and
    version 5's (a level's bottleneck verdict) a reader of 4 refuses, and a reader of 5
    knows no recorded bench (version 6), a reader of 6 would drop a guided trial's notebook
    entry (version 7) and a guided step's carried changes (version 8): the row says its
    version and an older reader refuses it (an input error naming the store), never misreads
    it."""
    run = RunRecord.from_document({**recorded_run(), "status": "launching"})
    document = run.to_document()
    assert document["schema_version"] == 8 and document["status"] == "launching"
    monkeypatch.setattr(_records, "SCHEMA_VERSION", 5)
    with pytest.raises(NewerSchemaError, match="schema version 8"):
        RunRecord.from_document(document)


def test_a_guided_trial_keeps_its_notebook_entry_and_an_older_reader_refuses_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A guided study's trial carries its notebook entry (``guided``, version 7), with the
    changes a step carries from the reverted one it builds on (version 8): it comes back equal,
    and a reader of version 7, which would drop ``base`` and ``carried`` without a word (a
    change of two flags shown as one), refuses the row."""
    entry = GuidedStep(step=4, against=2, level="c=256", verdict="kv_capacity",
                       evidence="KV 99 %", flag="mem-fraction-static", old=0.88, new=0.92,
                       why="more memory", effect=0.12, low=0.01, high=0.24, pairs=3,
                       outcome="kept", note="won the race", base=3,
                       carried={"max-running-requests": 256})
    trial = TrialRecord(study="s", number=4, guided=entry,
                        params={"max-running-requests": 256, "mem-fraction-static": 0.92})
    document = trial.to_document()
    assert document["schema_version"] == 8 and document["guided"]["outcome"] == "kept"
    assert document["guided"]["carried"] == {"max-running-requests": 256}
    assert TrialRecord.from_document(json.loads(json.dumps(document))) == trial
    monkeypatch.setattr(_records, "SCHEMA_VERSION", 7)
    with pytest.raises(NewerSchemaError, match="schema version 8"):
        TrialRecord.from_document(document)
