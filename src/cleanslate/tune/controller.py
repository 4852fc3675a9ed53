"""The study controller: Optuna ask/tell from one thread, every trial a verified cycle, resume.

Resume: the Optuna study and our trial records live in the store. Rerunning the same study
keeps every finished trial; a trial that was running when a controller died is cleaned up (its
server found by the run marker through the recorded run) and its configuration run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from pydantic_core import to_jsonable_python

from cleanslate.config import line_of
from cleanslate.engines import check_flags, engine_help_options
from cleanslate.errors import InputError
from cleanslate.hosts.base import Executor
from cleanslate.launch.lifecycle import adapter_for
from cleanslate.store import Store
from cleanslate.store._trials import StudyStatus, TrialRecord, TrialStatus
from cleanslate.tune.space import (
    CONSTRAINT_ATTR,
    distributions,
    make_sampler,
    planned_configs,
    trial_budget,
)
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import HostQuarantined, Interrupted, recover_host, run_trial
from cleanslate.tune.view import TuneView


@dataclass
class StudyOutcome:
    """How a run of the controller ended."""

    trials: list[TrialRecord]
    new_trials: int
    best: TrialRecord | None
    stopped_by: str  # "budget", "plan", "hours", "quarantine", "interrupted", "error"
    message: str = ""
    report: Any = None
    resumed: list[str] = field(default_factory=list)


async def validate_study_flags(spec: StudySpec, root: yaml.Node | None, path: Path,
                               executor: Executor) -> str | None:
    """Check every flag the study names against the engine's ``--help`` on the host, before any
    GPU time is spent. Unknown (or removed, or ambiguous) flags are input errors at file:line;
    returns a note when the engine's help is not available (not installed there), or the
    warnings about flags the engine accepts but that need a word (deprecated, abbreviated)."""
    from cleanslate.launch.config import ServeConfig

    config = ServeConfig(engine=spec.engine, model=spec.model, launch=spec.launch,
                         argv=spec.argv, python=spec.python, readiness_path=spec.readiness_path)
    adapter = adapter_for(config, executor)
    options, note = await engine_help_options(adapter, executor)
    if options is None:
        return note
    warnings: list[str] = []
    for section, names in (("fixed", spec.fixed), ("space", spec.space),
                           ("baseline", spec.baseline)):
        for key in names:
            line = line_of(root, (section, key))
            for warning in check_flags({key: True}, options, engine=spec.engine,
                                       where=f"{path}:{line}" if line else str(path),
                                       adapter=adapter):
                warnings.append(f"{path}:{line}: {warning}" if line else warning)
    # Accepted flags that need a word (deprecated, abbreviated) are said with the plan, not
    # as a failure: the study runs.
    return "; ".join(warnings) if warnings else None


def _defaults() -> dict[str, Any]:
    """The JSON form of every study key's default (keys without one are left out)."""
    out: dict[str, Any] = {}
    for name, info in StudySpec.model_fields.items():
        if not info.is_required():
            out[name] = to_jsonable_python(info.get_default(call_default_factory=True))
    return out


def _normalized(spec: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A stored or current spec without ``budget`` (it may change between runs) and without
    keys at their default value: a key added to the schema later, absent from a study stored
    before, compares equal to its default."""
    return {k: v for k, v in spec.items()
            if k != "budget" and not (k in defaults and defaults[k] == v)}


def same_definition(store: Store, stored: dict[str, Any], spec: StudySpec) -> bool:
    """Whether ``spec`` defines the study ``stored`` in ``store`` (compared as the store keeps
    it, redacted: an ``env`` secret is never kept, so it cannot be compared)."""
    defaults = _defaults()
    current = store.redacted(spec.model_dump(mode="json"))
    return _normalized(store.redacted(stored), defaults) == _normalized(current, defaults)


def _best(trials: list[TrialRecord], spec: StudySpec) -> TrialRecord | None:
    feasible = [t for t in trials if t.status == TrialStatus.FEASIBLE and t.value is not None]
    if not feasible:
        return None
    def key(t: TrialRecord) -> float:
        return t.value or 0.0

    return max(feasible, key=key) if spec.objective.direction == "maximize" else min(
        feasible, key=key)


def _penalty(spec: StudySpec) -> float:
    return 0.0 if spec.objective.direction == "maximize" else 1e12


async def run_study(
    executor: Executor,
    store: Store,
    spec: StudySpec,
    *,
    view: TuneView | None = None,
    gpu_backend: str = "auto",
) -> StudyOutcome:
    """Run (or resume) a study until its plan or budget is done."""
    view = view or TuneView()
    existing = store.study(spec.name)
    if existing is not None and existing.spec and not same_definition(
            store, existing.spec, spec):
        raise InputError(
            f"a study named {spec.name!r} with a different definition is already in "
            f"{store.display_url}",
            where="name", hint="give the study a new name to start over, or restore the file "
            "(only budget: may change between runs)")
    store.save_study(spec.name, spec.model_dump(mode="json"), StudyStatus.RUNNING)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=spec.name, storage=store.url,
                                direction=spec.objective.direction,
                                sampler=make_sampler(spec), load_if_exists=True)
    dists = distributions(spec)
    resumed = await _resume(executor, store, spec, study, view)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    total = trial_budget(spec)
    plan = planned_configs(spec)
    new = 0
    retry_params: list[dict[str, Any]] = [dict(t.params) for t in resumed]
    stopped_by = "budget"
    message = ""
    quarantine_report = None
    records = store.trials(spec.name)
    view.study_started(spec, total, sum(1 for t in records if t.status.finished))
    clock = time.monotonic()
    try:
        while True:
            records = store.trials(spec.name)
            done = [t for t in records if t.status.finished]
            if len(done) >= total:
                stopped_by = "plan" if plan is not None and len(done) >= len(plan) else "budget"
                break
            spent = store.add_study_time(spec.name, time.monotonic() - clock)
            clock = time.monotonic()
            if spec.budget.hours is not None and spent >= spec.budget.hours * 3600:
                stopped_by, message = "hours", f"time budget of {spec.budget.hours:g} h used"
                break
            if stop.is_set():
                stopped_by = "interrupted"
                break
            params = _next_params(plan, done, retry_params)
            if params is None and plan is None and spec.baseline and not records:
                params = dict(spec.baseline)  # the sampler's first trial is the baseline
            if params is not None:
                study.enqueue_trial(params, skip_if_exists=False)
            trial = study.ask(dists)
            if params is not None and trial.params != params:
                # A WAITING trial from an earlier controller: run what it holds instead.
                params = dict(trial.params)
            view.trial_started(len(done) + 1, total, trial.number, dict(trial.params))
            try:
                record = await run_trial(executor, store, spec, trial.number,
                                         dict(trial.params), gpu_backend=gpu_backend,
                                         say=view.phase, stop=stop)
            except HostQuarantined as exc:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                stopped_by, message, quarantine_report = "quarantine", str(exc), exc.report
                break
            except Interrupted:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                stopped_by = "interrupted"
                break
            except BaseException:
                # run_trial tore the server down and recorded the trial before raising.
                with contextlib.suppress(Exception):
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                stopped_by = "error"
                raise
            new += 1
            feasible = record.status == TrialStatus.FEASIBLE
            trial.set_user_attr(CONSTRAINT_ATTR, 0.0 if feasible else 1.0)
            trial.set_user_attr("status", record.status.value)
            if record.cause:
                trial.set_user_attr("cause", record.cause)
            if record.run_id:
                trial.set_user_attr("run_id", record.run_id)
            value = record.value if record.value is not None else _penalty(spec)
            study.tell(trial, value)
            view.trial_finished(record, _best(store.trials(spec.name), spec))
    finally:
        store.add_study_time(spec.name, time.monotonic() - clock)
        records = store.trials(spec.name)
        store.save_study(spec.name, spec.model_dump(mode="json"),
                         StudyStatus.FINISHED if stopped_by in ("plan", "budget")
                         else StudyStatus(stopped_by))
    return StudyOutcome(trials=records, new_trials=new, best=_best(records, spec),
                        stopped_by=stopped_by, message=message, report=quarantine_report,
                        resumed=[t.run_id or "" for t in resumed])


def _key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _next_params(plan: list[dict[str, Any]] | None, done: list[TrialRecord],
                 retry: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The next configuration to enqueue: a planned one not yet finished, or a retry of one
    interrupted by a dead controller (samplers), or ``None`` to let the sampler choose."""
    if plan is not None:
        finished: dict[tuple[tuple[str, str], ...], int] = {}
        for t in done:
            finished[_key(t.params)] = finished.get(_key(t.params), 0) + 1
        for config in plan:
            k = _key(config)
            if finished.get(k, 0) > 0:
                finished[k] -= 1
                continue
            return config
        return None
    return retry.pop(0) if retry else None


async def _resume(executor: Executor, store: Store, spec: StudySpec, study: optuna.Study,
                  view: TuneView) -> list[TrialRecord]:
    """Clean up after a controller that died: its running trials are failed (to be rerun) and
    its servers torn down (found through their run records and markers)."""
    interrupted: list[TrialRecord] = []
    for record in store.trials(spec.name, status=TrialStatus.RUNNING):
        view.phase(f"trial {record.number} was running when its controller stopped: "
                   "cleaning up and running it again")
        store.save_trial(record.model_copy(update={"status": TrialStatus.INFRA_FAILED,
                                                    "cause": "controller_died",
                                                    "finished_at": time.time()}))
        interrupted.append(record)
    await recover_host(executor, store, spec, view.phase)
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)
    return interrupted
