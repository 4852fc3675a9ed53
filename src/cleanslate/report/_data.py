"""What a report shows, read from the store: :class:`StudyReport` and its derived figures.

Everything here is plain data (no rich, no matplotlib): the tables, the plots, the HTML page and
the exports are all drawn from a :class:`StudyReport`. Units: throughputs in tokens/s, latencies
in milliseconds, times in seconds.
"""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cleanslate.bench import (
    CAPACITY_OBJECTIVES,
    CapacityResult,
    ClosedLoop,
    LevelResult,
    OpenLoop,
)
from cleanslate.engines import engine_class, engine_names
from cleanslate.errors import InputError
from cleanslate.report._documents import SharedConfigDocument, SlotDocument
from cleanslate.report._stats import (
    Difference,
    Standing,
    difference,
    level_interval,
    race_difference,
    standing,
    statistics_of,
    trial_interval,
)
from cleanslate.stats import Interval
from cleanslate.store import (
    HostRecord,
    LevelVerdict,
    RunRecord,
    Store,
    StudyStatus,
    TrialRecord,
    TrialStatus,
    level_metric,
)
from cleanslate.tune.factors import Scalar
from cleanslate.tune.study import Objective, Statistics
from cleanslate.verdict.findings import Finding, Severity, Verdict

_Item = TypeVar("_Item")

#: Trial statuses in the order a report lists them after sorting by the objective.
STATUS_ORDER = (TrialStatus.FEASIBLE, TrialStatus.INFEASIBLE, TrialStatus.INFRA_FAILED,
                TrialStatus.RUNNING)

#: Severities of the host-check findings a report shows (``info`` is only in JSON).
_SHOWN = (Severity.ERROR, Severity.UNKNOWN, Severity.WARNING)

#: Level keys shown for a trial's best level: (key, header, unit).
LEVEL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("output_throughput", "output tok/s", "tokens/s"),
    ("total_token_throughput", "total tok/s", "tokens/s"),
    ("p50_ttft_ms", "TTFT p50 ms", "ms"),
    ("p99_ttft_ms", "TTFT p99 ms", "ms"),
    ("median_tpot_ms", "TPOT p50 ms", "ms"),
    ("p99_tpot_ms", "TPOT p99 ms", "ms"),
)


def show(value: object) -> str:
    """A flag value as a report shows it: ``unset`` for null (the flag is not passed)."""
    return "unset" if value is None else str(value)


def params_text(params: Mapping[str, Scalar]) -> str:
    """``flag=value flag=value`` with :func:`show`'s values."""
    return " ".join(f"{k}={show(v)}" for k, v in params.items())


def level_concurrency(level: LevelResult) -> float | None:
    """The x of a level in throughput-against-load plots: the closed loop's concurrency, an
    open loop's rate (requests/s; ``None`` for an infinite one, a replay or a ramp)."""
    load = level.load
    if isinstance(load, ClosedLoop):
        return float(load.concurrency)
    if isinstance(load, OpenLoop) and math.isfinite(load.rate):
        return float(load.rate)
    return None


#: Lines of a failed trial's log that its excerpt shows at most (:func:`log_excerpt`).
EXCERPT_LINES = 12


def log_excerpt(tail: str, lines: int = EXCERPT_LINES) -> str:
    """The part of a server's log tail that says why it failed, as text (never interpreted):
    its last Python traceback from ``Traceback`` to the exception's line (its first frames
    elided past ``lines``), else its last ``lines`` non-empty lines; empty for an empty
    tail."""
    rows = tail.splitlines()
    start = next((i for i in range(len(rows) - 1, -1, -1) if "Traceback" in rows[i]), None)
    if start is None:
        return "\n".join([r for r in rows if r.strip()][-lines:])
    end = next((i for i in range(start + 1, len(rows))
                if rows[i].strip() and not rows[i][:1].isspace()), len(rows) - 1)
    block = rows[start:end + 1]
    if len(block) > lines:
        block = [block[0], "  ...", *block[-(lines - 2):]]
    return "\n".join(block)


@dataclass(frozen=True)
class TrialView:
    """One trial with what a report needs beside its record: its run (if recorded)."""

    record: TrialRecord
    run: RunRecord | None = None

    @property
    def number(self) -> int:
        return self.record.number

    @property
    def status(self) -> TrialStatus:
        return self.record.status

    @property
    def feasible(self) -> bool:
        return self.record.status == TrialStatus.FEASIBLE and self.record.value is not None

    @property
    def best(self) -> LevelResult | None:
        """The trial's best feasible level (the one its value was taken from), if any."""
        return self.record.level(self.record.best_level)

    def metric(self, key: str) -> float | None:
        """A key of the best feasible level (``output_throughput``, ``p99_ttft_ms`` ...) of the
        first measurement (:meth:`metric_interval` has the mean over every measurement)."""
        return self.record.metric(key)

    def interval(self, confidence: float = 0.95) -> Interval | None:
        """The trial's value with its interval (:func:`~cleanslate.report._stats.
        trial_interval`); ``None`` without a value."""
        return trial_interval(self.record, confidence)

    def metric_interval(self, key: str, confidence: float = 0.95) -> Interval | None:
        """A key of the best level over the trial's counted measurements: mean and Student-t
        interval (the first measurement's value alone without replicates); ``None`` when no
        measurement has it or the trial has no best level."""
        if not self.feasible:
            return None
        return level_interval(self.record, self.record.best_level, key, confidence)

    @property
    def statistics_gpu_s(self) -> float:
        """GPU-seconds of this configuration's measurements beyond its first."""
        return self.record.statistics_gpu_s()

    def level_verdict(self, level: LevelResult) -> str:
        """How a level of this trial went (:class:`~cleanslate.store.LevelVerdict`), ``?``
        when not recorded."""
        return self.record.level_verdicts.get(level.label, "?")

    @property
    def capacity(self) -> CapacityResult | None:
        """The answer of the trial's capacity search (a capacity objective), its probes in
        order (their levels are the trial's, by label: :meth:`probe_level`); ``None`` for a
        trial that ran a ladder of levels."""
        return self.record.capacity

    def probe_level(self, label: str) -> LevelResult | None:
        """The measurement of a capacity probe (the trial's level of that label)."""
        return self.record.level(label)

    @property
    def launch_command(self) -> str:
        """The exact engine command, shell-quoted (from the trial, else its run)."""
        argv = self.record.argv or (self.run.argv if self.run else ())
        return shlex.join(argv) if argv else ""

    @property
    def crash_text(self) -> str | None:
        """``crashed at c=256 (python_exception)`` for a trial whose server crashed at a level
        (:attr:`~cleanslate.store.TrialRecord.crash_text`), else ``None``."""
        return self.record.crash_text

    @property
    def cause_text(self) -> str:
        """``cause: detail`` for a trial that was not feasible or whose server crashed (empty
        for a feasible one that did not)."""
        if self.status == TrialStatus.FEASIBLE and self.crash_text is None:
            return ""
        parts = [p for p in (self.record.cause, self.record.detail) if p]
        return ": ".join(parts)

    def host_findings(self, when: str) -> list[Finding]:
        """The findings of the host check ``before`` or ``after`` the trial that a reader should
        see (errors, unknowns, warnings), from the run's full check report when recorded, else
        the trial's own (errors and unknowns only)."""
        report = (self.run.verdict_before if when == "before" else self.run.verdict_after
                  ) if self.run else None
        if report is not None:
            return [f for host in report.hosts for f in host.findings if f.severity in _SHOWN]
        return list(self.record.findings_before if when == "before"
                    else self.record.findings_after)

    def host_verdict(self, when: str) -> str:
        """``clean``, ``dirty``, ``unknown``, or ``-`` when that check did not run."""
        value: Verdict | None = (self.record.verdict_before if when == "before"
                                 else self.record.verdict_after)
        if value is None and self.run is not None:
            report = self.run.verdict_before if when == "before" else self.run.verdict_after
            value = report.verdict if report is not None else None
        return value.value if value is not None else "-"

    @property
    def log_tail(self) -> str:
        return self.record.log_tail or (self.run.log_tail if self.run and self.run.log_tail
                                        else "")

    @property
    def log_excerpt(self) -> str:
        """The lines of the log tail that say why the trial failed (:func:`log_excerpt`)."""
        return log_excerpt(self.log_tail)


@dataclass(frozen=True)
class Effect:
    """One change of an ablation study against its baseline.

    ``change_pct`` is the relative change of the objective, in percent (``None`` when the
    changed configuration or the baseline has no value); ``better`` says whether the change
    moved the objective in its direction; ``cause`` names why an infeasible change failed.
    """

    factor: str
    baseline_value: Scalar
    value: Scalar
    trial: TrialView
    change_pct: float | None
    better: bool | None
    cause: str | None
    difference: Difference | None = None
    #: the baseline's trial (what bound it is compared with the change's: ``report._bounds``)
    baseline: TrialView | None = None

    @property
    def significant(self) -> bool:
        """Whether the change's interval excludes no difference."""
        return self.difference is not None and self.difference.significant

    @property
    def in_noise(self) -> bool:
        """Whether the change has an interval and it holds no difference (no significant
        effect); ``False`` for a change measured once (no interval to tell)."""
        d = self.difference
        return d is not None and d.low is not None and not d.significant

    @property
    def effect_text(self) -> str:
        """``+4.2 % [+1.0, +7.5]``, or with the outcome (``tie``, ``undecided``, ``undecided:
        too few measurements``) / ``one run each: no interval`` when it is not a significant
        difference, ``not compared: no interval`` when the two were not compared."""
        d = self.difference
        if self.change_pct is None:
            return f"infeasible: {self.cause}" if self.cause else "no baseline value"
        if d is None or d.diff is None:
            # no comparison of measurements (a side without its samples): a bare change
            # would read as a result
            return f"{self.change_pct:+.1f} % (not compared: no interval)"
        head = f"{d.diff * 100:+.1f} %"
        if d.low is not None and d.high is not None:
            head += f" [{d.low * 100:+.1f}, {d.high * 100:+.1f}]"
        if d.significant:
            return head
        return f"{head} ({d.verdict_text})"

    @property
    def label(self) -> str:
        return f"{self.factor}: {show(self.baseline_value)} → {show(self.value)}"


@dataclass(frozen=True)
class SlotSummary:
    """One slot of a study (``host/gpus=.../port=...``): the trials it ran (leases released
    with a result), its infrastructure failures (leases given back without one, lost or
    expired), and its state (``ok``, ``suspect``, ``quarantined``) with why and the
    evidence."""

    slot: str
    host: str
    trials: int = 0
    infra_failures: int = 0
    state: str = "ok"
    reason: str | None = None
    findings: tuple[Finding, ...] = ()

    def document(self) -> SlotDocument:
        return {"slot": self.slot, "host": self.host, "trials": self.trials,
                "infra_failures": self.infra_failures, "state": self.state,
                "reason": self.reason,
                "findings": [f.model_dump(mode="json") for f in self.findings]}


def slot_summaries(store: Store, name: str) -> tuple[SlotSummary, ...]:
    """Per slot of a study, from its leases and its slot records (``cs_leases``,
    ``cs_slots``), in the order of the slots' keys."""
    from cleanslate.store import LeaseOutcome, LeaseState

    counts: dict[str, list[int]] = {}
    hosts: dict[str, str] = {}
    for lease in store.leases(name):
        count = counts.setdefault(lease.slot, [0, 0])
        hosts[lease.slot] = lease.host
        if lease.state == LeaseState.RELEASED and lease.outcome == LeaseOutcome.RESULT:
            count[0] += 1
        elif lease.state != LeaseState.ACTIVE:
            count[1] += 1
    records = {r.slot: r for r in store.slots(name)}
    out = []
    for slot in sorted(set(counts) | set(records)):
        trials, infra = counts.get(slot, [0, 0])
        record = records.get(slot)
        out.append(SlotSummary(
            slot=slot, host=record.host if record else hosts.get(slot, ""), trials=trials,
            infra_failures=infra, state=record.state.value if record else "ok",
            reason=record.reason if record else None,
            findings=record.findings if record else ()))
    return tuple(out)


@dataclass(frozen=True)
class StudyReport:
    """One study as a report shows it: its spec, its trials (with their runs), and its best.

    ``trials`` holds every trial record of the study, finished or not; ``results`` only the
    feasible and infeasible ones (the study's results; infrastructure failures are retried and
    are not results). ``hosts``: the doctor snapshot of each host the study ran on (none for a
    study recorded before snapshots were).
    """

    name: str
    spec: dict[str, Any]
    status: StudyStatus
    created_at: float | None
    elapsed_s: float | None
    trials: tuple[TrialView, ...]
    store_url: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    slots: tuple[SlotSummary, ...] = ()
    hosts: tuple[HostRecord, ...] = ()
    #: the store's artifacts folder (runs' logs and kept samples), ``None`` when it is not
    #: trusted (another user's, or writable by others: nothing is read from it)
    artifacts: Path | None = None

    # -- the spec ------------------------------------------------------------------------------

    @property
    def engine(self) -> str:
        return str(self.spec.get("engine", "?"))

    @property
    def simulated(self) -> bool:
        """True when the engine is a simulation (numbers from a model, not a GPU: the adapter's
        ``simulated``); an engine this cleanslate does not know is taken as real."""
        return self.engine in engine_names() and engine_class(self.engine).simulated

    @property
    def model(self) -> str:
        return str(self.spec.get("model", "?"))

    @property
    def strategy(self) -> str:
        return str(self.spec.get("strategy", "?"))

    @property
    def objective(self) -> Objective:
        """The study's objective (:meth:`Objective.of` its spec; a capacity objective,
        ``max_concurrency_under_slo`` or ``max_goodput``, as the spec names it)."""
        raw = self.spec.get("objective")
        if isinstance(raw, dict) and len(raw) == 1:
            ((direction, metric),) = raw.items()
            if direction == "maximize" and metric in CAPACITY_OBJECTIVES:
                return Objective.model_construct(maximize=str(metric), minimize=None)
        return Objective.of(self.spec)

    @property
    def capacity(self) -> bool:
        """Whether the study searched each configuration's capacity under its SLOs (a
        capacity objective, or trials that carry a search's answer)."""
        return self.metric in CAPACITY_OBJECTIVES or any(
            t.capacity is not None for t in self.trials)

    @property
    def capacity_trials(self) -> list[TrialView]:
        """The trials with a capacity search's answer, in the table's order."""
        return [t for t in self.sorted_trials() if t.capacity is not None]

    @property
    def metric(self) -> str:
        return self.objective.metric

    @property
    def direction(self) -> str:
        return self.objective.direction

    @property
    def factors(self) -> list[str]:
        """The searched flags, in the study file's order (then any only trials have)."""
        names = list((self.spec.get("space") or {}).keys())
        for t in self.trials:
            for key in t.record.params:
                if key not in names:
                    names.append(key)
        return names

    @property
    def baseline(self) -> dict[str, Scalar]:
        return dict(self.spec.get("baseline") or {})

    @property
    def slo(self) -> dict[str, float]:
        return dict(self.spec.get("slo") or {})

    @property
    def statistics(self) -> Statistics:
        """The study's ``statistics:`` (the defaults when it has none)."""
        return statistics_of(self.spec)

    @property
    def confidence(self) -> float:
        return self.statistics.confidence

    @functools.cached_property
    def standing(self) -> Standing:
        """The best trial, the trials tied with it or undecided against it, and what the
        statistics cost, as the study decided them (:func:`cleanslate.tune.race.tie_set`)."""
        return standing([t.record for t in self.trials], self.spec)

    @functools.cached_property
    def host_effects(self) -> dict[str, Interval]:
        """Each slot's effect on the objective (a ratio minus one, with its interval), from the
        configurations measured on more than one slot (:func:`cleanslate.tune.race.
        host_effects`); empty for a study that ran on one slot."""
        from cleanslate.tune.race import host_effects

        return host_effects([t.record for t in self.trials], self.confidence)

    @property
    def replicated(self) -> bool:
        """Whether any trial was measured more than once (its figures carry intervals)."""
        return any(t.record.replicates and len(t.record.replicates) > 1 for t in self.trials)

    # -- the trials -----------------------------------------------------------------------------

    @property
    def results(self) -> list[TrialView]:
        return [t for t in self.trials if t.status.finished]

    def sorted_trials(self) -> list[TrialView]:
        """Feasible trials, the best (:attr:`best`) first, then by the objective; then
        infeasible, infrastructure failures and running ones, each group by trial number."""
        sign = -1.0 if self.direction == "maximize" else 1.0
        best = self.standing.best

        def key(t: TrialView) -> tuple[int, int, float, int]:
            group = STATUS_ORDER.index(t.status) if t.status in STATUS_ORDER else len(
                STATUS_ORDER)
            value = t.record.value if t.feasible and t.record.value is not None else 0.0
            return group, 0 if t.feasible and t.number == best else 1, sign * value, t.number

        return sorted(self.trials, key=key)

    @property
    def best(self) -> TrialView | None:
        """The best trial as the study decided it (:attr:`standing`: with races, the incumbent
        after every race; else the best mean), else the best feasible trial by the objective
        (ties: the lower trial number)."""
        number = self.standing.best
        chosen = self.trial(number) if number is not None else None
        if chosen is not None and chosen.feasible:
            return chosen
        ordered = [t for t in self.sorted_trials() if t.feasible]
        return ordered[0] if ordered else None

    def tied_with_best(self) -> list[TrialView]:
        """The trials tied with the best, by number."""
        return [t for n in sorted(self.standing.tied) if (t := self.trial(n)) is not None]

    def mark(self, trial: TrialView) -> str:
        """``best``, else the outcome against it (``tie``, ``undecided``, ``loss``), or
        empty."""
        return self.standing.of(trial.number)

    @property
    def failures(self) -> list[TrialView]:
        """Trials that were not feasible (results and infrastructure failures) and those whose
        server crashed at any level (a capacity search's answer below its crash stands: still
        feasible, listed here too), by number."""
        return sorted((t for t in self.trials if t.status != TrialStatus.FEASIBLE
                       or t.crash_text is not None), key=lambda t: t.number)

    def trial(self, number: int) -> TrialView | None:
        return next((t for t in self.trials if t.number == number), None)

    def short_params(self, trial: TrialView) -> str:
        """The trial's parameters that differ from the baseline (all of them without one)."""
        base = self.baseline
        params = trial.record.params
        if base and params == {k: base.get(k) for k in params}:
            return "baseline"
        shown = {k: v for k, v in params.items() if not base or base.get(k) != v}
        return params_text(shown)

    # -- derived figures ------------------------------------------------------------------------

    def baseline_trial(self) -> TrialView | None:
        """The (first finished) trial run with exactly the baseline configuration."""
        base = self.baseline
        if not base:
            return None
        matches = [t for t in self.results
                   if {k: t.record.params.get(k) for k in base} == base]
        return min(matches, key=lambda t: t.number) if matches else None

    def ablation_effects(self) -> list[Effect]:
        """Each one-flag change against the baseline (ablation studies; empty otherwise or
        without a finished baseline trial)."""
        base_trial = self.baseline_trial()
        if self.strategy != "ablation" or base_trial is None:
            return []
        base = self.baseline
        base_value = base_trial.record.value if base_trial.feasible else None
        maximize = self.direction == "maximize"
        out: list[Effect] = []
        for t in sorted(self.results, key=lambda t: t.number):
            changed = [k for k in base if t.record.params.get(k) != base[k]]
            if len(changed) != 1:
                continue
            factor = changed[0]
            value = t.record.value if t.feasible else None
            pct: float | None = None
            better: bool | None = None
            if value is not None and base_value:
                pct = (value - base_value) / abs(base_value) * 100.0
                better = (pct > 0) if self.direction == "maximize" else (pct < 0)
            diff: Difference | None = None
            if value is not None and base_value:
                raced = race_difference(t.record, base_trial.number)
                back = race_difference(base_trial.record, t.number)
                diff = raced if raced is not None else (
                    back.inverted() if back is not None else
                    difference(base_trial.record, t.record, self.statistics,
                               higher_is_better=maximize))
            out.append(Effect(factor=factor, baseline_value=base[factor],
                              value=t.record.params.get(factor), trial=t, change_pct=pct,
                              better=better,
                              cause=None if t.feasible else (
                                  t.record.crash_text or t.record.cause or t.status),
                              difference=diff, baseline=base_trial))
        return out

    def level_points(self) -> list[tuple[TrialView, LevelResult, float, float]]:
        """Every measured level as ``(trial, level, output tokens/s, p99 TTFT ms)``: the
        means over the trial's measurements of that level when it has several
        (:meth:`level_interval`), else the level's own figures."""
        out = []
        for t in self.trials:
            for level in t.record.levels:
                x = self.level_interval(t, level, "output_throughput")
                y = self.level_interval(t, level, "p99_ttft_ms")
                if x is not None and y is not None:
                    out.append((t, level, x.mean, y.mean))
        return out

    def level_interval(self, trial: TrialView, level: LevelResult,
                       key: str) -> Interval | None:
        """``key`` of ``level`` over the trial's measurements of it: mean and Student-t interval
        at the study's confidence (no interval with one measurement; the level's own value
        when the trial has no replicates); ``None`` when no measurement has it."""
        found = level_interval(trial.record, level.label, key, self.confidence)
        if found is not None:
            return found
        value = level_metric(level, key)
        return Interval(mean=value, low=None, high=None, n=1) if value is not None else None

    def pareto_front(self) -> list[tuple[TrialView, LevelResult, float, float]]:
        """The levels that met the SLOs and that no other such level beats on both output
        tokens/s (higher) and p99 TTFT (lower), sorted by throughput. A configuration decided by
        its crash (a ladder of levels that crashed at one; a store written before this rule
        kept it ``feasible``) has no level on it: the levels below its crash met the SLOs, but
        it does not serve the load the study asked for."""
        ok = [p for p in self.level_points() if p[0].level_verdict(p[1]) == LevelVerdict.OK
              and (p[0].crash_text is None or p[0].capacity is not None)]
        return pareto([(p, p[2], p[3]) for p in ok])


@dataclass(frozen=True)
class SharedConfig:
    """One configuration (the same ``params``) in two studies: its trial in each, and ``b``
    against ``a`` (:func:`~cleanslate.report._stats.difference`)."""

    params: dict[str, Scalar]
    a: TrialView
    b: TrialView
    difference: Difference

    def document(self) -> SharedConfigDocument:
        return {"params": self.params, "a": self.a.number, "b": self.b.number,
                "a_value": self.a.record.value, "b_value": self.b.record.value,
                "a_n": self.difference.n_a, "b_n": self.difference.n_b,
                **self.difference.document()}


def _config_key(params: Mapping[str, Scalar]) -> str:
    import json

    return json.dumps(params, sort_keys=True, default=str)


def comparable(a: StudyReport, b: StudyReport) -> str | None:
    """Why two studies' configurations cannot be compared (``None`` when they can): another
    objective."""
    if (a.metric, a.direction) != (b.metric, b.direction):
        return (f"{b.name} {b.direction}s {b.metric}, {a.name} {a.direction}s {a.metric}: "
                "their values are not comparable")
    return None


def shared_configs(a: StudyReport, b: StudyReport) -> list[SharedConfig]:
    """Each configuration (the same searched flags and values) that both studies ran, with
    ``b``'s value against ``a``'s, paired by seed where they share seeds (``docs/report.md``).
    A configuration run twice in a study is taken at its first feasible trial (its first
    finished one when none was feasible); empty for studies of different objectives."""
    if comparable(a, b) is not None:
        return []

    def first(report: StudyReport) -> dict[str, TrialView]:
        out: dict[str, TrialView] = {}
        ordered = sorted(report.results, key=lambda t: (not t.feasible, t.number))
        for t in ordered:
            out.setdefault(_config_key(t.record.params), t)
        return out

    in_a, in_b = first(a), first(b)
    maximize = a.direction == "maximize"
    out = []
    for key, ta in sorted(in_a.items(), key=lambda kv: kv[1].number):
        tb = in_b.get(key)
        if tb is None:
            continue
        out.append(SharedConfig(params=dict(ta.record.params), a=ta, b=tb,
                                difference=difference(ta.record, tb.record, a.statistics,
                                                      higher_is_better=maximize)))
    return out


def pareto(points: list[tuple[_Item, float, float]]) -> list[_Item]:
    """The items whose ``(x, y)`` no other item dominates, maximizing x and minimizing y,
    sorted by x. Exact duplicates are all kept."""
    front = []
    for item, x, y in points:
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for _, x2, y2 in points)
        if not dominated:
            front.append((x, item))
    front.sort(key=lambda pair: pair[0])
    return [item for _, item in front]


def load_report(store: Store, name: str) -> StudyReport:
    """The study named ``name`` from the store; an unknown name is an :class:`InputError`
    that lists the studies the store holds. The store returns every record redacted (stores
    written before redaction included), so nothing derived from a report holds a secret."""
    study = store.study(name)
    if study is None:
        known = store.studies()
        raise InputError(
            f"no study {name!r} in {store.display_url}",
            where="STUDY",
            hint=("known studies: " + ", ".join(known)) if known else
            "this store holds no study; run `cleanslate tune STUDY.yaml` first, or pass "
            "--store for another store")
    runs = {r.id: r for r in store.runs(study=name)}
    trials = tuple(TrialView(record=t, run=runs.get(t.run_id) if t.run_id else None)
                   for t in store.trials(name))
    try:
        artifacts: Path | None = store.artifacts_root
    except InputError:
        artifacts = None
    return StudyReport(name=name, spec=dict(study.spec), status=study.status,
                       created_at=study.created_at, elapsed_s=study.elapsed_s,
                       trials=trials, store_url=store.display_url,
                       slots=slot_summaries(store, name),
                       hosts=tuple(store.hosts(study=name)), artifacts=artifacts)


def safe_url(url: str) -> str:
    """A store URL fit to print: the password masked (:func:`cleanslate.store.display_url`)."""
    from cleanslate.store import display_url

    return display_url(url)


#: Level keys that count things (shown without decimals).
_COUNT_KEYS = frozenset({"completed", "failed", "num_prompts", "total_input_tokens",
                         "total_output_tokens", "max_concurrent_requests", "good_requests"})


def format_value(value: float | None, key: str = "") -> str:
    """A metric as a report shows it: tokens/s without decimals, latencies with one below
    100 ms; ``-`` for no value."""
    if value is None:
        return "-"
    if key == "max_concurrency_under_slo":  # requests in flight: a mean of them has a decimal
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    if key in _COUNT_KEYS:
        return f"{value:,.0f}"
    if key.endswith("_ms") and abs(value) < 100:
        return f"{value:,.1f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
