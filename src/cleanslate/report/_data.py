"""What a report shows, read from the store: :class:`StudyReport` and its derived figures.

Everything here is plain data (no rich, no matplotlib): the tables, the plots, the HTML page and
the exports are all drawn from a :class:`StudyReport`. Units: throughputs in tokens/s, latencies
in milliseconds, times in seconds.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from cleanslate.bench import ClosedLoop, LevelResult
from cleanslate.engines import engine_class, engine_names
from cleanslate.errors import InputError
from cleanslate.store import RunRecord, Store
from cleanslate.store._hosts import HostRecord
from cleanslate.store._trials import (
    LevelVerdict,
    StudyStatus,
    TrialRecord,
    TrialStatus,
    level_metric,
)
from cleanslate.tune.study import Objective
from cleanslate.verdict.findings import Finding, Severity, Verdict

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


def show(value: Any) -> str:
    """A flag value as a report shows it: ``unset`` for null (the flag is not passed)."""
    return "unset" if value is None else str(value)


def params_text(params: dict[str, Any]) -> str:
    """``flag=value flag=value`` with :func:`show`'s values."""
    return " ".join(f"{k}={show(v)}" for k, v in params.items())


def level_concurrency(level: LevelResult) -> float | None:
    """The x of a level in throughput-against-load plots: the closed loop's concurrency, an
    open loop's rate (requests/s; ``None`` for an infinite one)."""
    load = level.load
    value = float(load.concurrency if isinstance(load, ClosedLoop) else load.rate)
    return value if math.isfinite(value) else None


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
        """A key of the best feasible level (``output_throughput``, ``p99_ttft_ms`` ...)."""
        return self.record.metric(key)

    def level_verdict(self, level: LevelResult) -> str:
        """How a level of this trial went (:class:`~cleanslate.store.LevelVerdict`), ``?``
        when not recorded."""
        return self.record.level_verdicts.get(level.label, "?")

    @property
    def launch_command(self) -> str:
        """The exact engine command, shell-quoted (from the trial, else its run)."""
        argv = self.record.argv or (self.run.argv if self.run else ())
        return shlex.join(argv) if argv else ""

    @property
    def cause_text(self) -> str:
        """``cause: detail`` for a trial that was not feasible (empty for a feasible one)."""
        if self.status == TrialStatus.FEASIBLE:
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


@dataclass(frozen=True)
class Effect:
    """One change of an ablation study against its baseline.

    ``change_pct`` is the relative change of the objective, in percent (``None`` when the
    changed configuration or the baseline has no value); ``better`` says whether the change
    moved the objective in its direction; ``cause`` names why an infeasible change failed.
    """

    factor: str
    baseline_value: Any
    value: Any
    trial: TrialView
    change_pct: float | None
    better: bool | None
    cause: str | None

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

    def document(self) -> dict[str, Any]:
        return {"slot": self.slot, "host": self.host, "trials": self.trials,
                "infra_failures": self.infra_failures, "state": self.state,
                "reason": self.reason,
                "findings": [f.model_dump(mode="json") for f in self.findings]}


def slot_summaries(store: Store, name: str) -> tuple[SlotSummary, ...]:
    """Per slot of a study, from its leases and its slot records (``cs_leases``,
    ``cs_slots``), in the order of the slots' keys."""
    from cleanslate.store._leases import LeaseOutcome, LeaseState

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
        """The study's objective (:meth:`Objective.of` its spec)."""
        return Objective.of(self.spec)

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
    def baseline(self) -> dict[str, Any]:
        return dict(self.spec.get("baseline") or {})

    @property
    def slo(self) -> dict[str, float]:
        return dict(self.spec.get("slo") or {})

    # -- the trials -----------------------------------------------------------------------------

    @property
    def results(self) -> list[TrialView]:
        return [t for t in self.trials if t.status.finished]

    def sorted_trials(self) -> list[TrialView]:
        """Feasible trials best first by the objective, then infeasible, infrastructure
        failures and running ones, each group by trial number."""
        sign = -1.0 if self.direction == "maximize" else 1.0

        def key(t: TrialView) -> tuple[int, float, int]:
            group = STATUS_ORDER.index(t.status) if t.status in STATUS_ORDER else len(
                STATUS_ORDER)
            value = t.record.value if t.feasible and t.record.value is not None else 0.0
            return group, sign * value, t.number

        return sorted(self.trials, key=key)

    @property
    def best(self) -> TrialView | None:
        """The best feasible trial by the objective (ties: the lower trial number)."""
        ordered = [t for t in self.sorted_trials() if t.feasible]
        return ordered[0] if ordered else None

    @property
    def failures(self) -> list[TrialView]:
        """Trials that were not feasible (results and infrastructure failures), by number."""
        return sorted((t for t in self.trials if t.status != TrialStatus.FEASIBLE),
                      key=lambda t: t.number)

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
            out.append(Effect(factor=factor, baseline_value=base[factor],
                              value=t.record.params.get(factor), trial=t, change_pct=pct,
                              better=better,
                              cause=None if t.feasible else (t.record.cause or t.status)))
        return out

    def level_points(self) -> list[tuple[TrialView, LevelResult, float, float]]:
        """Every measured level as ``(trial, level, output tokens/s, p99 TTFT ms)``."""
        out = []
        for t in self.trials:
            for level in t.record.levels:
                x = level_metric(level, "output_throughput")
                y = level_metric(level, "p99_ttft_ms")
                if x is not None and y is not None:
                    out.append((t, level, x, y))
        return out

    def pareto_front(self) -> list[tuple[TrialView, LevelResult, float, float]]:
        """The levels that met the SLOs and that no other such level beats on both output
        tokens/s (higher) and p99 TTFT (lower), sorted by throughput."""
        ok = [p for p in self.level_points() if p[0].level_verdict(p[1]) == LevelVerdict.OK]
        return pareto([(p, p[2], p[3]) for p in ok])


def pareto(points: list[tuple[Any, float, float]]) -> list[Any]:
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
    return StudyReport(name=name, spec=dict(study.spec), status=study.status,
                       created_at=study.created_at, elapsed_s=study.elapsed_s,
                       trials=trials, store_url=store.display_url,
                       slots=slot_summaries(store, name),
                       hosts=tuple(store.hosts(study=name)))


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
    if key in _COUNT_KEYS:
        return f"{value:,.0f}"
    if key.endswith("_ms") and abs(value) < 100:
        return f"{value:,.1f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
