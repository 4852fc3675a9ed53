"""One trial: the whole cycle for one configuration, each phase timed and recorded.

``verify clean -> launch -> ready -> smoke -> levels (ascending) -> teardown -> verify clean``.

Whatever happens in this process once a server may have started (an exception in a level, a
bug, a cancellation), the server is torn down, the host verified and the trial recorded: a
trial is never left ``running`` by an exception here (only by a controller that is killed,
which the next controller cleans up).

A configuration that fails to start, runs out of memory, emits NaN, crashes under load or misses
every SLO is a *result* (``infeasible``, with its cause and log tail; a crash at any level of
a ladder too, the value of the levels below it kept, while a capacity search's answer below its
crash stands: ``feasible``, marked :attr:`~cleanslate.store.TrialRecord.crash_text`). A host
that is dirty before the trial and does not come clean, that cannot be reached, or that cannot
start a run (its run folder or the run supervisor fails) is an *infrastructure* failure
(:class:`HostQuarantined`): not a result, and the configuration is run again elsewhere or later.
So is a start that fails once this process was asked to stop (:class:`Interrupted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cleanslate.bench import (
    CapacityResult,
    ClosedLoop,
    Harness,
    LevelResult,
    Probe,
    ProbeVerdict,
    SampleFiles,
    ServerConfig,
    diagnosed,
    discard_samples,
    gpu_observer,
    printable,
    run_level,
    share_target,
    worst_check,
)
from cleanslate.engines import EngineAdapter
from cleanslate.errors import CleanslateError
from cleanslate.hosts.base import Executor
from cleanslate.launch.config import ServeConfig
from cleanslate.launch.lifecycle import (
    Exclusions,
    StartOutcome,
    adapter_for,
    describe_exit,
    run_exit_code,
    start_server,
    stop_server,
)
from cleanslate.launch.ready import classify_run_log, log_tail
from cleanslate.stats import wilson
from cleanslate.store import (
    LevelVerdict,
    Replicate,
    RunRecord,
    RunStatus,
    Store,
    TrialCause,
    TrialRecord,
    TrialStatus,
    level_metric,
    trial_bottlenecks,
)
from cleanslate.tune.study import StudySpec
from cleanslate.verdict.check import CheckReport
from cleanslate.verdict.findings import Finding, FindingKind, Severity, Verdict

Say = Callable[[str], None]


class HostQuarantined(CleanslateError):
    """The host stayed dirty (or unreachable) after cleaning: it takes no more trials."""

    def __init__(self, message: str, report: CheckReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class Interrupted(CleanslateError):
    """The controller was asked to stop (Ctrl-C, SIGTERM) during a trial."""


def serve_config(spec: StudySpec, params: dict[str, Any]) -> ServeConfig:
    """The server of one trial: the study's fixed flags plus the trial's parameters."""
    return ServeConfig(
        engine=spec.engine, model=spec.model, host=spec.host, port=spec.port, gpus=spec.gpus,
        flags={**spec.fixed, **params}, env=dict(spec.env), launch=spec.launch, argv=spec.argv,
        python=spec.python, readiness_path=spec.readiness_path,
        ready_timeout_s=spec.ready_timeout_s, smoke=spec.smoke,
        smoke_timeout_s=spec.smoke_timeout_s, grace_s=spec.grace_s,
    )


def slo_misses(level: LevelResult, limits: dict[str, float]) -> list[str]:
    """The SLOs a level missed, as ``p99_ttft_ms 6120 > 5000``; a statistic without samples
    misses its SLO."""
    out = []
    for key, limit in limits.items():
        value = level_metric(level, key)
        if value is None or value > limit:
            shown = "no samples" if value is None else f"{value:.1f}"
            out.append(f"{key} {shown} > {limit:g}")
    return out


def pool_counts(*levels: LevelResult) -> dict[str, tuple[int, int]]:
    """The levels' ``limit_counts`` summed key by key."""
    out: dict[str, tuple[int, int]] = {}
    for level in levels:
        for key, (met, n) in level.limit_counts.items():
            m0, n0 = out.get(key, (0, 0))
            out[key] = (m0 + met, n0 + n)
    return out


def slo_attainment(level: LevelResult, limits: dict[str, float], confidence: float,
                   counts: dict[str, tuple[int, int]] | None = None) -> dict[str, dict[str, Any]]:
    """Per percentile SLO: the requests that met its limit, of how many, the target share,
    and the Wilson interval of the share; ``straddles`` when the interval holds the target and
    at least one request missed (a level without a miss is not re-measured: more requests can
    only confirm it)."""
    counts = counts if counts is not None else dict(level.limit_counts)
    out: dict[str, dict[str, Any]] = {}
    for key in limits:
        target = share_target(key)
        if target is None or key not in counts:
            continue
        met, n = counts[key]
        low, high = wilson(met, n, confidence)
        out[key] = {"met": met, "n": n, "target": target, "low": round(low, 5),
                    "high": round(high, 5), "straddles": low < target < high and met < n,
                    "remeasured": False}
    return out


def verdict_of(report: CheckReport | None) -> Verdict:
    """The verdict of a check; a check that did not run (``None``) is never clean: it reads
    as ``unknown``."""
    return report.verdict if report is not None else Verdict.UNKNOWN


def _summary(report: CheckReport | None) -> tuple[Verdict, tuple[Finding, ...]]:
    """The verdict (see :func:`verdict_of`) and the error and unknown findings of a check."""
    if report is None:
        return Verdict.UNKNOWN, ()
    findings = tuple(f for host in report.hosts for f in host.findings
                     if f.severity in (Severity.ERROR, Severity.UNKNOWN))
    return report.verdict, findings


#: Findings a "host not clean" line names (the rest are counted).
NAMED_FINDINGS = 3


def not_clean_findings(report: CheckReport | None, n: int = NAMED_FINDINGS) -> str:
    """The first ``n`` errors and unknowns of a check that refused a trial, each on its own
    briefly with its PID, port or path (:meth:`~cleanslate.verdict.findings.Finding.brief`),
    ``; ``-joined, ``(+K more)`` for the rest: ``port 30917 is bound (127.0.0.1) by PID 18320
    `python3```. A check that did not run says so."""
    if report is None:
        return "the check did not run"
    _, findings = _summary(report)
    if not findings:
        return f"{report.verdict}, with no error named"
    text = "; ".join(f.brief() for f in findings[:n])
    return text + (f" (+{len(findings) - n} more)" if len(findings) > n else "")


def how_to_proceed(report: CheckReport | None) -> str:
    """What a user can do about a host that refused a trial, in the commands they type: a held
    port (the server needs it) and another engine's process are named with their PIDs, since
    no baseline accepts them; what was there before and stays (another user's GPU memory,
    device files, ``/dev/shm`` entries, kernel lines) is accepted by a baseline saved with
    ``check --save-baseline`` and given to ``tune --baseline``."""
    _, findings = _summary(report)
    steps: list[str] = []
    held = [f for f in findings if f.kind == FindingKind.PORT_IN_USE]
    if held:
        owners = ", ".join(sorted({str(f.pid) for f in held if f.pid is not None}))
        steps.append(f"the server needs port {held[0].port}: end PID {owners or '(not visible)'}"
                     " if it is yours, or give the study another `port:`")
    strays = [f for f in findings if f.kind == FindingKind.STRAY_PROCESS]
    runs = sorted({str(f.evidence.get("run_marker")) for f in strays
                   if f.evidence.get("run_marker")})
    if runs:
        steps.append("end the cleanslate runs still up if they are yours: "
                     + ", ".join(f"`cleanslate stop {r}`" for r in runs[:3]))
    engines = sorted({str(f.pid) for f in strays if not f.evidence.get("run_marker")})
    if engines:
        steps.append(f"another engine's processes (PID {', '.join(engines[:5])}) stop every "
                     "trial: end them if they are yours, or run the study on a host without "
                     "them")
    steps.append("for what was there before you and stays (another user's GPU memory, "
                 "device files, /dev/shm entries): `cleanslate check --save-baseline FILE` "
                 "on the idle host, then `cleanslate tune STUDY.yaml --baseline FILE`")
    return "to go on: " + "; ".join(steps)


def on_slot(run: RunRecord, spec: StudySpec) -> bool:
    """Whether ``run`` used the slot ``spec`` runs on (as :meth:`StudySpec.for_slot` makes
    it): its port, or one of its GPUs (a run or a slot without GPUs has them all)."""
    if spec.port is not None and run.port == spec.port:
        return True
    if run.gpus is None or spec.gpus is None:
        return True
    return bool(set(run.gpus) & set(spec.gpus))


async def recover_host(executor: Executor, store: Store, spec: StudySpec, say: Say,
                       exclusions: Exclusions | None = None) -> int:
    """Tear down every run of this study that may still have processes: those the store says
    are running, and those whose last verification was not clean (dirty, unknown, or missing:
    a run with no recorded verdict is not known to be gone). Returns how many were stopped
    (the processes are found by their marker even when orphaned).

    With ``exclusions`` (a slot of a fleet), only the runs of this slot (:func:`on_slot`) that
    are not another slot's live run (their markers are in ``exclusions()``) are stopped."""
    stopped = 0
    spared = exclusions() if exclusions is not None else frozenset()
    for run in store.runs(study=spec.name):
        unverified = verdict_of(run.verdict_after) != Verdict.CLEAN
        if not ((run.status.running or unverified) and run.host == executor.name):
            continue
        if exclusions is not None and (run.id in spared or not on_slot(run, spec)):
            continue
        say(f"cleaning up run {run.id} left by an earlier controller")
        await stop_server(executor, store, run, grace_s=min(spec.grace_s, 10.0),
                          verify_deadline_s=spec.verify_deadline_s, status=RunStatus.STOPPED,
                          cause=TrialCause.CONTROLLER_DIED, exclusions=exclusions)
        stopped += 1
    return stopped


async def run_trial(
    executor: Executor,
    store: Store,
    spec: StudySpec,
    number: int,
    params: dict[str, Any],
    *,
    gpu_backend: str = "auto",
    say: Say | None = None,
    stop: asyncio.Event | None = None,
    run_id: str | None = None,
    exclusions: Exclusions | None = None,
    slot: str | None = None,
    seed: int | None = None,
    only: tuple[str, ...] | None = None,
    save: Callable[[TrialRecord], TrialRecord] | None = None,
) -> TrialRecord:
    """Run one configuration through the whole cycle and record it (see the module doc).

    A slot of a fleet passes ``run_id`` (recorded in its lease before the launch) and
    ``exclusions`` (the markers of the other slots' runs on the host, which its checks and
    cleanings leave alone: :func:`~cleanslate.launch.lifecycle.verify_options`), and ``slot``
    (its key, recorded). One more measurement of a configuration (:func:`run_replicate`) passes
    ``seed`` (its prompts' seed instead of the study's), ``only`` (the levels to run:
    :func:`replicate_levels`) and ``save`` (where its record goes instead of the store's trials)."""
    say = say or (lambda _m: None)
    save = save or store.save_trial
    config = serve_config(spec, params)
    record = save(TrialRecord(study=spec.name, number=number, params=params,
                              flags=config.flags, host=executor.name, slot=slot))
    started = time.monotonic()
    return await _cycle(executor, store, spec, number, config, record, started,
                        gpu_backend=gpu_backend, say=say, stop=stop, run_id=run_id,
                        exclusions=exclusions, seed=seed, only=only, save=save)


#: A level whose value in a trial's first measurement was within this share of its best level's
#: could be the best of another measurement (beyond the 2-5 % restart noise seen on an H200,
#: docs/statistics.md): a replicate climbs up to the highest such level.
NEAR_BEST = 0.10


def replicate_levels(trial: TrialRecord, spec: StudySpec) -> tuple[str, ...] | None:
    """The levels a replicate of ``trial`` runs: its ladder from the first level up to the
    highest one that met the SLOs in its first measurement with an objective within
    :data:`NEAR_BEST` of its best level's (the best at least). The replicate climbs them as the
    first measurement did, and its value is the best of them: the same procedure, so that all
    measurements of a configuration are draws of one distribution. (A replicate that ran its
    best level alone after a warm-up ran below the first measurement in 4 of 4 cases on an H200,
    x1.01 to x1.40: a warm-up is not the ladder.) ``None`` (every level) without a best, and
    with a capacity objective (a replicate runs the whole search again)."""
    if spec.objective.capacity:
        return None
    best = trial.level(trial.best_level)
    top = spec.objective.value(best) if best is not None else None
    if top is None:
        return None
    maximize = spec.objective.direction == "maximize"
    labels = [level.label for level in trial.levels]
    last = labels.index(trial.best_level) if trial.best_level in labels else len(labels) - 1
    for index, level in enumerate(trial.levels):
        value = spec.objective.value(level)
        if trial.level_verdicts.get(level.label) != LevelVerdict.OK or value is None:
            continue
        near = value >= top * (1 - NEAR_BEST) if maximize else value <= top * (1 + NEAR_BEST)
        if near:
            last = max(last, index)
    return tuple(labels[:last + 1]) or None


def gpu_seconds(record: TrialRecord, spec: StudySpec) -> float:
    """A cycle's GPU-seconds: its wall time times the GPUs its slot holds (1 when the study
    names none)."""
    wall = (record.finished_at or time.time()) - record.started_at
    return round(max(0.0, wall) * max(1, len(spec.gpus or ())), 3)


async def run_replicate(
    executor: Executor, store: Store, spec: StudySpec, trial: TrialRecord, seed: int, *,
    pair: int | None = None, against: int | None = None, gpu_backend: str = "auto",
    say: Say | None = None, stop: asyncio.Event | None = None,
    exclusions: Exclusions | None = None, slot: str | None = None,
    run_id: str | None = None,
) -> Replicate:
    """One more measurement of ``trial``'s configuration: a whole verified cycle with the
    prompts of ``seed``, warmed up, then its ladder up to the levels that could be its best
    (:func:`replicate_levels`). The server's run is
    recorded like any (with the trial's number); the measurement is returned, for the caller
    to add to the trial. Raises what :func:`run_trial` raises (``HostQuarantined``,
    ``Interrupted``)."""
    kept: list[TrialRecord] = []

    def keep(record: TrialRecord) -> TrialRecord:
        kept[:] = [record]
        return record

    record = await run_trial(executor, store, spec, trial.number, dict(trial.params),
                             gpu_backend=gpu_backend, say=say, stop=stop, run_id=run_id,
                             exclusions=exclusions, slot=slot, seed=seed,
                             only=replicate_levels(trial, spec), save=keep)
    return Replicate(index=len(trial.replicates), seed=seed, status=record.status,
                     value=record.value, best_level=record.best_level, cause=record.cause,
                     detail=record.detail, levels=record.levels,
                     level_verdicts=record.level_verdicts, run_id=record.run_id,
                     host=record.host, slot=slot, pair=pair, against=against,
                     gpu_s=record.gpu_s, started_at=record.started_at,
                     finished_at=record.finished_at, capacity=record.capacity)


async def _cycle(
    executor: Executor, store: Store, spec: StudySpec, number: int, config: ServeConfig,
    record: TrialRecord, started: float, *, gpu_backend: str, say: Say,
    stop: asyncio.Event | None, run_id: str | None, exclusions: Exclusions | None,
    seed: int | None, only: tuple[str, ...] | None, save: Callable[[TrialRecord], TrialRecord],
) -> TrialRecord:

    store_save = save

    class _Saver:
        """Every record of the cycle goes to ``save``, its GPU-seconds computed when it is
        finished."""

        @staticmethod
        def save_trial(trial: TrialRecord) -> TrialRecord:
            if trial.finished_at is not None:
                trial = trial.model_copy(update={"gpu_s": gpu_seconds(trial, spec)})
            return store_save(trial)

    saver = _Saver()

    def finish(status: TrialStatus, cause: str | None, **fields: object) -> TrialRecord:
        """The trial's last record: its status and cause and what it measured, finished now."""
        return saver.save_trial(record.model_copy(update={
            "status": status, "cause": None if cause is None else str(cause), **fields,
            "finished_at": time.time()}))

    outcome: StartOutcome | None = None
    try:
        for attempt in range(spec.retries + 1):
            outcome = await start_server(executor, store, config, gpu_backend=gpu_backend,
                                         progress=say, study=spec.name, trial=number,
                                         verify_deadline_s=spec.verify_deadline_s,
                                         validate=False, run_id=run_id, exclusions=exclusions)
            if outcome.refused is None:
                break
            say(f"host not clean before the trial ({not_clean_findings(outcome.refused)}): "
                "cleaning up this study's runs")
            if await recover_host(executor, store, spec, say, exclusions) == 0 and \
                    attempt == spec.retries:
                break
    except BaseException as exc:  # recorded, its runs stopped, then raised again
        await _abandon(executor, store, spec, record, exc, {}, say, exclusions,
                       save=saver.save_trial)
        raise
    assert outcome is not None
    if outcome.refused is not None:
        verdict, findings = _summary(outcome.refused)
        finish(TrialStatus.INFRA_FAILED, TrialCause.HOST_NOT_CLEAN,
               detail="; ".join(f.message for f in findings[:5]),
               verdict_before=verdict, findings_before=findings)
        raise HostQuarantined(f"{executor.name} is not clean and cleaning did not help "
                              f"({not_clean_findings(outcome.refused)})", outcome.refused)
    run = outcome.run
    phases = dict(outcome.phases)
    before_verdict, before_findings = _summary(run.verdict_before if run else None)
    record = record.model_copy(update={
        "run_id": run.id if run else None, "argv": run.argv if run else (),
        "verdict_before": before_verdict, "findings_before": before_findings})
    saver.save_trial(record)
    if not outcome.ok:
        verdict_after, findings_after = _summary(
            outcome.teardown.verify if outcome.teardown else None)
        if await _stop_requested(stop, outcome):
            # Asked to stop while the server started: the signal that reached this process
            # (Slurm's scancel, a preemption) most likely reached the engine and its
            # supervisor too, so the failure says nothing of the configuration.
            finish(TrialStatus.INFRA_FAILED, TrialCause.INTERRUPTED,
                   detail=f"stopped while the server started ({outcome.cause}: "
                   f"{outcome.detail})", log_tail=outcome.log_tail[-4000:],
                   phases=phases, verdict_after=verdict_after,
                   findings_after=findings_after)
            raise Interrupted()
        if outcome.host_failed:
            # The run folder or the supervisor failed, not the engine's command line: the slot
            # takes no more trials, and this configuration goes to another slot.
            finish(TrialStatus.INFRA_FAILED, TrialCause.LAUNCH_FAILED,
                   detail=outcome.detail, phases=phases, verdict_after=verdict_after,
                   findings_after=findings_after)
            raise HostQuarantined(f"{executor.name} could not start a run: {outcome.detail}")
        return finish(TrialStatus.INFEASIBLE, outcome.cause, detail=outcome.detail,
                      log_tail=outcome.log_tail[-4000:], phases=phases,
                      verdict_after=verdict_after, findings_after=findings_after)
    assert run is not None
    levels: list[LevelResult] = []
    level_verdicts: dict[str, LevelVerdict] = {}
    slo_checks: dict[str, dict[str, Any]] = {}
    cause: str | None = None
    detail: str | None = None
    crashed = False
    failure: BaseException | None = None
    capacity: CapacityResult | None = None
    try:
        if spec.objective.capacity:
            levels, level_verdicts, cause, detail, crashed, capacity = await _capacity_levels(
                executor, spec, config, run, phases, say, stop, seed=seed)
        else:
            levels, level_verdicts, cause, detail, crashed = await _levels(
                executor, spec, config, run, phases, say, stop, seed=seed, only=only,
                checks=slo_checks)
    except BaseException as exc:  # torn down, verified and recorded below, then raised again
        failure = exc
        detail = _describe(exc)
        if stop is not None and stop.is_set():
            # asked to stop: what broke as the levels were stopped says nothing of the
            # controller or the configuration (CI once saw a search stopped by SIGTERM so)
            cause = TrialCause.INTERRUPTED
            say(f"stopped during the levels ({detail}): tearing down")
        else:
            cause = TrialCause.CONTROLLER_ERROR
            say(f"error during the levels ({detail}): tearing down")
    say("teardown and verification")
    t0 = time.monotonic()
    try:
        tail = await log_tail(executor, run) if cause else None
        report = await stop_server(executor, store, run, grace_s=spec.grace_s,
                                   gpu_backend=gpu_backend,
                                   verify_deadline_s=spec.verify_deadline_s,
                                   status=RunStatus.CRASHED if crashed else (
                                       RunStatus.FAILED if failure is not None
                                       and cause != TrialCause.INTERRUPTED
                                       else RunStatus.STOPPED),
                                   cause=cause, detail=detail, log_tail_text=tail,
                                   exclusions=exclusions)
    except BaseException as exc:
        # The run stays recorded as running: the next start of this study stops it.
        phases["teardown_s"] = round(time.monotonic() - t0, 3)
        finish(TrialStatus.INFRA_FAILED, TrialCause.TEARDOWN_FAILED,
               detail=_describe(exc) + (f" (after {detail})" if failure is not None else ""),
               phases=phases, verdict_after=Verdict.UNKNOWN)
        raise
    phases["teardown_s"] = round(time.monotonic() - t0, 3)
    phases["total_s"] = round(time.monotonic() - started, 3)
    verdict_after, findings_after = _summary(report.verify)
    if failure is not None:
        finish(TrialStatus.INFRA_FAILED, cause, detail=detail,
               levels=tuple(levels), phases=phases,
               verdict_after=verdict_after, findings_after=findings_after)
        if cause == TrialCause.INTERRUPTED and isinstance(failure, Exception):
            raise Interrupted() from failure  # re-queued as any stopped trial
        raise failure
    if stop is not None and stop.is_set():
        finish(TrialStatus.INFRA_FAILED, TrialCause.INTERRUPTED, phases=phases,
               verdict_after=verdict_after)
        raise Interrupted()
    if capacity is not None:
        fields = capacity_fields(spec, capacity, cause if crashed else None)
        return saver.save_trial(record.model_copy(update={
            **fields, **trial_bottlenecks(tuple(levels), level_verdicts, fields["best_level"]),
            "levels": tuple(levels), "level_verdicts": level_verdicts, "phases": phases,
            "log_tail": tail[-4000:] if tail else None,
            "verdict_after": verdict_after, "findings_after": findings_after,
            "finished_at": time.time()}))
    good = [lv for lv in levels if level_verdicts.get(lv.label) == LevelVerdict.OK]
    best = spec.objective.best(good)
    # A server that crashed at a level of the ladder is decided by its crash: the objective
    # needs every level, so the value of the levels below it is kept and shown, but it is no
    # result to race or to choose (docs/study.md, "Crashes").
    status = TrialStatus.FEASIBLE if good and not crashed else TrialStatus.INFEASIBLE
    if not good and cause is None:
        cause = TrialCause.SLO_MISS
    best_label = best.label if best is not None else None
    return finish(status, cause, detail=detail,
                  value=spec.objective.value(best) if best is not None else None,
                  best_level=best_label, levels=tuple(levels),
                  **trial_bottlenecks(tuple(levels), level_verdicts, best_label),
                  level_verdicts=level_verdicts, phases=phases, slo_checks=slo_checks,
                  log_tail=tail[-4000:] if tail else None,
                  verdict_after=verdict_after, findings_after=findings_after)


#: How long a start that a signal may have ended waits for this process's own stop request:
#: ``scancel`` and a preemption signal every process of the job, in no set order.
SIGNAL_SKEW_S = 0.5


async def _stop_requested(stop: asyncio.Event | None, outcome: StartOutcome) -> bool:
    """Whether this process was asked to stop by the time its start failed. A start ended by
    a signal (the engine ``killed``, or the supervisor gone: ``launch_failed``) waits up to
    :data:`SIGNAL_SKEW_S` for the request that the same signal may bring."""
    if stop is None:
        return False
    if not stop.is_set() and outcome.cause in ("killed", "launch_failed"):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SIGNAL_SKEW_S)
    return stop.is_set()


def _describe(exc: BaseException) -> str:
    """An exception as one printable line: its type and message."""
    text = str(exc)
    return printable(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


async def _abandon(executor: Executor, store: Store, spec: StudySpec, record: TrialRecord,
                   exc: BaseException, phases: dict[str, float], say: Say,
                   exclusions: Exclusions | None = None,
                   save: Callable[[TrialRecord], TrialRecord] | None = None) -> None:
    """After an exception while a trial's server was starting: stop every run of this trial
    the store says is starting or ready, and record the trial ``infra_failed``
    (``controller_error``). Never raises for the teardown (the next start of the study stops
    what is left: :func:`recover_host`)."""
    detail = _describe(exc)
    say(f"error while starting ({detail}): stopping what this trial started")
    verdict_after = Verdict.UNKNOWN
    findings_after: tuple[Finding, ...] = ()
    stopped_any = False
    for run in store.runs(study=spec.name):
        if run.trial != record.number or not run.status.running:
            continue
        try:
            report = await stop_server(
                executor, store, run, grace_s=min(spec.grace_s, 10.0),
                verify_deadline_s=spec.verify_deadline_s, status=RunStatus.FAILED,
                cause=TrialCause.CONTROLLER_ERROR, detail=detail, exclusions=exclusions)
        except Exception as stop_exc:  # recorded below; recover_host tries again later
            detail += f"; teardown failed: {_describe(stop_exc)}"
            verdict_after = Verdict.UNKNOWN
            continue
        stopped_any = True
        verdict_after, findings_after = _summary(report.verify)
    (save or store.save_trial)(record.model_copy(update={
        "status": TrialStatus.INFRA_FAILED, "cause": TrialCause.CONTROLLER_ERROR, "detail": detail,
        "phases": phases, "verdict_after": verdict_after if stopped_any else Verdict.UNKNOWN,
        "findings_after": findings_after, "finished_at": time.time()}))


def trial_harness(stop: asyncio.Event | None, executor: Executor | None = None,
                  spec: StudySpec | None = None, run: RunRecord | None = None) -> Harness:
    """What every level of a trial brings: the stop event; the engine's metrics are watched
    as the study's ``observe`` says (:meth:`StudySpec.bench_config`), and the run's GPUs
    (the run's, else the study's) on its host through ``executor`` (unless the study's
    ``observe`` names GPUs itself, or turns GPU telemetry off)."""
    gpus = (run.gpus if run is not None and run.gpus else None) or (
        spec.gpus if spec is not None else None)
    observe = spec.observe if spec is not None else None
    samples = trial_samples(executor, run) or discard_samples
    if executor is None or not gpus or observe is None or observe.gpus is not None:
        return Harness(stop=stop, on_samples=samples)
    factory = gpu_observer(executor, gpus, observe.gpu_source)
    return Harness(stop=stop, observers=(factory,) if factory is not None else (),
                   on_samples=samples)


def trial_samples(executor: Executor | None, run: RunRecord | None) -> SampleFiles | None:
    """Where a trial's observers keep their raw samples (``docs/study.md``, "Raw samples"):
    ``observed/`` in the run's folder, beside its ``server.log``, when the run is on this
    machine (its ``artifacts_dir`` under the store's artifacts); ``None`` for a run on another
    host (its folder is there; the summaries are in the trial's levels either way: its samples
    are dropped, not kept in memory). A refused write leaves that level's file out and changes
    nothing else."""
    if executor is None or run is None or not executor.is_local or not run.artifacts_dir:
        return None
    return SampleFiles(Path(run.artifacts_dir) / "observed", where=f"run {run.id}")


async def _levels(
    executor: Executor, spec: StudySpec, config: ServeConfig, run: RunRecord,
    phases: dict[str, float], say: Say, stop: asyncio.Event | None, *,
    seed: int | None = None, only: tuple[str, ...] | None = None,
    checks: dict[str, dict[str, Any]] | None = None,
) -> tuple[list[LevelResult], dict[str, LevelVerdict], str | None, str | None, bool]:
    """Concurrency levels in ascending order; stop climbing at the first crash or SLO miss
    (only the levels labelled in ``only`` when given). The requests go to the run's port on its host
    (through an SSH forward for a remote one)."""
    async with executor.forward_port(run.port) as base_url:
        return await _climb(executor, spec, config, run, phases, say, stop, base_url,
                            seed=seed, only=only, checks=checks if checks is not None else {})


async def _climb(
    executor: Executor, spec: StudySpec, config: ServeConfig, run: RunRecord,
    phases: dict[str, float], say: Say, stop: asyncio.Event | None, base_url: str, *,
    seed: int | None = None, only: tuple[str, ...] | None = None,
    checks: dict[str, dict[str, Any]],
) -> tuple[list[LevelResult], dict[str, LevelVerdict], str | None, str | None, bool]:
    limits = spec.slo_limits()
    adapter = adapter_for(config, executor)
    bench = spec.bench_config(base_url, ignore_eos=adapter.accepts_ignore_eos)
    shares = {k: v for k, v in limits.items() if share_target(k) is not None}
    if shares:
        bench = bench.model_copy(update={"limits": shares})
    if seed is not None:
        bench = bench.model_copy(update={"seed": seed})
    loads = list(bench.loads)
    harness = trial_harness(stop, executor, spec, run)
    warmup = spec.warmup_requests()
    # One more measurement of a configuration runs its best level alone (after the warm-up):
    # its value is the objective there.
    if only is not None:
        chosen = [load for load in loads if load.label in only] or loads
        # Without the ladder below them, the warm-up fills the first chosen level's batch at
        # least once (the first measurement's lower levels warmed the server that much).
        if chosen[0] is not loads[0] and isinstance(chosen[0], ClosedLoop):
            warmup = max(warmup, chosen[0].concurrency)
        loads = chosen
    levels: list[LevelResult] = []
    verdicts: dict[str, LevelVerdict] = {}
    cause = detail = None
    crashed = False
    for index, load in enumerate(loads):
        if stop is not None and stop.is_set():
            break
        say(f"level {load.label}")
        t0 = time.monotonic()
        level = await run_level(bench, load, harness, warmup=warmup if index == 0 else 0,
                                reference=levels[0] if levels else None)
        phases[f"level_{load.label}_s"] = round(time.monotonic() - t0, 3)
        level = diagnosed(level, levels, run.server_config, bench.observe.engine,
                          workload=bench.workload, max_error_rate=bench.max_error_rate)
        levels.append(level)
        code = await run_exit_code(executor, run)
        if level.partial or code is not None:
            if stop is not None and stop.is_set() and code is None:
                verdicts[level.label] = LevelVerdict.INTERRUPTED
                break
            cause, detail = await _server_crash(executor, adapter, run, level, code)
            detail = f"{load.label}: {detail}"
            crashed = True
            verdicts[level.label] = LevelVerdict.CRASHED
            say(f"the server crashed ({cause}): {detail}")
            break
        if level.failed:
            verdicts[level.label] = LevelVerdict.ERRORS
            cause = TrialCause.REQUEST_ERRORS
            sent = level.completed + level.failed
            detail = f"{level.failed} of {sent} requests failed at {level.label}: " \
                     f"{level.errors}"
            first = next(((k, v) for k, v in level.error_details.items() if v), None)
            if first is not None:
                detail += f"; first {first[0]}: {first[1][:160]}"
            say(f"{load.label}: {detail}")
            break
        if not level.valid:
            # Not a throughput result although no request failed (a level that sent nothing,
            # or whose requests never finished): never a feasible level.
            verdicts[level.label] = LevelVerdict.ERRORS
            cause = TrialCause.REQUEST_ERRORS
            detail = f"{load.label}: not a result: {level.invalid_reason or 'invalid level'} " \
                     f"({level.sent} requests sent)"
            say(detail)
            break
        if level.bad_output:
            # The server answered, but its output broke under this load: the configuration is
            # infeasible here (the levels below it stay as measured).
            verdicts[level.label] = LevelVerdict.BAD_OUTPUT
            cause = TrialCause.BAD_OUTPUT
            count = level.output_issues.get(level.bad_output, 0)
            detail = (f"{count} of {level.output_samples} sampled responses at {level.label} "
                      f"show {level.bad_output}: " + "; ".join(level.output_evidence[:2]))
            say(f"{load.label}: bad output: {detail}")
            break
        misses = slo_misses(level, limits)
        straddling = [k for k, c in slo_attainment(level, shares,
                                                   spec.statistics.confidence).items()
                      if c["straddles"]]
        if straddling and (stop is None or not stop.is_set()):
            # The share of requests that met a percentile SLO is a sample too: an interval
            # that straddles the target is measured once more (other prompts), and the level
            # decided on the two together.
            say(f"{load.label}: {', '.join(straddling)} not settled by one sample: measuring "
                "the level once more")
            again = await run_level(bench.model_copy(update={"seed": bench.seed + 1}), load,
                                    harness, reference=levels[0])
            phases[f"level_{load.label}_again_s"] = round(time.monotonic() - t0, 3)
            pooled = pool_counts(level, again)
            attained = slo_attainment(level, shares, spec.statistics.confidence, counts=pooled)
            for c in attained.values():
                c["remeasured"] = True
            checks[level.label] = attained
            misses = [m for m in misses if m.split(" ", 1)[0] not in attained]
            misses += [f"{k}: {c['met']} of {c['n']} requests met it (< {c['target']:.1%})"
                       for k, c in attained.items() if c["met"] < c["target"] * c["n"]]
        elif shares:
            checks[level.label] = slo_attainment(level, shares, spec.statistics.confidence)
        if misses:
            verdicts[level.label] = LevelVerdict.SLO_MISS
            detail = f"{load.label}: " + "; ".join(misses)
            say(f"{load.label}: SLO missed ({'; '.join(misses)})")
            break
        verdicts[level.label] = LevelVerdict.OK
        say(f"{load.label}: {level.output_throughput:.0f} output tok/s, "
            f"p99 TTFT {level.ttft_ms.p99 or 0:.0f} ms, p99 TPOT {level.tpot_ms.p99 or 0:.1f} ms")
    return levels, verdicts, cause, detail, crashed


#: Seconds a level that ended early waits for its server's exit status (its supervisor records
#: it once the engine is gone), so that the record says how the server ended.
EXIT_STATUS_WAIT_S = 2.0


async def _server_crash(executor: Executor, adapter: EngineAdapter, run: RunRecord,
                       level: LevelResult, code: int | None) -> tuple[str, str]:
    """(cause, detail) of a server that ended by itself during or after ``level`` (``code``:
    its exit status as read, ``None`` when none was recorded yet): a crash whatever the status,
    0 included (vLLM's API server exits 0 after its engine core died), since only a stop
    cleanslate asked for is ``stopped``. The cause is the engine log's, else ``exited`` or
    ``killed`` from the status, else ``crashed`` (the level ended early and no status came
    within :data:`EXIT_STATUS_WAIT_S`)."""
    deadline = time.monotonic() + EXIT_STATUS_WAIT_S
    while code is None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        code = await run_exit_code(executor, run)
    found = await classify_run_log(executor, adapter, run, returncode=code)
    if found is not None:
        cause, detail = found
    elif code is not None:
        cause, detail = describe_exit(code)
        if level.partial_reason:
            detail += f" ({level.partial_reason})"
    else:
        cause, detail = "crashed", level.partial_reason or "the level ended early"
    return cause, detail


#: How each probe verdict of a capacity search reads as a trial's level verdict.
PROBE_LEVEL_VERDICTS: dict[ProbeVerdict, LevelVerdict] = {
    ProbeVerdict.PASS: LevelVerdict.OK,
    ProbeVerdict.FAIL: LevelVerdict.SLO_MISS,
    ProbeVerdict.UNRESOLVED: LevelVerdict.UNRESOLVED,
    ProbeVerdict.CRASHED: LevelVerdict.CRASHED,
    ProbeVerdict.ERRORS: LevelVerdict.ERRORS,
    ProbeVerdict.BAD_OUTPUT: LevelVerdict.BAD_OUTPUT,
    ProbeVerdict.INTERRUPTED: LevelVerdict.INTERRUPTED,
}


def capacity_fields(spec: StudySpec, result: CapacityResult,
                    crash_cause: str | None) -> dict[str, Any]:
    """A trial's result from its capacity search: ``capacity`` (the answer, its probes without
    their levels), ``value`` (the capacity, or the most goodput of a passing probe),
    ``best_level`` (the capacity probe's label), ``detail`` (:meth:`CapacityResult.summary`),
    ``status`` feasible when there is a value, and ``cause``: the crash's (the capacity below
    it stands), else for an infeasible trial the lowest probe's failed requests or bad output,
    else ``nothing_passes``."""
    value = result.value(spec.objective.metric)
    cause = crash_cause
    if value is None and cause is None:
        lowest = min(result.probes, key=lambda p: p.load, default=None)
        cause = lowest.cause if lowest is not None and lowest.verdict in (
            ProbeVerdict.ERRORS, ProbeVerdict.BAD_OUTPUT) else "nothing_passes"
    return {
        "status": TrialStatus.FEASIBLE if value is not None else TrialStatus.INFEASIBLE,
        "cause": cause, "detail": result.summary(), "value": value,
        "best_level": result.label(result.capacity) if result.capacity is not None else None,
        "capacity": result.without_levels(),
    }


def _describe_probe(probe: Probe) -> str:
    """One line of a decided probe: ``c=38: pass (3 of 40 ... ) 412 tok/s``."""
    worst = worst_check(probe.checks)
    text = f"{probe.label}: {probe.verdict.value}"
    if probe.measurements > 1:
        text += f" ({probe.measurements} measurements pooled)"
    if worst is not None:
        text += f"; {worst.describe()}"
    if probe.output_throughput is not None:
        text += f"; {probe.output_throughput:.0f} output tok/s"
    if probe.cause and probe.verdict != ProbeVerdict.PASS:
        text += f"; {probe.cause}" + (f": {probe.detail}" if probe.detail else "")
    return printable(text)


async def _capacity_levels(
    executor: Executor, spec: StudySpec, config: ServeConfig, run: RunRecord,
    phases: dict[str, float], say: Say, stop: asyncio.Event | None, *, seed: int | None = None,
) -> tuple[list[LevelResult], dict[str, LevelVerdict], str | None, str | None, bool,
           CapacityResult]:
    """A capacity objective's levels: the probes of a fresh search (``spec.capacity_search``)
    against the run's port (through an SSH forward for a remote host), warmed up before the
    first. After each measurement the run's exit status is read: a server that exited, or a
    probe that ended early, is a crash, its cause from the engine's log as a climb's
    (:func:`classify_run_log`); the search ends there and its capacity below it stands. The
    stop event ends the search (its probe ``interrupted``)."""
    from cleanslate.bench import find_max

    adapter = adapter_for(config, executor)
    search = spec.capacity_search()
    async with executor.forward_port(run.port) as base_url:
        bench = spec.bench_config(base_url, ignore_eos=adapter.accepts_ignore_eos)
        if seed is not None:
            bench = bench.model_copy(update={"seed": seed})

        async def check_server(level: LevelResult) -> tuple[str, str] | None:
            code = await run_exit_code(executor, run)
            if not level.partial and code is None:
                return None
            if stop is not None and stop.is_set() and code is None:
                return None  # interrupted, not crashed
            return await _server_crash(executor, adapter, run, level, code)

        mark = [time.monotonic()]

        def on_probe(probe: Probe) -> None:
            now = time.monotonic()
            phases[f"level_{probe.label}_s"] = round(now - mark[0], 3)
            mark[0] = now
            say(_describe_probe(probe))

        say(f"capacity search from c={spec.capacity.start} (tolerance "
            f"{spec.capacity.tolerance:.0%}, at most {spec.capacity.max_probes} probes)")
        harness = trial_harness(stop, executor, spec, run)
        recorded = run.server_config
        if recorded is not None:
            # the configuration read at launch, with the flags asked: the probes' verdicts
            # read it, and the server is not asked again
            async def read_recorded(_session: object, _url: str,
                                    config: ServerConfig = recorded) -> ServerConfig:
                return config

            harness.read_config = read_recorded
        result = await find_max(bench, search, harness,
                                warmup=spec.warmup_requests(),
                                max_extensions=spec.capacity.max_extensions,
                                check_server=check_server, on_probe=on_probe)
    levels = [p.level for p in result.probes if p.level is not None]
    verdicts = {p.label: PROBE_LEVEL_VERDICTS[p.verdict] for p in result.probes}
    crashed_at = next((p for p in result.probes if p.verdict == ProbeVerdict.CRASHED), None)
    cause = detail = None
    if crashed_at is not None:
        cause, detail = crashed_at.cause, f"{crashed_at.label}: {crashed_at.detail}"
        say(f"the server crashed ({cause}): {detail}")
    say(result.summary())
    return levels, verdicts, cause, detail, crashed_at is not None, result
