"""The study controller: Optuna ask/tell, every trial a verified cycle, one worker per slot
(:mod:`cleanslate.tune.fleet`), resume.

Resume: the Optuna study and our trial records live in the store. Rerunning the same study
keeps every finished trial; a trial that was running when a controller died is cleaned up (its
server found through the recorded run, ``launching`` ones included, by its marker and cgroup)
and its configuration run again; a result recorded here that Optuna was not told is told
(:func:`~cleanslate.tune.fleet.reconcile_optuna`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from cleanslate import stats
from cleanslate.config import line_of
from cleanslate.engines import check_flags, engine_help_options
from cleanslate.errors import InputError
from cleanslate.hosts import check_resolves, executor_for
from cleanslate.hosts.base import Executor
from cleanslate.launch.lifecycle import (
    adapter_for,
    local_model_path,
    missing_model_error,
    model_path_missing,
    stop_server,
)
from cleanslate.redact import REDACTED
from cleanslate.store import (
    LeaseState,
    RunStatus,
    Store,
    StudyStatus,
    TrialCause,
    TrialRecord,
    TrialStatus,
)
from cleanslate.tune._systemic import SYSTEMIC
from cleanslate.tune.fleet import (
    HOURS,
    INTERRUPTED,
    LEASE_ATTR,
    QUARANTINE,
    Fleet,
    SlotEnd,
    best_trial,
    other_slots_markers,
    reconcile_optuna,
    worker_gone,
)
from cleanslate.tune.notebook import not_guided_line
from cleanslate.tune.space import make_sampler, planned_configs, trial_budget
from cleanslate.tune.study import Slot, StudySpec
from cleanslate.tune.trial import verdict_of
from cleanslate.tune.view import TuneView
from cleanslate.verdict.findings import Verdict


@dataclass
class StudyOutcome:
    """How a run of the controller ended."""

    trials: list[TrialRecord]
    new_trials: int
    best: TrialRecord | None
    stopped_by: str  # "budget", "plan", "hours", "quarantine", "interrupted", "systemic",
    # "error"
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


#: Keys of a study that may change between its runs: the budget, and where it runs (a fleet
#: grows or shrinks; a worker joins with its own slot).
_MAY_CHANGE = frozenset({"budget", "hosts", "slots", "lease_timeout_s"})


def _normalized(spec: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A stored or current spec without the keys that may change between runs
    (:data:`_MAY_CHANGE`) and without keys at their default value: a key added to the schema
    later, absent from a study stored before, compares equal to its default."""
    return {k: v for k, v in spec.items()
            if k not in _MAY_CHANGE and not (k in defaults and defaults[k] == v)}


def same_definition(store: Store, stored: dict[str, Any], spec: StudySpec) -> bool:
    """Whether ``spec`` defines the study ``stored`` in ``store`` (compared as the store keeps
    it, redacted: an ``env`` secret is never kept, so it cannot be compared)."""
    defaults = _defaults()
    current = store.redacted(spec.model_dump(mode="json"))
    return _normalized(store.redacted(stored), defaults) == _normalized(current, defaults)


def _best(trials: list[TrialRecord], spec: StudySpec) -> TrialRecord | None:
    return best_trial(trials, spec)


def open_optuna(store: Store, spec: StudySpec) -> optuna.Study:
    """The study's Optuna study in the store (created the first time)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=spec.name, storage=store.url,
                               direction=spec.objective.direction,
                               sampler=make_sampler(spec), load_if_exists=True)


def register_study(store: Store, spec: StudySpec, *, running: bool = False) -> optuna.Study:
    """Record the study in the store (``running``: mark it running too, as ``tune`` does) and
    return its Optuna study, so that workers started anywhere find it (``tune --register``,
    ``slurm submit``). The same name with another definition is an :class:`InputError`, with
    nothing written."""
    existing = store.study(spec.name)
    if existing is not None and existing.spec and not same_definition(
            store, existing.spec, spec):
        raise InputError(
            f"a study named {spec.name!r} with a different definition is already in "
            f"{store.display_url}",
            where="name", hint="give the study a new name to start over, or restore the file "
            "(only budget:, hosts:, slots: and lease_timeout_s: may change between runs)")
    if running or existing is None:
        store.save_study(spec.name, spec.model_dump(mode="json"), StudyStatus.RUNNING)
    return open_optuna(store, spec)


def check_slot_hosts(spec: StudySpec) -> None:
    """Refuse, before anything launches, a host of the study whose name does not resolve
    (an :class:`InputError` naming ``hosts[i]`` or ``host``)."""
    for index, host in enumerate(spec.hosts or [spec.host]):
        check_resolves(host, where=f"hosts[{index}]" if spec.hosts else "host")


async def check_model_paths(spec: StudySpec, where: str | None) -> None:
    """Refuse, before any launch, a study whose ``model`` is a local path that does not exist
    on one of its hosts (every host of a fleet is asked, one ``test -e`` each, through its
    executor: :func:`~cleanslate.launch.lifecycle.model_path_missing`): an
    :class:`InputError` at ``where`` (the file:line of ``model:``). A Hugging Face repo id is
    not looked for, and a host that does not answer is left to the checks of its first
    trial."""
    if not local_model_path(spec.model):
        return
    hosts: list[str | None] = list(spec.hosts) if spec.hosts else [spec.host]
    for host in dict.fromkeys(hosts):
        executor = executor_for(host)
        try:
            missing = await model_path_missing(executor, spec.model)
        finally:
            with contextlib.suppress(Exception):
                await executor.close()
        if missing:
            raise missing_model_error(spec.model, executor.name, where)


def model_where(root: yaml.Node | None, path: Path) -> str:
    """The file:line of a study file's ``model:`` (the file alone without a line)."""
    line = line_of(root, ("model",))
    return f"{path}:{line}" if line else str(path)


def _stopped_by(ends: list[SlotEnd], spec: StudySpec, store: Store) -> tuple[str, str, Any]:
    """Why a study's run ended (``plan``, ``budget``, ``hours``, ``quarantine``,
    ``interrupted``, ``systemic``: a failure that is not the configuration's, which stopped
    every slot), a message, and the check report of a quarantine."""
    systemic = next((e for e in ends if e.why == SYSTEMIC), None)
    if systemic is not None:  # before interrupted: it stopped the other slots
        return SYSTEMIC, systemic.message, None
    if any(e.why == INTERRUPTED for e in ends):
        return "interrupted", "", None
    if any(e.why == HOURS for e in ends):
        hours = next(e.message for e in ends if e.why == HOURS)
        return "hours", hours, None
    quarantined = [e for e in ends if e.why == QUARANTINE]
    if quarantined and len(quarantined) == len(ends):
        last = quarantined[-1]
        message = last.message if len(ends) == 1 else (
            f"every slot is quarantined ({len(ends)}): " + "; ".join(
                f"{e.slot.key}: {e.message}" for e in quarantined))
        return "quarantine", message, last.report
    plan = planned_configs(spec)
    done = [t for t in store.trials(spec.name) if t.status.finished]
    return ("plan" if plan is not None and len(done) >= len(plan) else "budget"), "", None


def study_status(stopped_by: str) -> StudyStatus:
    """The status a study is recorded with after a run that ended ``stopped_by``: a failure
    that is not the configuration's (``systemic``) is ``error`` (resuming runs its
    configurations again once the cause is fixed)."""
    if stopped_by in ("plan", "budget"):
        return StudyStatus.FINISHED
    if stopped_by == SYSTEMIC:
        return StudyStatus.ERROR
    return StudyStatus(stopped_by)


async def run_study(
    executor: Executor,
    store: Store,
    spec: StudySpec,
    *,
    view: TuneView | None = None,
    gpu_backend: str = "auto",
) -> StudyOutcome:
    """Run (or resume) a study until its plan or budget is done: one worker per slot
    (:mod:`cleanslate.tune.fleet`), each running one verified trial at a time. ``executor``
    is the study's ``host`` (a study with ``hosts:`` opens one per host)."""
    view = view or TuneView()
    stats.preload()
    study = register_study(store, spec, running=True)
    slots = spec.slot_list()
    stop = asyncio.Event()
    fleet = Fleet(store=store, spec=spec, study=study, view=view, stop=stop,
                  gpu_backend=gpu_backend, labels=len(slots) > 1)
    resumed = await _resume(executor, store, spec, study, view, fleet)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    total = trial_budget(spec)
    before = sum(1 for t in store.trials(spec.name) if t.status.finished)
    view.study_started(spec, total, before)
    if spec.strategy == "guided":
        view.phase(not_guided_line(spec))
    stopped_by, message, quarantine_report = "error", "", None
    ends: list[SlotEnd] = []
    try:
        ends = await fleet.run(slots)
        stopped_by, message, quarantine_report = _stopped_by(ends, spec, store)
    except BaseExceptionGroup as group:  # one slot's error ended them all: raise the first
        raise group.exceptions[0] from None
    finally:
        fleet.tick()
        records = store.trials(spec.name)
        store.save_study(spec.name, spec.model_dump(mode="json"), study_status(stopped_by))
    return StudyOutcome(trials=records, new_trials=sum(e.trials for e in ends),
                        best=_best(records, spec), stopped_by=stopped_by, message=message,
                        report=quarantine_report, resumed=[t.run_id or "" for t in resumed])


async def _recover_orphans(executor: Executor, store: Store, spec: StudySpec, view: TuneView,
                           *, spared: set[str], held: set[int | None]) -> None:
    """Tear down, on its host, every run of this study that may still have processes (running,
    or not verified clean) and that no live worker holds: a run of a controller or worker
    that died. The checks after each teardown leave the live runs of other slots alone."""
    executors: dict[str, Executor] = {executor.name: executor}
    try:
        for run in store.runs(study=spec.name):
            unverified = verdict_of(run.verdict_after) != Verdict.CLEAN
            if not (run.status.running or unverified) or run.id in spared or run.trial in held:
                continue
            if run.host not in executors:
                executors[run.host] = executor_for(run.host)
            view.phase(f"cleaning up run {run.id} left by an earlier controller")
            slot = Slot(host=run.host, gpus=run.gpus, port=run.port)
            await stop_server(executors[run.host], store, run, grace_s=min(spec.grace_s, 10.0),
                              verify_deadline_s=spec.verify_deadline_s,
                              status=RunStatus.STOPPED, cause=TrialCause.CONTROLLER_DIED,
                              exclusions=other_slots_markers(store, spec.name, run.host, slot))
    finally:
        for other in executors.values():
            if other is not executor:
                with contextlib.suppress(Exception):
                    await other.close()


async def _resume(executor: Executor, store: Store, spec: StudySpec, study: optuna.Study,
                  view: TuneView, fleet: Fleet) -> list[TrialRecord]:
    """Clean up after a controller (or worker) that died: its running trials are failed (to be
    rerun) and its servers torn down (found through their run records and markers). Stale
    leases are expired first (their trials re-queued by :meth:`Fleet.requeue`); a trial whose
    lease is still active is left to its worker."""
    interrupted: list[TrialRecord] = []
    for lease in store.expire_leases(spec.name, gone=lambda lease: worker_gone(lease.worker)):
        interrupted += await fleet.requeue(lease, view.phase)
    # What an active lease holds is its worker's (or, once it expires, its expirer's).
    live = store.leases(spec.name, state=LeaseState.ACTIVE)
    held: set[int | None] = {lease.trial for lease in live}
    live_ids = {lease.id for lease in live}
    binding = any(lease.trial is None for lease in live)  # its trial is being created
    for record in store.trials(spec.name, status=TrialStatus.RUNNING):
        if record.number in held:
            continue
        view.phase(f"trial {record.number} was running when its controller stopped: "
                   "cleaning up and running it again")
        store.save_trial(record.model_copy(update={"status": TrialStatus.INFRA_FAILED,
                                                    "cause": TrialCause.CONTROLLER_DIED,
                                                    "finished_at": time.time()}))
        interrupted.append(record)
    # The run of a lease that expired moments ago is being torn down by whoever expired it.
    recent = {lease.run_id for lease in store.leases(spec.name, state=LeaseState.EXPIRED)
              if lease.released_at is not None
              and time.time() - lease.released_at < spec.lease_timeout_s}
    await _recover_orphans(executor, store, spec, view, held=held,
                           spared={run_id for run_id in {lease.run_id for lease in live} | recent
                                   if run_id})
    # One source of truth for a result: a trial recorded finished here whose worker died
    # before telling Optuna (or that a recovery failed there) gets its recorded value.
    told = reconcile_optuna(store, study, spec, held)
    if told["told"] or told["added"]:
        view.phase(f"Optuna told the recorded results of {told['told'] + told['added']} "
                   "trial(s) whose worker stopped before telling it")
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        lease_id = frozen.user_attrs.get(LEASE_ATTR)
        if frozen.number in held or lease_id in live_ids or (lease_id is None and binding):
            continue
        # Another process starting at the same moment (its Fleet.requeue) may have failed it
        # since it was read: Optuna refuses a second tell, and the trial is failed either way.
        with contextlib.suppress(ValueError, optuna.exceptions.UpdateFinishedTrialError):
            study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)
    return interrupted


def worker_slot(spec: StudySpec, *, host: str | None, gpus: list[int] | None,
                port: int | None) -> Slot:
    """The slot of ``cleanslate worker``: its ``--host`` (else the study's host, else this
    machine), ``--gpus`` (else the study's) and ``--port`` (else the study's first slot's)."""
    chosen = host or spec.host or "local"
    check_resolves(chosen, where="--host")
    return Slot(host=chosen, gpus=tuple(gpus) if gpus is not None else (
        tuple(spec.gpus) if spec.gpus is not None else None),
        port=port if port is not None else spec.slot_ports()[0])


def load_stored_study(store: Store, name: str) -> StudySpec:
    """The definition of the study ``name`` as the store holds it; an unknown name is an
    :class:`InputError` (``--study``) listing the studies there."""
    record = store.study(name)
    if record is None:
        known = store.studies()
        raise InputError(f"no study {name!r} in {store.display_url}", where="--study",
                         hint=("studies there: " + ", ".join(known)) if known else
                         "start it with `cleanslate tune STUDY.yaml --store URL` first")
    try:
        spec = StudySpec.model_validate(record.spec)
    except ValidationError as exc:
        raise InputError.from_validation(
            exc, what=f"the stored definition of study {name!r} is not valid",
            where="--study") from None
    return _secrets_from_environment(spec)


def _secrets_from_environment(spec: StudySpec) -> StudySpec:
    """The study with the ``env:`` values the store does not keep (secrets and anything not
    known harmless, stored as ``***``) taken from this process's environment; one that is not
    there is an :class:`InputError`: a server started with ``***`` as its token would fail, and its
    failure would be recorded as the configuration's."""
    env = dict(spec.env)
    missing = [key for key, value in env.items() if value == REDACTED and key not in os.environ]
    if missing:
        raise InputError(
            f"study {spec.name!r} runs its servers with {', '.join(sorted(missing))} in their "
            "environment, and the store keeps no value it cannot tell harmless (secrets, URLs, "
            "free text: docs/security.md)",
            where="--study", hint=f"set {', '.join(sorted(missing))} in this worker's "
            "environment (the study's env: names it)")
    env.update({key: os.environ[key] for key, value in env.items() if value == REDACTED})
    return spec.model_copy(update={"env": env})


async def run_worker(store: Store, spec: StudySpec, slot: Slot, *,
                     view: TuneView | None = None, gpu_backend: str = "auto") -> StudyOutcome:
    """``cleanslate worker``: lease trials of a study that is in the store and run them on one
    slot until its plan or budget is done (or the slot is quarantined, or the worker is
    stopped). Trials held by other live workers are left to them."""
    view = view or TuneView()
    study = open_optuna(store, spec)
    stop = asyncio.Event()
    fleet = Fleet(store=store, spec=spec, study=study, view=view, stop=stop,
                  gpu_backend=gpu_backend)
    executor = executor_for(slot.host)
    try:
        resumed = await _resume(executor, store, spec, study, view, fleet)
    finally:
        await executor.close()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    view.study_started(spec, trial_budget(spec),
                       sum(1 for t in store.trials(spec.name) if t.status.finished))
    try:
        ends = await fleet.run([slot])
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    finally:
        fleet.tick()
    stopped_by, message, report = _stopped_by(ends, spec, store)
    records = store.trials(spec.name)
    if stopped_by in ("plan", "budget", SYSTEMIC):
        store.save_study(spec.name, spec.model_dump(mode="json"), study_status(stopped_by))
    return StudyOutcome(trials=records, new_trials=sum(e.trials for e in ends),
                        best=_best(records, spec), stopped_by=stopped_by, message=message,
                        report=report, resumed=[t.run_id or "" for t in resumed])
