"""Failures that are not the configuration's (issue 24, point 5): the decision
(:func:`cleanslate.tune._systemic.systemic_failure`) on trial records, and whole studies that
stop on one: a local model path that does not exist is exit 2 before any launch; a model that
exists but does not load (its real log, replayed by a real process through the real launch
and teardown) stops the study with exit 1 and the reason after the first trial, and no
configuration is recorded infeasible."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cleanslate.store import Store, StudyStatus, TrialRecord, TrialStatus
from cleanslate.store._leases import LeaseOutcome, LeaseRecord, LeaseState, config_key
from cleanslate.tune._systemic import (
    NOT_THE_CONFIGURATION,
    normalized,
    systemic_failure,
)
from tests._kit import free_port
from tests.cli.inproc import run_main

DATA = Path(__file__).parents[1] / "engines" / "data"


def _trial(number: int, status: TrialStatus = TrialStatus.INFEASIBLE, cause: str | None = None,
           detail: str | None = None, **params: Any) -> TrialRecord:
    return TrialRecord(study="s", number=number, params=params or {"x": number}, status=status,
                       cause=cause, detail=detail)


# -- the decision ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cause", ["model_load", "engine_missing", "port_in_use"])
def test_a_cause_that_does_not_depend_on_the_flags_stops_at_the_first_trial(cause: str) -> None:
    record = _trial(0, cause=cause, detail="huggingface_hub.errors.HFValidationError: Repo id")
    found = systemic_failure([record], record)
    assert found is not None and found.trials == (0,)
    assert f"({cause})" in found.reason and "HFValidationError" in found.reason


def test_results_and_other_causes_of_one_trial_are_results() -> None:
    for record in (_trial(0, TrialStatus.FEASIBLE), _trial(0, cause="oom", detail="CUDA out"),
                   _trial(0, cause="python_exception", detail="RuntimeError: x"),
                   _trial(0, TrialStatus.INFRA_FAILED, cause="host_not_clean")):
        assert systemic_failure([record], record) is None


PID_TEXT = ("(Worker pid={pid}) ERROR 12-01 23:{m}:02 [core.py:{line}] RuntimeError: cannot open "
            "/var/run/engine-{pid}/socket at 0x7f{hexa} after {secs} s")


def _same(number: int, **params: Any) -> TrialRecord:
    text = PID_TEXT.format(pid=4100 + 37 * number, m=10 + number, line=90 + number,
                           hexa=f"{0xa3b0 + number:x}", secs=1.5 + number)
    return _trial(number, cause="python_exception", detail=text, **params)


def test_the_same_text_on_the_first_three_configurations_stops_the_study() -> None:
    first, second, third = _same(0, x=1), _same(1, x=2), _same(2, x=3)
    assert len({first.detail, second.detail, third.detail}) == 3  # PIDs, times, paths differ
    assert systemic_failure([first], first) is None
    assert systemic_failure([first, second], second) is None
    found = systemic_failure([second, first, third], third)
    assert found is not None and found.trials == (0, 1, 2)
    assert "first 3 configurations (trials 0, 1, 2)" in found.reason
    assert "python_exception" in found.reason
    # in a fleet the third to end may have the higher number: the first three results count
    found = systemic_failure([first, _same(3, x=4)], second)
    assert found is not None and found.trials == (0, 3, 1)


@pytest.mark.parametrize("case", ["other text", "a result among them", "the same flags", "oom",
                                  "slo_miss", "not among the first three"])
def test_the_same_text_rule_does_not_fire_otherwise(case: str) -> None:
    first, second, third = _same(0, x=1), _same(1, x=2), _same(2, x=3)
    trials = [first, second]
    if case == "other text":
        third = third.model_copy(update={"detail": "RuntimeError: --x 3 is not supported"})
    elif case == "a result among them":
        trials = [first, _trial(1, TrialStatus.FEASIBLE, x=2)]
    elif case == "the same flags":
        third = third.model_copy(update={"params": dict(first.params)})
    elif case in ("oom", "slo_miss"):
        trials = [t.model_copy(update={"cause": case}) for t in trials]
        third = third.model_copy(update={"cause": case})
    else:
        trials = [_trial(0, TrialStatus.FEASIBLE, x=0), first.model_copy(update={"number": 1}),
                  second.model_copy(update={"number": 2})]
        third = third.model_copy(update={"number": 3})
    assert systemic_failure([*trials, third], third) is None


def test_normalized_texts_keep_words_and_flags() -> None:
    a = "OSError: [Errno 98] bind 127.0.0.1:30012 failed (run r-20261201-233940-3433, pid 41)"
    b = "OSError: [Errno 98] bind 127.0.0.1:30999 failed (run r-20261202-101010-beef, pid 7)"
    assert normalized(a) == normalized(b)
    assert normalized("unknown flag --tp-size 2") != normalized("unknown flag --pp-size 2")
    assert "deadbeef" not in normalized("at 0xdeadbeef12") and "cafe" in normalized("cafe")
    assert normalized("/models/a/x.safetensors missing") == normalized("./b missing")


# -- whole studies ---------------------------------------------------------------------------------


def _study(tmp_path: Path, model: str, argv: list[str], space: dict[str, Any],
           name: str = "systemic") -> Path:
    lines = [f"name: {name}", "engine: command", f"model: {json.dumps(model)}",
             f"port: {free_port()}", f"argv: {json.dumps(argv)}", f"space: {json.dumps(space)}",
             "strategy: grid", "concurrency: [1]", "requests_per_level: 2",
             "ready_timeout_s: 20", "smoke_timeout_s: 5", "grace_s: 2", "verify_deadline_s: 10",
             "retries: 0"]
    path = tmp_path / "study.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_missing_model_path_is_exit_2_at_its_line_before_any_launch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no" / "such-model"
    path = _study(tmp_path, str(missing), [sys.executable, "-c", "raise SystemExit(9)", "{port}"],
                  {"x": [1, 2, 3, 4]})
    db = tmp_path / "s.db"
    for extra in ((), ("--check",)):
        res = run_main(capsys, monkeypatch, "tune", str(path), "--store", f"sqlite:///{db}",
                       *extra)
        assert res.code == 2, (res.out, res.err)
        assert f"{path}:3" in res.err and f"model '{missing}' does not exist on" in res.err
        assert "Traceback" not in res.err
        assert not db.exists()  # nothing recorded, so nothing launched
    # a repo id is not looked for on disk, nor is a path that exists
    for model in ("org/name", str(tmp_path)):
        res = run_main(capsys, monkeypatch, "tune",
                       str(_study(tmp_path, model, ["true", "{port}"], {"x": [1]})), "--check")
        assert res.code == 0, (res.out, res.err)


def test_serve_refuses_a_missing_model_path(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = run_main(capsys, monkeypatch, "serve", "--engine", "sim", "--model", "./nope",
                   "--store", f"sqlite:///{tmp_path / 's.db'}", "--gpu-backend", "none")
    assert res.code == 2, (res.out, res.err)
    assert "model: model './nope' does not exist on" in res.err and "Traceback" not in res.err


def _records(db: Path, name: str) -> tuple[Store, list[TrialRecord], list[LeaseRecord]]:
    store = Store(f"sqlite:///{db}")
    return store, store.trials(name), store.leases(name)


@pytest.mark.slow  # one launch and teardown of a real process, the settle window: 1.8 s here
def test_a_model_that_does_not_load_stops_the_study_after_its_first_trial(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The model path exists (an empty folder, so the path check lets it through); the engine
    # replays transformers serve's real log of an empty folder as its model and exits 1.
    model = tmp_path / "empty-model"
    model.mkdir()
    log = DATA / "model_load_transformers_empty_folder.log"
    argv = ["sh", "-c", 'grep -v "^#" "$0"; exit 1', str(log), "{port}"]
    path = _study(tmp_path, str(model), argv, {"x": [1, 2, 3, 4]})
    db = tmp_path / "s.db"
    t0 = time.monotonic()
    res = run_main(capsys, monkeypatch, "tune", str(path), "--store", f"sqlite:///{db}",
                   "--gpu-backend", "none")
    elapsed = time.monotonic() - t0
    assert res.code == 1, (res.out, res.err)
    assert "Traceback" not in res.out + res.err
    out = " ".join(res.out.split())
    assert "stopped: a failure that is not the configuration's" in out, res.out
    assert "the model cannot be loaded (model_load)" in out
    assert "Unrecognized processing class" in out
    assert "no feasible configuration" not in out
    store, trials, leases = _records(db, "systemic")
    try:
        assert [t.number for t in trials] == [0]  # one launch, then the study stopped
        (trial,) = trials
        assert trial.status == TrialStatus.INFRA_FAILED, trial
        assert trial.cause == NOT_THE_CONFIGURATION
        assert trial.detail is not None and "model_load" in trial.detail
        assert trial.verdict_after == "clean"
        assert [(lease.state, lease.outcome) for lease in leases] == [
            (LeaseState.RELEASED, LeaseOutcome.REQUEUED)]
        record = store.study("systemic")
        assert record is not None and record.status == StudyStatus.ERROR
        assert not [t for t in trials if t.status == TrialStatus.INFEASIBLE]
    finally:
        store.close()
    print(f"model_load study: exit 1 after {elapsed:.1f} s")


@pytest.mark.slow  # three launches and teardowns of a real process: 6-10 s here
def test_the_same_failure_on_three_configurations_requeues_all_three(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The same line on every configuration, but for its PID and a time: not the flags'.
    script = ('echo "RuntimeError: engine worker $$ lost its device after $(date +%N) ns"; '
              "exit 1")
    path = _study(tmp_path, "org/name", ["sh", "-c", script, "sh", "{port}"], {"x": [1, 2, 3, 4]},
                  name="same-text")
    db = tmp_path / "s.db"
    res = run_main(capsys, monkeypatch, "tune", str(path), "--store", f"sqlite:///{db}",
                   "--gpu-backend", "none")
    assert res.code == 1, (res.out, res.err)
    out = " ".join(res.out.split())
    assert "the first 3 configurations (trials 0, 1, 2), which differ in their flags" in out
    store, trials, leases = _records(db, "same-text")
    try:
        assert sorted(t.number for t in trials) == [0, 1, 2]
        assert {(t.status, t.cause) for t in trials} == {
            (TrialStatus.INFRA_FAILED, NOT_THE_CONFIGURATION)}
        assert [lease.outcome for lease in leases] == [LeaseOutcome.REQUEUED] * 3
        # resuming runs the first configuration again: the plan is not done
        plan = [(config_key({"x": x}), {"x": x}) for x in (1, 2, 3, 4)]
        claim = store.claim_lease(
            LeaseRecord(study="same-text", key="", worker="w", host="local", port=1, slot="s"),
            timeout_s=60, plan=plan, limit=4)
        assert claim.lease is not None and claim.lease.params == {"x": 1} and not claim.done
    finally:
        store.close()


@pytest.mark.slow  # a real transformers serve start: about 10-20 s on this 2-core machine
def test_transformers_serve_with_an_empty_folder_stops_the_study(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    script = Path(sys.executable).parent / "transformers"
    command = str(script) if script.exists() else shutil.which("transformers")
    if command is None:
        pytest.skip("the `transformers` command is not installed")
    model = tmp_path / "empty-model"
    model.mkdir()
    path = _study(tmp_path, str(model), [command, "serve", "{model}", "--port", "{port}"],
                  {"device": ["cpu"], "dtype": ["float32", "bfloat16"]}, name="hf-empty")
    text = path.read_text().replace("ready_timeout_s: 20", "ready_timeout_s: 120")
    path.write_text(text + "env: {HF_HUB_OFFLINE: '1'}\n")
    db = tmp_path / "s.db"
    t0 = time.monotonic()
    res = run_main(capsys, monkeypatch, "tune", str(path), "--store", f"sqlite:///{db}",
                   "--gpu-backend", "none")
    assert res.code == 1, (res.out, res.err)
    assert "the model cannot be loaded (model_load)" in " ".join(res.out.split())
    store, trials, _leases = _records(db, "hf-empty")
    try:
        assert [(t.number, t.status, t.cause) for t in trials] == [
            (0, TrialStatus.INFRA_FAILED, NOT_THE_CONFIGURATION)]
    finally:
        store.close()
    print(f"transformers serve, empty folder: exit 1 after {time.monotonic() - t0:.1f} s")


@pytest.mark.slow  # two slots launching at once, one teardown each: 6-7 s here
def test_a_fleet_stops_every_slot_and_records_nothing_infeasible(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = DATA / "model_load_vllm_missing_path.log"
    path = _study(tmp_path, "org/name", ["sh", "-c", 'grep -v "^#" "$0"; exit 1', str(log),
                                         "{port}"], {"x": [1, 2, 3, 4, 5, 6]}, name="fleet")
    path.write_text(path.read_text() + f"slots: [{{gpus: [0], port: {free_port()}}}, "
                    f"{{gpus: [1], port: {free_port()}}}]\n")
    db = tmp_path / "s.db"
    (tmp_path / "gpus").mkdir()  # a simulated GPU ledger: the slots' GPUs 0 and 1
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    res = run_main(capsys, monkeypatch, "tune", str(path), "--store", f"sqlite:///{db}",
                   "--gpu-backend", "sim")
    assert res.code == 1, (res.out, res.err)
    assert "the model cannot be loaded (model_load)" in " ".join(res.out.split()), res.out
    store, trials, leases = _records(db, "fleet")
    try:
        assert 1 <= len(trials) <= 2  # the other slot's trial, if one had started, stopped too
        assert all(t.status == TrialStatus.INFRA_FAILED for t in trials), trials
        assert all(lease.state == LeaseState.RELEASED and lease.outcome == LeaseOutcome.REQUEUED
                   for lease in leases), leases
    finally:
        store.close()


@pytest.mark.slow  # tune --register, then a worker with one launch and teardown: 3-4 s
def test_a_worker_exits_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = _study(tmp_path, "org/name", ["no-such-engine-cleanslate", "{port}"],
                  {"x": [1, 2, 3]}, name="worker-missing")
    store_url = f"sqlite:///{tmp_path / 's.db'}"
    res = run_main(capsys, monkeypatch, "tune", str(path), "--store", store_url, "--register")
    assert res.code == 0, (res.out, res.err)
    res = run_main(capsys, monkeypatch, "worker", "--study", "worker-missing", "--store",
                   store_url, "--gpu-backend", "none")
    assert res.code == 1, (res.out, res.err)
    out = " ".join(res.out.split())
    assert "stopped: a failure that is not the configuration's: the engine's executable " \
           "cannot be started (engine_missing)" in out, res.out
    assert "cannot start no-such-engine-cleanslate: [Errno 2]" in out
    assert "Traceback" not in res.out + res.err
    store = Store(store_url)
    try:
        assert [(t.status, t.cause) for t in store.trials("worker-missing")] == [
            (TrialStatus.INFRA_FAILED, NOT_THE_CONFIGURATION)]
        record = store.study("worker-missing")
        assert record is not None and record.status == StudyStatus.ERROR
    finally:
        store.close()
