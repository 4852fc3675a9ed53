"""An exception in this process while a trial's server runs (during a level, or right after the
launch) tears the server down, verifies the host and records the trial: no process with the
run's marker is left and the trial is not ``running``. Real simulated servers."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from cleanslate.hosts import executor_for
from cleanslate.store import Store
from cleanslate.tune import trial as trial_mod
from cleanslate.tune.study import load_study
from tests._kit import OMIT, study_yaml

pytestmark = pytest.mark.slow

class Injected(Exception):
    """The fault this test injects."""


def _marked(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds the run's marker."""
    needle = f"CLEANSLATE_RUN={marker}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    path = tmp_path / "study.yaml"
    path.write_text(study_yaml(name="errors", space={"fault": [None]}))
    spec, _root = load_study(path)
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    yield spec, store
    # A failing test must not leave its server behind: stop what the store says runs.
    for run in store.runs(study=spec.name):
        if run.status in ("starting", "ready"):
            asyncio.run(trial_mod.stop_server(executor_for(None), store, run, grace_s=2,
                                              verify_deadline_s=10))


def _check_left_nothing(store: Store, spec: Any) -> None:
    runs = store.runs(study=spec.name)
    assert len(runs) == 1
    run = runs[0]
    assert run.status not in ("starting", "ready"), run.status
    assert not _alive(run.pid) and not _alive(run.supervisor_pid)
    assert _marked(run.marker) == []
    assert run.verdict_after is not None and run.verdict_after.verdict == "clean", run.verdict_after
    (trial,) = store.trials(spec.name)
    assert trial.status == "infra_failed" and trial.cause == "controller_error", trial
    assert trial.verdict_after == "clean"
    assert "Injected" in (trial.detail or "")


def test_an_exception_during_a_level_tears_down_and_records(
        lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, store = lab

    async def boom(*_a: Any, **_kw: Any) -> Any:
        raise Injected("a level failed in the controller")

    monkeypatch.setattr(trial_mod, "run_level", boom)
    with pytest.raises(Injected):
        asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0, {"fault": None},
                                        gpu_backend="sim"))
    _check_left_nothing(store, spec)


def test_an_exception_while_stopping_is_recorded_interrupted(
        lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A level that breaks after the study was asked to stop (SIGTERM during a capacity
    search): torn down and verified as any failure, but recorded ``interrupted``, not
    ``controller_error`` (the run was stopped; neither the controller nor the configuration
    failed), and :class:`~cleanslate.tune.trial.Interrupted` raised, as for any stopped
    trial."""
    spec, store = lab
    stop = asyncio.Event()

    async def stopped(*_a: Any, **_kw: Any) -> Any:
        stop.set()
        raise Injected("a level broke as it was stopped")

    monkeypatch.setattr(trial_mod, "run_level", stopped)
    with pytest.raises(trial_mod.Interrupted):  # re-queued by the fleet as a stopped trial
        asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0, {"fault": None},
                                        gpu_backend="sim", stop=stop))
    (run,) = store.runs(study=spec.name)
    assert _marked(run.marker) == [] and not _alive(run.pid)
    assert run.status == "stopped", run.status  # CI once saw it recorded failed
    (trial,) = store.trials(spec.name)
    assert (trial.status, trial.cause) == ("infra_failed", "interrupted"), trial.detail
    assert trial.verdict_after == "clean" and "Injected" in (trial.detail or "")


def test_an_exception_right_after_the_launch_tears_down_and_records(
        lab: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, store = lab
    real_start = trial_mod.start_server

    async def start_then_fail(*args: Any, **kwargs: Any) -> Any:
        outcome = await real_start(*args, **kwargs)
        assert outcome.ok and _alive(outcome.run.pid)
        raise Injected("the controller failed once the server was ready")

    monkeypatch.setattr(trial_mod, "start_server", start_then_fail)
    with pytest.raises(Injected):
        asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0, {"fault": None},
                                        gpu_backend="sim"))
    _check_left_nothing(store, spec)
    assert os.environ.get("CLEANSLATE_SIM_GPU_DIR")


@pytest.mark.parametrize("skew_s", [0.0, 0.2])
def test_a_start_that_fails_after_a_stop_request_is_interrupted_not_infeasible(
        lab: Any, skew_s: float) -> None:
    """Slurm's ``scancel`` signals the worker and its engine at once: the engine dies while
    it starts and the worker is asked to stop, in either order (``skew_s``: the worker's
    request comes that much after the engine's signal). The failed start is not the configuration's
    result: the trial is ``infra_failed``/``interrupted`` (run again elsewhere), and
    :class:`~cleanslate.tune.trial.Interrupted` is raised for the fleet to re-queue it."""
    spec, store = lab
    stop = asyncio.Event()
    signalled: list[int] = []

    async def preempt() -> None:
        while True:  # the engine root, as soon as the run is recorded
            runs = [r for r in store.runs(study=spec.name) if r.pid]
            if runs:
                os.kill(runs[0].pid, signal.SIGTERM)
                signalled.append(runs[0].pid)
                await asyncio.sleep(skew_s)
                stop.set()
                return
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        killer = asyncio.create_task(preempt())
        try:
            await trial_mod.run_trial(executor_for(None), store, spec, 0, {"fault": None},
                                      gpu_backend="sim", stop=stop)
        finally:
            killer.cancel()

    with pytest.raises(trial_mod.Interrupted):
        asyncio.run(scenario())
    assert signalled
    (trial,) = store.trials(spec.name)
    assert trial.status == "infra_failed" and trial.cause == "interrupted", trial
    assert "stopped while the server started" in (trial.detail or ""), trial.detail
    (run,) = store.runs(study=spec.name)
    assert run.status not in ("starting", "ready"), run.status
    assert _marked(run.marker) == [] and not _alive(run.pid)
    assert trial.verdict_after == "clean"


def test_a_host_that_cannot_start_a_run_is_quarantined_not_a_result(
        lab: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run folder cannot be created (the artifacts folder is a file): nothing of the
    configuration ran, so the trial is ``infra_failed``/``launch_failed``, not ``infeasible``,
    and the slot is quarantined (:class:`~cleanslate.tune.trial.HostQuarantined`) so that the
    configuration goes to another slot."""
    spec, store = lab
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("CLEANSLATE_ARTIFACTS", str(blocker))
    with pytest.raises(trial_mod.HostQuarantined) as raised:
        asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0, {"fault": None},
                                        gpu_backend="sim", stop=asyncio.Event()))
    assert "could not start a run: cannot create the run folder" in str(raised.value)
    (trial,) = store.trials(spec.name)
    assert trial.status == "infra_failed" and trial.cause == "launch_failed", trial
    assert "Not a directory" in (trial.detail or ""), trial.detail
    assert store.runs(study=spec.name) == []  # nothing was launched


def test_a_command_the_supervisor_cannot_run_is_the_configurations_result(
        lab: Any, tmp_path: Path) -> None:
    """The engine's command line cannot be executed (a missing program): that is the
    configuration's failure, ``infeasible``, and the slot goes on (no quarantine)."""
    spec, store = lab
    spec = spec.model_copy(update={"launch": [str(tmp_path / "no-such-engine")]})
    record = asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0,
                                             {"fault": None}, gpu_backend="sim",
                                             stop=asyncio.Event()))
    assert record.status == "infeasible", record
    # no engine process, or the supervisor's "cannot start" line (exit 127): engine_missing,
    # on which a study stops (tests/tune/test_systemic.py)
    assert record.cause in ("launch_failed", "engine_missing"), record
    assert "no-such-engine" in (record.detail or "") + (record.log_tail or ""), record


def test_a_level_that_is_not_a_result_is_never_feasible(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A level bounded by a duration too short for one send completes nothing and fails
    nothing: the trial is infeasible with the level's reason, not feasible on no data."""
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    path = tmp_path / "study.yaml"
    path.write_text(study_yaml(name="empty", space={"fault": [None]},
                               requests_per_level=OMIT, duration_s_per_level=1e-9))
    spec, _root = load_study(path)
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0, {"fault": None},
                                    gpu_backend="sim"))
    (trial,) = store.trials(spec.name)
    assert trial.status == "infeasible" and trial.cause == "request_errors", trial
    assert "no request completed" in (trial.detail or ""), trial.detail
    assert trial.level_verdicts == {"c=2": "errors"}, trial.level_verdicts
    assert trial.verdict_after == "clean"
