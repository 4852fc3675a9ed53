"""Studies and trials as the store keeps them.

A separate module from the run record: a trial's levels are
:class:`~cleanslate.bench.LevelResult` models, and the benchmark client is a heavy import that
commands reading only runs (``check``, ``stop``) never need.
"""

from __future__ import annotations

import math
import time
from enum import StrEnum
from typing import Any

from pydantic import Field

from cleanslate.bench import Bottleneck, CapacityResult, ClosedLoop, LevelResult, OpenLoop
from cleanslate.models import Frozen
from cleanslate.store._records import Record
from cleanslate.verdict.findings import Finding, Verdict


class TrialStatus(StrEnum):
    """``running`` (its cycle is under way, or its controller died), ``feasible`` (measured, at
    least one level met the SLOs), ``infeasible`` (a result: failed to start, OOM, NaN, crashed
    under load or missed every SLO; the trial's ``cause`` says which), ``infra_failed`` (the
    host was dirty or unreachable: not a result; the configuration is run again)."""

    RUNNING = "running"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    INFRA_FAILED = "infra_failed"

    @property
    def finished(self) -> bool:
        """True for a result of the study (feasible or infeasible)."""
        return self in (TrialStatus.FEASIBLE, TrialStatus.INFEASIBLE)


class TrialCause(StrEnum):
    """The causes a study's controller gives a trial itself. A trial that failed in its
    engine (OOM, a Python exception, a crash under load) carries the cause its run was given
    from the engine's log instead, which is an open set: ``TrialRecord.cause`` is text."""

    HOST_NOT_CLEAN = "host_not_clean"  # dirty before the start, and cleaning did not help
    LAUNCH_FAILED = "launch_failed"  # the run folder or the supervisor failed, not the engine
    INTERRUPTED = "interrupted"  # the controller was asked to stop
    TEARDOWN_FAILED = "teardown_failed"
    CONTROLLER_ERROR = "controller_error"  # an error of this process during the cycle
    CONTROLLER_DIED = "controller_died"  # found running by the next controller
    SLO_MISS = "slo_miss"  # no level met every SLO
    REQUEST_ERRORS = "request_errors"
    BAD_OUTPUT = "bad_output"


class LevelVerdict(StrEnum):
    """How one benchmark level of a trial went: ``ok`` (met every SLO), ``slo_miss``,
    ``errors`` (requests failed), ``bad_output`` (sampled responses were NaN, empty, degenerate
    or ended in error: :mod:`cleanslate.outputs`), ``crashed`` (the server died under the load)
    or ``interrupted`` (the controller was asked to stop during it)."""

    OK = "ok"
    SLO_MISS = "slo_miss"
    ERRORS = "errors"
    BAD_OUTPUT = "bad_output"
    CRASHED = "crashed"
    INTERRUPTED = "interrupted"
    UNRESOLVED = "unresolved"  # a capacity probe whose SLO intervals held the target


class StudyStatus(StrEnum):
    """``running``, ``finished`` (its plan or trial budget is done), or why it stopped before:
    ``hours`` (time budget), ``quarantine`` (the host stayed dirty), ``interrupted``, ``error``."""

    RUNNING = "running"
    FINISHED = "finished"
    HOURS = "hours"
    QUARANTINE = "quarantine"
    INTERRUPTED = "interrupted"
    ERROR = "error"


#: How a level went when it is where a configuration stopped holding: it missed an SLO,
#: failed requests, gave bad output or crashed (``interrupted`` and ``unresolved`` say
#: nothing of the configuration).
MISSED = frozenset({LevelVerdict.SLO_MISS, LevelVerdict.ERRORS, LevelVerdict.BAD_OUTPUT,
                    LevelVerdict.CRASHED})


def _load_of(level: LevelResult) -> float:
    load = level.load
    if isinstance(load, ClosedLoop):
        return float(load.concurrency)
    if isinstance(load, OpenLoop):
        return float(load.rate)
    return math.inf


def trial_bottlenecks(levels: tuple[LevelResult, ...], verdicts: dict[str, LevelVerdict],
                      best_level: str | None) -> dict[str, Any]:
    """The fields of a trial's record that say what bound it (``docs/study.md``, "What bound
    each trial"): ``best_bottleneck``, the verdict at ``best_level``; ``limit_level`` and
    ``limit_bottleneck``, the least load whose level missed an SLO, failed or crashed
    (:data:`MISSED`; a climb's first, a capacity search's lowest such probe) and its verdict.
    ``None`` where there is no such level or it was not diagnosed."""
    best = next((lv for lv in levels if lv.label == best_level), None)
    missed = [(i, lv) for i, lv in enumerate(levels) if verdicts.get(lv.label) in MISSED]
    limit = min(missed, key=lambda pair: (_load_of(pair[1]), pair[0]), default=None)
    return {"best_bottleneck": best.bottleneck if best is not None else None,
            "limit_level": limit[1].label if limit is not None else None,
            "limit_bottleneck": limit[1].bottleneck if limit is not None else None}


def level_metric(level: LevelResult, key: str) -> float | None:
    """A key of a level's JSON (``output_throughput``, ``p99_ttft_ms`` ...) as a finite
    number; ``None`` for a key it does not have, a statistic without samples, NaN and
    infinities."""
    value = level.model_dump().get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class Replicate(Frozen):
    """One more measurement of a trial's configuration (a whole cycle: a new server, the
    levels up to the trial's best, teardown and verification), as a race or ``replicates: N``
    takes it (``docs/statistics.md``). ``index`` 0 is the trial's own first measurement (its
    ``levels`` are the trial's); ``seed`` is the seed of its prompts (the members of a pair share
    it); ``pair`` and ``against`` name the race pair and the trial it was paired with;
    ``discarded`` says why it does not count (``first_repeat``: slower than the rest right
    after a start). ``gpu_s`` is its wall time times the GPUs it held."""

    index: int
    seed: int
    status: TrialStatus
    value: float | None = None
    best_level: str | None = None
    cause: str | None = None
    detail: str | None = None
    levels: tuple[LevelResult, ...] = ()
    level_verdicts: dict[str, LevelVerdict] = Field(default_factory=dict)
    run_id: str | None = None
    host: str | None = None
    slot: str | None = None
    pair: int | None = None
    against: int | None = None
    discarded: str | None = None
    gpu_s: float = 0.0
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    capacity: CapacityResult | None = None


class Race(Frozen):
    """A challenger raced against the incumbent (``against``, a trial number) in ``pairs``
    interleaved pairs: ``outcome`` win, loss, tie or undecided (:class:`cleanslate.stats.Outcome`),
    ``diff`` the challenger's objective over the incumbent's minus one (geometric mean of the
    pairs), ``low``..``high`` its interval at the study's confidence, or ``None`` below two
    pairs."""

    against: int
    outcome: str
    diff: float
    low: float | None = None
    high: float | None = None
    pairs: int = 1
    slot: str | None = None


class GuidedStep(Frozen):
    """One entry of a guided study's lab notebook (``strategy: guided``, ``docs/study.md``):
    the trial it is written on tried ``flag`` ``old`` -> ``new`` against the incumbent trial
    ``against`` because the incumbent's verdict at ``level`` was ``verdict`` (``evidence``: its
    first evidence line; ``why``: the adapter's reason for the change). ``step`` is its number
    in the notebook (0: the baseline). ``effect`` is the challenger's objective over the
    incumbent's minus one, ``low``..``high`` its interval at the study's confidence (``None``:
    one run, or a race of one pair), ``pairs`` how many pairs decided it. ``outcome``:
    ``baseline``, ``kept``, ``reverted`` or ``running`` (not decided yet); ``sampler``: the
    configuration came from the sampler (a verdict ``unknown``, or ``then: tpe``), not from a
    rule; ``note``: why it was kept or reverted, in words.

    A step built on a reverted one (its own verdict followed: a cap raised that the KV cache
    then bound, a graph that crashed) names it in ``base`` (that trial's number) and keeps its
    changes from the incumbent in ``carried`` (flag -> value, ``flag`` apart); ``verdict``,
    ``level`` and ``evidence`` are then that trial's."""

    step: int
    against: int | None = None
    level: str | None = None
    verdict: str = ""
    evidence: str = ""
    cause: str | None = None
    flag: str | None = None
    old: Any = None
    new: Any = None
    why: str = ""
    sampler: bool = False
    effect: float | None = None
    low: float | None = None
    high: float | None = None
    pairs: int = 0
    outcome: str = "running"
    note: str = ""
    base: int | None = None
    carried: dict[str, Any] = Field(default_factory=dict)


class TrialRecord(Record):
    """One trial as the store keeps it.

    ``levels`` are the benchmark levels in order, ``level_verdicts`` how each went (by label);
    ``value`` is the objective at ``best_level``, the best level that met the SLOs.
    ``verdict_before`` / ``verdict_after`` are the host checks around the trial (``None``: that
    check did not run) and ``findings_*`` their error and unknown findings. ``params`` are the
    searched flags, ``flags`` every flag the server got.
    """

    id: int | None = None
    study: str
    number: int
    params: dict[str, Any]
    flags: dict[str, Any] = Field(default_factory=dict)
    status: TrialStatus = TrialStatus.RUNNING
    cause: str | None = None
    detail: str | None = None
    value: float | None = None
    best_level: str | None = None
    levels: tuple[LevelResult, ...] = ()
    level_verdicts: dict[str, LevelVerdict] = Field(default_factory=dict)
    phases: dict[str, float] = Field(default_factory=dict)
    run_id: str | None = None
    argv: tuple[str, ...] = ()
    host: str | None = None
    log_tail: str | None = None
    verdict_before: Verdict | None = None
    verdict_after: Verdict | None = None
    findings_before: tuple[Finding, ...] = ()
    findings_after: tuple[Finding, ...] = ()
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    # Statistics (``docs/statistics.md``): with replicates, ``value`` is the mean of the counted
    # measurements (``replicates``, the first one included), ``ci_low``..``ci_high`` its
    # Student-t interval, ``first_value`` the first measurement's; ``races`` the races this
    # configuration ran as a challenger; ``gpu_s`` the GPU-seconds of its first cycle.
    first_value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_replicates: int = 1
    replicates: tuple[Replicate, ...] = ()
    races: tuple[Race, ...] = ()
    gpu_s: float = 0.0
    slot: str | None = None
    slo_checks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # A capacity objective (``max_concurrency_under_slo``, ``max_goodput``): the search's
    # answer, its probes without their levels (those are ``levels``, in probe order).
    capacity: CapacityResult | None = None
    # What bound it (:func:`trial_bottlenecks`): the bottleneck verdict at ``best_level``, and
    # at ``limit_level``, the least load that missed an SLO, failed or crashed.
    best_bottleneck: Bottleneck | None = None
    limit_level: str | None = None
    limit_bottleneck: Bottleneck | None = None
    # A guided study's notebook entry for this trial (``strategy: guided``).
    guided: GuidedStep | None = None

    def counted(self) -> list[Replicate]:
        """The measurements that count toward ``value``: feasible, with a value, not
        discarded."""
        return [r for r in self.replicates
                if r.status == TrialStatus.FEASIBLE and r.value is not None and not r.discarded]

    def statistics_gpu_s(self) -> float:
        """GPU-seconds spent on this configuration's measurements beyond its first."""
        return sum(r.gpu_s for r in self.replicates if r.index > 0)

    @property
    def crashed_at(self) -> str | None:
        """The label of the level (a capacity search's probe) at which the trial's server
        crashed, as ``level_verdicts`` recorded it (``crashed``); ``None`` when it did not."""
        return next((label for label, verdict in self.level_verdicts.items()
                     if verdict == LevelVerdict.CRASHED), None)

    @property
    def crash_text(self) -> str | None:
        """``crashed at c=256 (python_exception)``: where the server crashed and the cause
        from its log (``crashed`` when none was classified); ``None`` when it did not. A
        trial's status as the table, the progress lines and the report show it: it comes
        before ``feasible`` (a capacity search's answer below the crash stands) and before
        ``infeasible`` (a ladder that crashed: ``docs/study.md``, "Crashes")."""
        at = self.crashed_at
        return None if at is None else f"crashed at {at} ({self.cause or 'crashed'})"

    def level(self, label: str | None) -> LevelResult | None:
        """The level with this label (``None`` when there is none)."""
        return next((lv for lv in self.levels if lv.label == label), None)

    def metric(self, key: str) -> float | None:
        """A key of the best level (:func:`level_metric`); ``None`` without a best level."""
        best = self.level(self.best_level)
        return level_metric(best, key) if best is not None else None


class StudyRecord(Record):
    """A study as the store keeps it: its definition (the study file's JSON, redacted: a
    document whose keys are the study file's), its status, and when it ran. Times are epoch
    seconds; ``elapsed_s`` is the wall time its controllers spent on it."""

    name: str
    spec: dict[str, Any]
    status: StudyStatus
    created_at: float
    updated_at: float
    elapsed_s: float = 0.0
