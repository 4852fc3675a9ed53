"""Capacity under an SLO: the most load a server serves within its latency targets.

The search (``cleanslate bench --find-max``, a study's ``max_concurrency_under_slo``
objective) measures one *probe* (a level) at a time and decides each on the share of requests
that met the SLOs:

1. **Double** from ``start`` while probes pass (up to ``max_load``); a first probe that does
   not pass halves instead, down to the least load.
2. **Bisect** between the highest load that passed and the lowest that did not, until the two
   are within ``tolerance`` of the lower (and at least ``min_step`` apart: one request for
   concurrency).

A probe's verdict (:func:`judge`) comes from a Wilson interval on each SLO's attainment (the
requests that met its limit, failed requests counted as misses): ``pass`` when every
interval's low end is at or above its target share, ``fail`` when one interval lies below it.
An interval that holds the target is *straddling*: the runner measures the probe again with
fresh prompts and pools the counts (up to ``max_extensions`` times), then calls it
``unresolved``. An unresolved probe is never counted as a pass: the search treats it as an
upper bound, and the result lists it. A probe where the server crashed, more than the error
gate's share of requests failed, or the output went bad is an upper bound too, and its cause is
part of the answer; a crash ends the search (the server is gone).

The answer (:class:`CapacityResult`): ``capacity``, the highest load that passed, with the
bracket ``[capacity, upper)`` the boundary lies in (``upper`` the lowest load that did not
pass, ``None`` when every probe up to ``max_load`` passed), every probe in order, cliffs
(throughput falling by more than ``cliff`` between two passing probes) and the crash.

This module holds the models and the decisions (no network: the report reads them without
aiohttp); :mod:`cleanslate.bench._find_max` runs the probes against a server.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from cleanslate.bench._models import LIMIT_KEY, SLO, LevelResult
from cleanslate.bench._server_config import ServerConfig
from cleanslate.models import FrozenStrict

Dimension = Literal["concurrency", "rate"]
Decision = Literal["pass", "fail", "straddles", "value"]

#: Defaults of the search (``docs/bench.md``, "Capacity under an SLO").
DEFAULT_TOLERANCE = 0.10
DEFAULT_MAX_EXTENSIONS = 3
DEFAULT_MAX_PROBES = 16
DEFAULT_CLIFF = 0.20
#: The per-request limits of an attainment target (``--slo ttft_ms=500,tpot_ms=50``).
PER_REQUEST_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
DEFAULT_START = {"concurrency": 8.0, "rate": 1.0}
DEFAULT_MAX_LOAD = {"concurrency": 4096.0, "rate": 10_000.0}
#: The least load a search goes down to (one request in flight; a thousandth of a request per
#: second, the bench's least rate).
MIN_LOAD = {"concurrency": 1.0, "rate": 0.001}
#: The least gap between the bracket's ends: one request in flight; for rates the tolerance
#: alone decides.
MIN_STEP = {"concurrency": 1.0, "rate": 0.0}


class ProbeVerdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNRESOLVED = "unresolved"
    CRASHED = "crashed"
    ERRORS = "errors"
    BAD_OUTPUT = "bad_output"
    INTERRUPTED = "interrupted"


class StopReason(StrEnum):
    TOLERANCE = "tolerance"  # the bracket is within the tolerance
    MAX_LOAD = "max_load"  # every probe up to max_load passed
    NOTHING_PASSES = "nothing_passes"  # the least load did not pass
    CRASHED = "crashed"  # the server crashed at a probe
    MAX_PROBES = "max_probes"
    INTERRUPTED = "interrupted"


def share_target(key: str) -> float | None:
    """The share of samples a percentile key asks to meet its limit (``p99_tpot_ms``: 0.99;
    ``median_ttft_ms``: 0.5); ``None`` for a mean or a maximum, which have no share."""
    stat = key.split("_", 1)[0]
    if stat == "median":
        return 0.5
    if stat.startswith("p"):
        try:
            return float(stat[1:]) / 100
        except ValueError:
            return None
    return None


class CapacitySLO(FrozenStrict):
    """What a probe must meet. ``limits``: level keys (``p99_tpot_ms: 200``). Without
    ``attainment``, each percentile key is met when its share of samples at or under the
    limit reaches the percentile (a mean or a maximum is met by its value, without an
    interval). With ``attainment`` (``0.99``), the share of requests that met every limit at
    once (the bench's good requests) must reach it; the keys' statistics are then ignored."""

    limits: dict[str, float] = Field(min_length=1)
    attainment: float | None = Field(default=None, gt=0, lt=1)
    confidence: float = Field(default=0.95, ge=0.5, le=0.999)

    @model_validator(mode="after")
    def _keys(self) -> CapacitySLO:
        for key, limit in self.limits.items():
            if not math.isfinite(limit) or limit <= 0:
                raise ValueError(f"{key}: the limit must be a positive number of ms")
            if self.attainment is not None and key not in PER_REQUEST_KEYS:
                raise ValueError(f"{key}: with an attainment target the limits are per "
                                 "request: ttft_ms, tpot_ms, e2e_ms")
            if self.attainment is None and not LIMIT_KEY.match(key):
                raise ValueError(f"{key}: without an attainment target each SLO is a "
                                 "statistic: p99_tpot_ms, p90_ttft_ms, median_e2el_ms ...")
        return self

    def per_request(self) -> SLO:
        """The per-request limits behind these SLOs (a request is *good* when it meets every
        one: the bench's goodput): the limits themselves with ``attainment``, else each
        key's limit on its metric (the lowest where two keys name one metric; ITL has no
        per-request limit)."""
        if self.attainment is not None:
            return SLO(**self.limits)
        out: dict[str, float] = {}
        for key, limit in self.limits.items():
            metric = key.split("_")[1]
            name = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}.get(metric)
            if name is not None:
                out[name] = min(limit, out.get(name, limit))
        return SLO(**out)

    def count_keys(self) -> dict[str, float]:
        """The keys whose samples the bench counts (``BenchConfig.limits``): the
        percentile keys (none with ``attainment``)."""
        if self.attainment is not None:
            return {}
        return {k: v for k, v in self.limits.items() if share_target(k) is not None}

    def targets(self) -> dict[str, float | None]:
        """Each check's target share: ``{"attainment": A}`` with ``attainment``, else per key
        (``None`` for a mean or a maximum)."""
        if self.attainment is not None:
            return {"attainment": self.attainment}
        return {key: share_target(key) for key in self.limits}

    def min_requests(self) -> int:
        """The fewest samples that can show the highest target met at ``confidence`` when
        none missed: the Wilson interval's low end of ``n`` of ``n`` is ``n / (n + z^2)``, so
        ``n >= t z^2 / (1 - t)`` (381 for a p99 at 95 %, 73 for a p95, 4 for a median)."""
        shares = [t for t in self.targets().values() if t is not None]
        if not shares:
            return 1
        from cleanslate.stats import _scipy

        z = float(_scipy().norm.ppf(0.5 + self.confidence / 2))
        top = max(shares)
        return max(1, math.ceil(top * z * z / (1 - top) - 1e-9))


class SloCheck(FrozenStrict):
    """One SLO at one probe: the samples that met it, of how many, the target share and the
    Wilson interval of the share; ``value`` is the statistic itself (``p99_tpot_ms``), and
    ``decision`` ``pass``, ``fail`` or ``straddles`` (``value`` for a mean or a maximum: no
    interval). ``slo`` is the SLO's level key (``p99_tpot_ms``) or ``attainment`` (read as
    :attr:`key` too); it is not stored under the name ``key``, which the store's redaction
    takes for a secret's name (its value would be hidden in every record)."""

    slo: str
    limit: float | None = None
    target: float | None = None
    met: int | None = None
    n: int | None = None
    low: float | None = None
    high: float | None = None
    value: float | None = None
    decision: Decision

    @property
    def key(self) -> str:
        return self.slo

    @property
    def share(self) -> float | None:
        return None if not self.n or self.met is None else self.met / self.n

    def describe(self) -> str:
        """``p99_tpot_ms: 377 of 381 (99.0 %, 95 % interval 97.3-99.6 %) against 99 %``."""
        if self.decision == "value" or self.n is None or self.met is None:
            shown = "no samples" if self.value is None else f"{self.value:.1f}"
            return f"{self.key} {shown} (limit {self.limit:g}, one value: no interval)"
        assert self.low is not None and self.high is not None and self.target is not None
        return (f"{self.key}: {self.met} of {self.n} ({self.met / max(1, self.n):.1%}, interval "
                f"{self.low:.1%}-{self.high:.1%}) against {self.target:.1%}")


class Probe(FrozenStrict):
    """One measured load of a search: its verdict with the checks behind it, how many
    measurements it pooled (1 plus the extensions), the figures the search reports, and why
    it did not pass."""

    index: int
    load: float
    label: str
    verdict: ProbeVerdict
    checks: tuple[SloCheck, ...] = ()
    measurements: int = 1
    requests: int = 0
    output_throughput: float | None = None
    request_goodput: float | None = None
    attainment: float | None = Field(
        default=None, description="the lowest share met over the checks (the plot's point)")
    attainment_low: float | None = None
    attainment_high: float | None = None
    target: float | None = Field(default=None, description="that check's target share")
    cause: str | None = None
    detail: str | None = None
    warnings: tuple[str, ...] = ()
    level: LevelResult | None = Field(
        default=None, description="the probe's (pooled) measurement; left out where the "
        "level is stored beside the result (a study trial's levels)")

    @property
    def passed(self) -> bool:
        return self.verdict == ProbeVerdict.PASS


class CapacityResult(FrozenStrict):
    """The answer of one search (see the module docstring)."""

    dimension: Dimension
    slo: CapacitySLO
    tolerance: float
    start: float
    max_load: float
    probes: tuple[Probe, ...] = ()
    capacity: float | None = Field(
        default=None, description="the highest load that passed (None: none did)")
    upper: float | None = Field(
        default=None, description="the lowest load above capacity that did not pass; the "
        "boundary lies in [capacity, upper) (None: every probe up to max_load passed)")
    stopped_by: StopReason
    crash: str | None = Field(default=None, description="'crashed at c=512 (cause: detail)'")
    cliffs: tuple[str, ...] = ()
    unresolved: tuple[float, ...] = ()
    server_config: ServerConfig | None = Field(
        default=None, description="the configuration the server said it runs with, read "
        "before the first probe (None: not read)")
    max_goodput: float | None = Field(
        default=None, description="the most request goodput (good requests per second) of a "
        "passing probe")
    capacity_throughput: float | None = Field(
        default=None, description="output tokens/s at the capacity probe")

    @property
    def resolved(self) -> bool:
        """Whether the bracket was narrowed to the tolerance (or the load cap was reached)."""
        return self.stopped_by in (StopReason.TOLERANCE, StopReason.MAX_LOAD)

    def label(self, load: float | None) -> str:
        return "-" if load is None else load_label(self.dimension, load)

    def summary(self) -> str:
        """One line: ``max concurrency within the SLOs: c=96, boundary in [96, 104) (7 probes)``
        plus the crash, cliffs and unresolved probes."""
        what = "max concurrency" if self.dimension == "concurrency" else "max request rate"
        if self.capacity is None and self.stopped_by == StopReason.NOTHING_PASSES:
            head = f"{what} within the SLOs: none (not even {self.label(self.lowest_probe())})"
        elif self.capacity is None:
            head = f"{what} within the SLOs: none passed before the search stopped"
        elif self.upper is None and self.stopped_by == StopReason.MAX_LOAD:
            head = (f"{what} within the SLOs: at least {self.label(self.capacity)} "
                    f"(every probe up to the cap passed)")
        elif self.upper is None:
            head = (f"{what} within the SLOs: at least {self.label(self.capacity)} (no probe "
                    "above it had failed when the search stopped)")
        else:
            head = (f"{what} within the SLOs: {self.label(self.capacity)}, boundary in "
                    f"[{_num(self.capacity)}, {_num(self.upper)})")
        parts = [head + f" ({len(self.probes)} probes, stopped: {self.stopped_by.value})"]
        if self.crash:
            parts.append(self.crash)
        parts += list(self.cliffs)
        if self.unresolved:
            parts.append("unresolved (never counted as passing): "
                         + ", ".join(self.label(x) for x in self.unresolved))
        return "; ".join(parts)

    def lowest_probe(self) -> float | None:
        return min((p.load for p in self.probes), default=None)

    def value(self, objective: str) -> float | None:
        """The figure a study maximizes: ``max_concurrency_under_slo`` /
        ``max_rate_under_slo`` (the capacity) or ``max_goodput``."""
        if objective == "max_goodput":
            return self.max_goodput
        return self.capacity

    def without_levels(self) -> CapacityResult:
        """The same result with each probe's level left out (stored beside it)."""
        return self.model_copy(update={"probes": tuple(
            p.model_copy(update={"level": None}) for p in self.probes)})


#: Objectives a study may name that are the answer of a search, not a level's key.
CAPACITY_OBJECTIVES = frozenset({"max_concurrency_under_slo", "max_goodput"})


def load_label(dimension: Dimension, load: float) -> str:
    """``c=96`` or ``rate=12.5`` (the level labels the bench gives those loads)."""
    if dimension == "concurrency":
        return f"c={int(load)}"
    return f"rate={_num(load)}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _percentile_value(level: LevelResult, key: str) -> float | None:
    value = level.model_dump().get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _decide(met: int, n: int, target: float, confidence: float
            ) -> tuple[Decision, float, float]:
    """A share's decision against its target on the Wilson interval, and the interval."""
    from cleanslate.stats import wilson

    if n <= 0:
        return "straddles", 0.0, 1.0
    low, high = wilson(met, n, confidence)
    decision: Decision = "pass" if low >= target else "fail" if high < target else "straddles"
    return decision, low, high


def judge(level: LevelResult, slo: CapacitySLO,
          counts: Mapping[str, tuple[int, int]] | None = None) -> tuple[ProbeVerdict,
                                                                       tuple[SloCheck, ...]]:
    """The verdict of one (possibly pooled) measurement against ``slo``, on the SLOs alone:
    ``pass``, ``fail`` or ``unresolved`` (some interval straddles its target and none is
    below it). ``counts``: the samples that met each key's limit, and how many
    (``level.limit_counts`` by default); failed requests count as misses of every key."""
    counts = dict(level.limit_counts if counts is None else counts)
    checks: list[SloCheck] = []
    if slo.attainment is not None:
        good = level.good_requests or 0
        n = level.completed + level.failed
        decision, low, high = _decide(good, n, slo.attainment, slo.confidence)
        checks.append(SloCheck(slo="attainment", target=slo.attainment, met=good, n=n,
                               low=low, high=high, decision=decision))
    else:
        for key, limit in slo.limits.items():
            target = share_target(key)
            value = _percentile_value(level, key)
            if target is None or key not in counts:
                ok = value is not None and value <= limit
                checks.append(SloCheck(slo=key, limit=limit, value=value, decision="value"
                                       ) if ok else SloCheck(slo=key, limit=limit, value=value,
                                                             decision="fail"))
                continue
            met, n = counts[key]
            if not key.endswith("_itl_ms"):
                n += level.failed  # a failed request met no latency limit
            decision, low, high = _decide(met, n, target, slo.confidence)
            checks.append(SloCheck(slo=key, limit=limit, target=target, met=met, n=n,
                                   low=low, high=high, value=value, decision=decision))
    if any(c.decision == "fail" for c in checks):
        verdict = ProbeVerdict.FAIL
    elif any(c.decision == "straddles" for c in checks):
        verdict = ProbeVerdict.UNRESOLVED
    else:
        verdict = ProbeVerdict.PASS
    return verdict, tuple(checks)


def worst_check(checks: tuple[SloCheck, ...]) -> SloCheck | None:
    """The check whose share is lowest against its target (the plot's point)."""
    shared = [c for c in checks if c.share is not None and c.target is not None]
    if not shared:
        return None
    return min(shared, key=lambda c: (c.share or 0.0) - (c.target or 0.0))


class CapacitySearch:
    """The search as a state machine: :meth:`next_load` says what to measure next (``None``
    when done), :meth:`record` takes the probe, :meth:`result` is the answer. No I/O: the
    runner (:func:`cleanslate.bench._find_max.find_max`) and the tests drive it."""

    def __init__(self, dimension: Dimension, slo: CapacitySLO, *, start: float | None = None,
                 max_load: float | None = None, tolerance: float = DEFAULT_TOLERANCE,
                 max_probes: int = DEFAULT_MAX_PROBES, cliff: float = DEFAULT_CLIFF) -> None:
        self.dimension: Dimension = dimension
        self.slo = slo
        self.start = self._round(start if start is not None else DEFAULT_START[dimension])
        self.max_load = self._round(max_load if max_load is not None
                                    else DEFAULT_MAX_LOAD[dimension])
        if not 0 < tolerance < 1:
            raise ValueError("the tolerance is a share between 0 and 1 (0.1 is 10 %)")
        if self.start > self.max_load:
            raise ValueError(f"the start ({_num(self.start)}) is above the most load "
                             f"({_num(self.max_load)})")
        self.tolerance = tolerance
        self.max_probes = max_probes
        self.cliff = cliff
        self.probes: list[Probe] = []
        self._stopped: StopReason | None = None
        self.crash: str | None = None

    # --- the bracket ------------------------------------------------------------------
    def _round(self, load: float) -> float:
        if self.dimension == "concurrency":
            return float(max(1, round(load)))
        return float(f"{max(MIN_LOAD['rate'], load):.4g}")

    @property
    def low(self) -> float | None:
        """The highest load that passed."""
        return max((p.load for p in self.probes if p.passed), default=None)

    @property
    def high(self) -> float | None:
        """The lowest load above :attr:`low` that did not pass."""
        floor = self.low
        loads = [p.load for p in self.probes if not p.passed
                 and p.verdict != ProbeVerdict.INTERRUPTED and (floor is None or p.load > floor)]
        return min(loads, default=None)

    def _narrow_enough(self, low: float, high: float) -> bool:
        gap = max(self.tolerance * low, MIN_STEP[self.dimension])
        if high - low <= gap:
            return True
        return self._midpoint(low, high) is None

    def _midpoint(self, low: float, high: float) -> float | None:
        mid = self._round((low + high) / 2)
        if self.dimension == "concurrency":
            mid = float(int((low + high) // 2))
        return mid if low < mid < high else None

    # --- the steps --------------------------------------------------------------------
    def next_load(self) -> float | None:
        """The next load to probe, or ``None`` when the search is over."""
        if self._stopped is not None:
            return None
        if len(self.probes) >= self.max_probes:
            self._stopped = StopReason.MAX_PROBES
            return None
        if not self.probes:
            return self.start
        low, high = self.low, self.high
        if low is None:
            assert high is not None
            least = MIN_LOAD[self.dimension]
            if high <= least:
                self._stopped = StopReason.NOTHING_PASSES
                return None
            nxt = self._round(high / 2)
            if nxt >= high:
                nxt = self._round(high - MIN_STEP[self.dimension]) if (
                    high - MIN_STEP[self.dimension] >= least) else least
            if nxt >= high:
                self._stopped = StopReason.NOTHING_PASSES
                return None
            return nxt
        if high is None:
            if low >= self.max_load:
                self._stopped = StopReason.MAX_LOAD
                return None
            return min(self.max_load, self._round(low * 2))
        if self._narrow_enough(low, high):
            self._stopped = StopReason.TOLERANCE
            return None
        mid = self._midpoint(low, high)
        assert mid is not None
        return mid

    def record(self, probe: Probe) -> None:
        """Take a measured probe. A crash or an interruption ends the search."""
        self.probes.append(probe)
        if probe.verdict == ProbeVerdict.CRASHED:
            self._stopped = StopReason.CRASHED
            self.crash = f"crashed at {probe.label}" + (
                f" ({probe.cause}: {probe.detail})" if probe.cause and probe.detail else
                f" ({probe.cause or probe.detail})" if probe.cause or probe.detail else "")
        elif probe.verdict == ProbeVerdict.INTERRUPTED:
            self._stopped = StopReason.INTERRUPTED

    def stop(self, reason: StopReason) -> None:
        self._stopped = reason

    def probes_left_at_most(self) -> int:
        """At most how many more probes the search runs from where it stands, the next one
        included: doubling up to the most load (or halving down to the least), then bisecting
        a bracket of one doubling to the tolerance, never more than ``max_probes`` in all; 0
        when it is over. A probe measured again (an extension) is one probe."""
        if self._stopped is not None:
            return 0
        bisect = math.ceil(math.log2(1 / self.tolerance))

        def halvings(high: float) -> int:
            least = MIN_LOAD[self.dimension]
            return math.ceil(math.log2(high / least)) if high > least else 0

        def doublings(low: float) -> int:
            return math.ceil(math.log2(self.max_load / low)) if low < self.max_load else 0

        low, high = self.low, self.high
        if not self.probes:
            steps = 1 + max(doublings(self.start), halvings(self.start)) + bisect
        elif low is None:
            steps = halvings(high or self.start) + bisect
        elif high is None:
            steps = doublings(low) + bisect if low < self.max_load else 0
        else:
            gap = max(self.tolerance * low, MIN_STEP[self.dimension])
            steps = 0 if high - low <= gap else math.ceil(math.log2((high - low) / gap))
        return max(0, min(self.max_probes - len(self.probes), steps))

    def cliffs(self) -> list[str]:
        """Throughput falling by more than :attr:`cliff` between two passing probes next to
        each other in load."""
        passing = sorted((p for p in self.probes if p.passed and p.output_throughput),
                         key=lambda p: p.load)
        out = []
        for a, b in itertools.pairwise(passing):
            assert a.output_throughput is not None and b.output_throughput is not None
            if b.output_throughput < (1 - self.cliff) * a.output_throughput:
                fall = 1 - b.output_throughput / a.output_throughput
                out.append(f"cliff: output throughput fell {fall:.0%} from {a.label} "
                           f"({a.output_throughput:,.0f} tok/s) to {b.label} "
                           f"({b.output_throughput:,.0f} tok/s)")
        return out

    def result(self) -> CapacityResult:
        if self._stopped is None:
            self.next_load()
        low = self.low
        best = next((p for p in self.probes if p.passed and p.load == low), None)
        goodputs = [p.request_goodput for p in self.probes
                    if p.passed and p.request_goodput is not None]
        return CapacityResult(
            dimension=self.dimension, slo=self.slo, tolerance=self.tolerance, start=self.start,
            max_load=self.max_load, probes=tuple(self.probes), capacity=low, upper=self.high,
            stopped_by=self._stopped or StopReason.MAX_PROBES, crash=self.crash,
            cliffs=tuple(self.cliffs()),
            unresolved=tuple(sorted(p.load for p in self.probes
                                    if p.verdict == ProbeVerdict.UNRESOLVED)),
            max_goodput=max(goodputs) if goodputs else None,
            capacity_throughput=best.output_throughput if best is not None else None)


def probe_from_level(index: int, dimension: Dimension, load: float, level: LevelResult,
                     slo: CapacitySLO, *, counts: Mapping[str, tuple[int, int]] | None = None,
                     measurements: int = 1, crash: tuple[str, str] | None = None,
                     interrupted: bool = False, extend_exhausted: bool = True) -> Probe:
    """A probe's record from its measurement: the crash (``(cause, detail)``, from whoever
    watches the server) first, then an interruption, the error gate, bad output, and the
    SLOs (:func:`judge`)."""
    verdict, checks = judge(level, slo, counts)
    cause = detail = None
    if crash is not None:
        verdict, (cause, detail) = ProbeVerdict.CRASHED, crash
    elif interrupted:
        verdict, cause = ProbeVerdict.INTERRUPTED, "interrupted"
    elif not level.valid:
        verdict, cause, detail = ProbeVerdict.ERRORS, "request_errors", level.invalid_reason
    elif level.bad_output:
        count = level.output_issues.get(level.bad_output, 0)
        verdict, cause = ProbeVerdict.BAD_OUTPUT, "bad_output"
        detail = (f"{count} of {level.output_samples} sampled responses show "
                  f"{level.bad_output}")
    elif verdict == ProbeVerdict.FAIL:
        cause = "slo_miss"
        detail = "; ".join(c.describe() for c in checks if c.decision == "fail")
    elif verdict == ProbeVerdict.UNRESOLVED:
        cause = "unresolved"
        detail = "; ".join(c.describe() for c in checks if c.decision == "straddles")
    worst = worst_check(checks)
    warnings = tuple(level.warnings)
    if level.steady_ok is False:
        warnings += ("the steady window is under half of the probe: its figures are mostly "
                     "ramp and drain",)
    return Probe(
        index=index, load=load, label=load_label(dimension, load), verdict=verdict,
        checks=checks, measurements=measurements, requests=level.completed + level.failed,
        output_throughput=level.output_throughput if level.valid else None,
        request_goodput=level.request_goodput, attainment=worst.share if worst else None,
        attainment_low=worst.low if worst else None,
        attainment_high=worst.high if worst else None,
        target=worst.target if worst else None, cause=cause, detail=detail,
        warnings=warnings, level=level)


def parse_slo_keys(text: str) -> dict[str, float]:
    """``p99_tpot_ms=200,p90_ttft_ms=2000`` (also the study's spelling ``tpot_p99_ms``) as
    level keys, or per-request limits ``ttft_ms=500,tpot_ms=50`` (for an attainment target);
    raises ``ValueError`` naming the bad item."""
    out: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{item!r}: write KEY=MILLISECONDS, e.g. p99_tpot_ms=200")
        if key not in PER_REQUEST_KEYS:
            key = level_key(key)
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"{key}: {value.strip()!r} is not a number of milliseconds"
                             ) from None
        if not math.isfinite(limit) or limit <= 0:
            raise ValueError(f"{key}: the limit must be a positive number of ms")
        out[key] = limit
    if not out:
        raise ValueError("no SLO given: e.g. p99_tpot_ms=200")
    return out


def level_key(key: str) -> str:
    """A latency key in the level's spelling: ``tpot_p99_ms`` -> ``p99_tpot_ms``; keys
    already so spelled are returned as they are. Raises ``ValueError`` for anything else."""
    if LIMIT_KEY.match(key):
        return key
    parts = key.split("_")
    if len(parts) == 3 and parts[2] == "ms":
        metric, stat = parts[0], parts[1]
        metric = "e2el" if metric == "e2e" else metric
        swapped = f"{stat}_{metric}_ms"
        if LIMIT_KEY.match(swapped):
            return swapped
    raise ValueError(f"{key!r} is not a latency SLO: write STAT_METRIC_ms (p99_tpot_ms, "
                     "p90_ttft_ms, median_e2el_ms; STAT one of mean, median, max, p50, p90, "
                     "p95, p99, p99.9; METRIC one of ttft, tpot, itl, e2el)")
