"""The ``--json`` documents of the commands, as models built from the library's records.

The command line is a contract: a document's fields may be added, never renamed or dropped
(``tests/cli/test_json_keys.py`` holds their keys). ``check --json`` is the
:class:`~cleanslate.verdict.check.CheckReport` itself and ``clean --json`` (with targets) the
:class:`~cleanslate.teardown.TeardownReport`; the others are here. Each is printed with
:func:`emit`: one JSON document on stdout, nothing else there.

This module imports the records the documents hold (the store's, the smoke test's): the
commands import it when they print a document, not before.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

import typer
from pydantic import BaseModel, ConfigDict, field_serializer

from cleanslate.bench import ServerConfig, WorkloadSpec
from cleanslate.doctor.snapshot import HostSnapshot
from cleanslate.engines import FlagValue, SmokeResult
from cleanslate.store import RunRecord, RunStatus, TrialRecord
from cleanslate.teardown import TargetRecord, TeardownReport
from cleanslate.tune.estimate import StudyEstimate
from cleanslate.tune.factors import Scalar
from cleanslate.verdict.check import CheckReport

if TYPE_CHECKING:  # the builders' arguments (Optuna is not loaded for serve or stop)
    from cleanslate.cli._run_state import ServerExit
    from cleanslate.launch.lifecycle import StartOutcome
    from cleanslate.tune.controller import StudyOutcome
    from cleanslate.tune.study import StudySpec


class Document(BaseModel):
    """A ``--json`` document: frozen, its fields in the order they are printed."""

    model_config = ConfigDict(frozen=True)


def emit(document: Document | dict[str, object]) -> None:
    """Print ``document`` as one line of JSON on stdout."""
    data = document.model_dump(mode="json") if isinstance(document, Document) else document
    typer.echo(json.dumps(data, default=str))


class ServeStarted(Document):
    """``serve --json`` once the server is ready and smoke-tested (the record's argv is
    redacted already)."""

    run_id: str
    url: str
    argv: list[str]
    pid: int | None
    pgid: int | None
    supervisor_pid: int | None
    host: str
    engine: str
    port: int
    log: str
    status: RunStatus
    user: str | None
    cgroup: str | None
    cgroup_note: str | None
    boot_id: str | None
    machine_id: str | None
    verdict_before: CheckReport | None
    phases: dict[str, float]
    smoke: SmokeResult | None
    flag_validation: str
    host_snapshot: HostSnapshot | None = None
    server_config: ServerConfig | None = None

    @classmethod
    def of(cls, run: RunRecord, outcome: StartOutcome) -> ServeStarted:
        return cls(
            run_id=run.id, url=run.url, argv=list(run.argv), pid=run.pid, pgid=run.pgid,
            supervisor_pid=run.supervisor_pid, host=run.host, engine=run.engine, port=run.port,
            log=run.log_path, status=run.status, user=run.user, cgroup=run.cgroup,
            cgroup_note=outcome.cgroup_note, boot_id=run.boot_id, machine_id=run.machine_id,
            verdict_before=run.verdict_before, phases=outcome.phases, smoke=outcome.smoke,
            flag_validation=outcome.validation_note or "checked",
            host_snapshot=outcome.host_snapshot, server_config=run.server_config,
        )


class ServeRefused(Document):
    """``serve --json`` when the preflight found the host not clean (nothing launched)."""

    ok: Literal[False] = False
    cause: Literal["host_not_clean"] = "host_not_clean"
    verdict_before: CheckReport


class ServeFailed(Document):
    """``serve --json`` when the server did not start (it was torn down and verified)."""

    ok: Literal[False] = False
    run_id: str | None
    cause: str | None
    detail: str | None
    log_tail: str
    argv: list[str] | None
    verdict_after: CheckReport | None

    @classmethod
    def of(cls, outcome: StartOutcome) -> ServeFailed:
        run = outcome.run
        return cls(run_id=run.id if run else None, cause=outcome.cause, detail=outcome.detail,
                   log_tail=outcome.log_tail, argv=list(run.argv) if run else None,
                   verdict_after=outcome.teardown.verify if outcome.teardown else None)


def serve_failure(outcome: StartOutcome) -> ServeRefused | ServeFailed:
    """The document of a start that did not end ready."""
    if outcome.refused is not None:
        return ServeRefused(verdict_before=outcome.refused)
    return ServeFailed.of(outcome)


class ServeEnded(Document):
    """``serve --json`` in the foreground: one document, printed after the server was torn
    down: how it ended (``cause`` and ``detail`` when it crashed or was killed), what was
    started, and the teardown with its verification."""

    run_id: str
    status: RunStatus
    cause: str | None
    detail: str | None
    started: ServeStarted
    teardown: TeardownReport


def stopped(run_id: str, report: TeardownReport, *,
            server_exited: ServerExit | None = None) -> dict[str, object]:
    """``stop --json`` and ``clean --run --json``: the teardown report's JSON with the run's id
    first, and ``server_exited``: how the run's server had ended before the stop (when, exit
    status, cause; ``null``: it was running, or the run was not serving) (only printed)."""
    return {"run_id": run_id, **report.model_dump(mode="json"),
            "server_exited": None if server_exited is None
            else server_exited.model_dump(mode="json")}


class CleanNothing(Document):
    """``clean --json`` when nothing is in scope: what was left alone, no verification."""

    targets: tuple[TargetRecord, ...] = ()
    left_alone: tuple[TargetRecord, ...]
    verify: None = None


class StatisticsDoc(Document):
    """``tune --json``'s ``statistics``: the best trial's value with its interval, the trials
    against it by outcome (:class:`cleanslate.stats.Outcome`; the keys keep their first names:
    ``tied_with`` the ``tie``, ``undecided`` the ``undecided``, ``beaten`` the ``loss``), what
    the statistics cost, and the slots' host effects (ratios minus one, with their
    intervals)."""

    replicates: str
    tie_margin: float
    confidence: float
    best: int | None
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_replicates: int
    tied_with: list[int]
    undecided: list[int]
    beaten: list[int]
    statistics_gpu_s: float
    total_gpu_s: float
    host_effects: dict[str, dict[str, float | None]]

    @classmethod
    def of(cls, spec: StudySpec, trials: list[TrialRecord]) -> StatisticsDoc:
        from cleanslate.tune.race import host_effects, tie_set

        found = tie_set(trials, spec)
        stats = spec.statistics
        best = found.best
        interval = found.interval
        effects = {slot: {"effect": e.mean, "ci_low": e.low, "ci_high": e.high}
                   for slot, e in host_effects(trials, stats.confidence).items()}
        return cls(replicates=str(stats.replicates), tie_margin=stats.tie_margin,
                   confidence=stats.confidence, best=best.number if best else None,
                   value=interval.mean if interval else None,
                   ci_low=interval.low if interval else None,
                   ci_high=interval.high if interval else None,
                   n_replicates=interval.n if interval else 0,
                   tied_with=list(found.tied), undecided=list(found.undecided),
                   beaten=list(found.beaten), statistics_gpu_s=round(found.statistics_gpu_s, 3),
                   total_gpu_s=round(found.total_gpu_s, 3), host_effects=effects)


class TuneDone(Document):
    """``tune --json``: how the run of the study ended, the best trial and every trial (their
    log tails left out; ``cleanslate report`` shows them; each with ``crashed_at`` and
    ``crash``, as the report's JSON has them). ``capacity``: for a capacity
    objective, the best trial's search (capacity, upper, bracket, stopped_by, crash, cliffs,
    unresolved, probes: :func:`cleanslate.report._capacity.capacity_document`); every trial
    record carries its own search as ``capacity``."""

    study: str
    stopped_by: str
    message: str
    new_trials: int
    best: TrialRecord | None
    trials: list[TrialRecord]
    statistics: StatisticsDoc | None = None
    capacity: dict[str, object] | None = None  # the report's capacity_document, as is

    @field_serializer("trials")
    def _without_log_tails(self, trials: list[TrialRecord]) -> list[dict[str, object]]:
        return [{**t.model_dump(mode="json", exclude={"log_tail"}),
                 "crashed_at": t.crashed_at, "crash": t.crash_text} for t in trials]

    @classmethod
    def of(cls, spec: StudySpec, outcome: StudyOutcome) -> TuneDone:
        from cleanslate.report import capacity_document

        best = outcome.best
        return cls(study=spec.name, stopped_by=outcome.stopped_by, message=outcome.message,
                   new_trials=outcome.new_trials, best=best, trials=outcome.trials,
                   statistics=StatisticsDoc.of(spec, outcome.trials),
                   capacity=dict(capacity_document(best.capacity))
                   if best is not None and best.capacity is not None else None)


class PlanObjective(Document):
    direction: Literal["maximize", "minimize"]
    metric: str


class TunePlan(Document):
    """``tune --check --json``: what the study would run. ``configurations`` for grid and
    ablation, else the sampler's ``distributions`` (as Optuna writes them)."""

    study: str
    engine: str
    model: str
    host: str
    strategy: str
    trials: int
    configurations: list[dict[str, Scalar]] | None
    distributions: dict[str, str] | None
    fixed: dict[str, FlagValue]
    levels: list[str]
    requests_per_level: int | None
    duration_s_per_level: float | None
    workload: WorkloadSpec
    objective: PlanObjective
    slo: dict[str, float]
    flags_note: str | None
    #: Launches (races included) and wall time (``tune.estimate``); ``None`` when not made.
    estimate: StudyEstimate | None = None

    @classmethod
    def of(cls, spec: StudySpec, note: str | None,
           estimate: StudyEstimate | None = None) -> TunePlan:
        from cleanslate.tune.space import distributions, planned_configs, trial_budget

        plan = planned_configs(spec)
        workload = spec.bench_config("http://127.0.0.1:1", ignore_eos=True).workload
        return cls(
            study=spec.name, engine=spec.engine, model=spec.model, host=spec.host or "local",
            strategy=spec.strategy, trials=trial_budget(spec), configurations=plan,
            distributions=None if plan is not None else {
                name: repr(d) for name, d in distributions(spec).items()},
            fixed=spec.fixed,
            levels=[load.label for load in spec.replay_loads()] or [
                f"c={c}" for c in spec.concurrency],
            requests_per_level=spec.requests_per_level,
            duration_s_per_level=spec.duration_s_per_level,
            workload=workload,
            objective=PlanObjective(direction=spec.objective.direction,
                                    metric=spec.objective.metric),
            slo=spec.slo, flags_note=note, estimate=estimate,
        )


__all__ = ["CleanNothing", "Document", "ServeEnded", "ServeFailed", "ServeRefused",
           "ServeStarted", "TuneDone", "TunePlan", "emit", "serve_failure", "stopped"]
