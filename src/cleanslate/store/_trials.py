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

from cleanslate.bench._models import LevelResult
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


class StudyStatus(StrEnum):
    """``running``, ``finished`` (its plan or trial budget is done), or why it stopped before:
    ``hours`` (time budget), ``quarantine`` (the host stayed dirty), ``interrupted``, ``error``."""

    RUNNING = "running"
    FINISHED = "finished"
    HOURS = "hours"
    QUARANTINE = "quarantine"
    INTERRUPTED = "interrupted"
    ERROR = "error"


def level_metric(level: LevelResult, key: str) -> float | None:
    """A key of a level's JSON (``output_throughput``, ``p99_ttft_ms`` ...) as a finite
    number; ``None`` for a key it does not have, a statistic without samples, NaN and
    infinities."""
    value = level.model_dump().get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


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
