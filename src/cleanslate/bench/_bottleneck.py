"""Why this number: what limited a level, from its observations, the levels before it and the
configuration in effect (``docs/bench.md``, "Why: the bottleneck verdict").

:func:`diagnose` applies the rules of :data:`RULES` in their order; the first that matches
gives the verdict, those that match after it are listed in ``also`` (a throttled GPU beside a
compute-bound batch). Each rule is one pure function over a :class:`Seen` (the level, the
levels before it, the configuration in effect, the workload) that returns a :class:`Match`, or
``None`` with what it lacked to decide noted in :attr:`Seen.missing`. A verdict is never
guessed: no rule matching is ``unknown``, with ``missing`` saying what was not there.

``confidence``: ``clear`` only where the engine's own metrics show the signature (running at
its cap, KV usage, preemptions, per-rank counts) or the level's own record does (it ended
early, its requests failed); ``likely`` from the client's figures and GPU telemetry alone.

Advice names the engine's own flag: each engine adapter (``cleanslate.engines``) keeps an
:data:`AdviceBook` (verdict -> :class:`AdviceEntry`) and registers it with
:func:`register_advice`; ``bench`` never imports an engine. The text names the value in effect
when the configuration says it (``raise --max-running-requests above 64``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import Field

from cleanslate.models import Frozen

if TYPE_CHECKING:
    from cleanslate.bench._models import LevelResult
    from cleanslate.bench._observed import GaugeStats, GpuTelemetry, ServerMetrics
    from cleanslate.bench._server_config import ServerConfig
    from cleanslate.bench._workloads import WorkloadSpec

BottleneckKind = Literal["running_cap", "kv_capacity", "compute", "offered_load", "client",
                         "throttled", "cache_inflated", "dp_imbalance", "crashed", "errors",
                         "unknown"]
Confidence = Literal["clear", "likely", "unknown"]
Direction = Literal["raise", "lower", "set", "enable", "disable", "check"]

#: Every verdict, in the JSON's spelling.
BOTTLENECK_KINDS: tuple[str, ...] = get_args(BottleneckKind)


class Advice(Frozen):
    """One thing to try: the engine's ``flag`` (``--max-running-requests``), which way
    (``direction``) and the sentence to print (``text``)."""

    flag: str
    direction: Direction
    text: str


class Bottleneck(Frozen):
    """What limited a level.

    ``verdict``: one of :data:`BOTTLENECK_KINDS`; ``confidence``: ``clear`` (the engine's
    metrics or the level's own record show it), ``likely`` (client figures and telemetry
    only) or ``unknown``; ``evidence``: printable lines with the figures; ``figures``: the same
    figures as numbers by name (``running_max``, ``cap``, ``waiting_mean``...); ``advice``: the
    engine's flags to try; ``missing``: what was not there to decide (no engine metrics, no
    level before); ``rule``: the rule that decided; ``also``: verdicts of later rules that
    matched too."""

    verdict: BottleneckKind
    confidence: Confidence
    evidence: tuple[str, ...] = ()
    figures: dict[str, float] = Field(default_factory=dict)
    advice: tuple[Advice, ...] = ()
    missing: tuple[str, ...] = ()
    rule: str = ""
    also: tuple[BottleneckKind, ...] = ()

    def summary(self) -> str:
        """One line: ``running_cap (clear): <first evidence>; <first advice>``."""
        head = f"{self.verdict} ({self.confidence})"
        parts = [p for p in (self.evidence[:1] + tuple(a.text for a in self.advice[:1])) if p]
        if self.verdict == "unknown" and self.missing:
            parts = [f"missing: {', '.join(self.missing)}"]
        return head + (": " + "; ".join(parts) if parts else "")


# -- advice ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdviceEntry:
    """One entry of an engine's advice book: ``flag`` and ``direction``, why (``why``: the
    second half of the sentence), and ``setting``: the key of ``ServerConfig.in_effect`` whose
    value the text names (``max_running_requests``), when there is one."""

    flag: str
    direction: Direction
    why: str
    setting: str | None = None

    def render(self, config: ServerConfig | None) -> Advice:
        """The advice with the value in effect named where the configuration says it:
        ``raise --max-running-requests above 64: ...``."""
        value = None
        if self.setting is not None and config is not None:
            value = config.in_effect.get(self.setting)
        if value is None or isinstance(value, bool):
            head = f"{self.direction} {self.flag}"
        elif self.direction == "raise":
            head = f"raise {self.flag} above {_show(value)}"
        elif self.direction == "lower":
            head = f"lower {self.flag} below {_show(value)}"
        else:
            head = f"{self.direction} {self.flag} (now {_show(value)})"
        return Advice(flag=self.flag, direction=self.direction, text=f"{head}: {self.why}")


#: An engine's advice: per verdict, the entries to print, most useful first.
AdviceBook = Mapping[str, tuple[AdviceEntry, ...]]


def advice_book(entries: Mapping[str, Sequence[AdviceEntry]]) -> AdviceBook:
    """A read-only book; a key that is not a verdict is a ``ValueError`` (a mistake in an
    adapter)."""
    unknown = sorted(set(entries) - set(BOTTLENECK_KINDS))
    if unknown:
        raise ValueError(f"not a bottleneck verdict: {', '.join(unknown)}")
    return MappingProxyType({k: tuple(v) for k, v in entries.items()})


_BOOKS: dict[str, AdviceBook] = {}

#: What to do whatever the engine (cleanslate's own options, the host): printed after an
#: engine's own entries.
GENERAL_ADVICE: AdviceBook = MappingProxyType({
    "offered_load": (AdviceEntry("--concurrency", "raise",
                                 "the server runs everything it is sent; send more (or a "
                                 "higher --rate) to find its limit"),),
    "client": (AdviceEntry("--concurrency", "check",
                           "the client did not hold the load asked: split it over several "
                           "clients (processes or hosts) or lower the load per client"),),
    "throttled": (AdviceEntry("nvidia-smi -q -d PERFORMANCE", "check",
                              "the GPU slowed its clock: check the host's cooling and power "
                              "limit, then measure again"),),
    "cache_inflated": (AdviceEntry("--seed", "set",
                                   "the prompts were served from the prefix cache: use a new "
                                   "seed per run, or restart the server, so prefill is "
                                   "measured"),),
    "crashed": (AdviceEntry("server log", "check",
                            "the server was lost during the level: its log says why"),),
    "errors": (AdviceEntry("server log", "check",
                           "requests failed: the level's error details and the server's log "
                           "say why"),),
    "unknown": (AdviceEntry("--concurrency", "set",
                            "measure several levels (-c 16,64,256) with the engine's metrics "
                            "on (SGLang --enable-metrics, llama.cpp --metrics): the rules read "
                            "them and compare a level with those before it"),),
})


def register_advice(engine: str, book: AdviceBook) -> None:
    """Make ``book`` the advice of ``engine`` (the engine registry calls this for every
    adapter that has one; a second registration of a name replaces the first)."""
    _BOOKS[engine] = book


def advice_for(engine: str | None) -> AdviceBook | None:
    """The book registered for ``engine``, or ``None``."""
    return _BOOKS.get(engine) if engine else None


def _show(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# -- what a rule sees ------------------------------------------------------------------------


@dataclass
class Seen:
    """What the rules read: the level, the levels before it (in order, oldest first), the
    configuration in effect and the workload; ``missing`` collects what a rule lacked (a
    rule notes it and returns ``None``)."""

    level: LevelResult
    before: tuple[LevelResult, ...] = ()
    config: ServerConfig | None = None
    workload: WorkloadSpec | None = None
    max_error_rate: float = 0.01
    missing: list[str] = field(default_factory=list)
    #: what a rule saw that ruled its verdict out, said under an ``unknown`` verdict (with its
    #: figures) so that the reader learns what was seen, not only what was missing
    seen_lines: list[str] = field(default_factory=list)
    seen_figures: dict[str, float] = field(default_factory=dict)

    def lack(self, what: str) -> None:
        if what not in self.missing:
            self.missing.append(what)


@dataclass(frozen=True)
class Match:
    """A rule's finding: the verdict, how sure, the evidence lines and their figures."""

    verdict: BottleneckKind
    confidence: Confidence
    evidence: tuple[str, ...]
    figures: Mapping[str, float] = field(default_factory=dict)


Rule = Callable[[Seen], "Match | None"]


# -- thresholds ------------------------------------------------------------------------------

#: A gauge at or above this share of the cap counts as at the cap (a running count of 63 of 64
#: is at it between one request finishing and the next being admitted).
AT_CAP = 0.97

#: The running count is pinned at its cap when at least this share of the steady window's
#: samples are at it: half the window; a cap touched now and then while the batch mostly runs
#: below it is not what holds the level.
PINNED_SHARE = 0.5

#: Requests waiting (mean over the window) at or above this are a queue: one or more on
#: average means some request always waits for admission.
QUEUE_MIN = 1.0

#: A queue no longer than this share of the running batch (mean) is the normal wait of a
#: request between its arrival and the next step that admits it: the sim at c=16 (cap 64)
#: keeps 2.3 waiting beside 13.7 running while everything it is sent runs.
QUEUE_SHARE = 0.25

#: KV-cache usage (0-1, the window's max) at or above this is full: SGLang admits against a
#: reserve for the tokens still to decode, so its ``token_usage`` stops short of 1 (vLLM's
#: ``kv_cache_usage_perc`` reaches it).
KV_FULL = 0.9

#: KV capacity without reaching :data:`KV_FULL`: the free part of the cache at its fullest
#: holds fewer tokens than one request of the level needs (prompt and output), so the next one
#: cannot be admitted. The sim with 8,000-token prompts and ``--mem-fraction-static 0.6`` runs
#: 2 at a time at 81 % usage while 30 wait. The cache's size is the configuration's
#: (:data:`KV_TOKEN_SETTINGS`).
KV_TOKEN_SETTINGS = ("max_total_num_tokens",)

#: The batch must have grown by this factor against a level before for the step time's growth
#: to be read: a smaller step is inside the noise of TPOT.
BATCH_GROWTH = 1.5

#: Compute-bound: one more running request adds less than this share of what an average one
#: carries. Between two levels the step time (median TPOT, ms) is read as a fixed part plus a
#: part per running request, ``step = a + k x batch``; throughput is ``batch / step``, so the
#: marginal gain at the larger batch is ``a / step``: the fixed part's share of the step. The
#: sim's known truth uses the same bound on its own marginal gain (``sim.model
#: .SATURATION_GAIN``). On the sim's eager-compute configuration, c=2 -> 16: 7.19 -> 16.75 ms
#: for a batch of 1.9 -> 12.6 gives 0.33 (the truth: 0.32); the throughput's elasticity over
#: the same interval, 0.57, averages the small batches' gains and called it offered_load.
MARGINAL_GAIN = 0.5

#: Throughput is batch / step time: when the batch's growth over the step time's growth
#: exceeds the throughput's growth by more than this factor, the requests in flight grew
#: without running (they queue behind a cap or a full cache), and the step is not what holds
#: them. Only the client's count (Little's law) can be off this way: the sim capped at 64
#: from c=16 to c=256 without engine metrics has in flight x16, TPOT x1.5, throughput x2.2.
QUEUED_GROWTH = 1.5

#: A level holds its offered load when the requests in flight reach this share of its
#: target: the client's count (``client``), the engine's running plus waiting at their
#: largest (``offered_load``: with short requests much of one's life is outside the
#: scheduler, so the means stay below the concurrency).
HELD_SHARE = 0.9

#: GPU utilisation (mean, percent) at or above which the GPU is busy.
GPU_BUSY_PCT = 90.0

#: Client CPU (CPU seconds per wall second) at or above which the client may be the limit: its
#: event loop runs on one core (the same bound as the level's warning).
CLIENT_CPU = 0.9

#: Sends later than this at p99 (ms) against an open loop's schedule: the client did not keep
#: it (the same bound as the level's warning).
SCHEDULE_LAG_MS = 10.0

#: Clock-event reasons that are the host slowing the GPU (heat, a power brake, a hardware
#: slowdown), and the share of samples one must be active in: a quarter of the level.
THROTTLE_EVENTS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown",
                             "hw_power_brake_slowdown"})
THROTTLE_SHARE = 0.25

#: The SM clock (mean) below this share of the GPU's max while the GPU is busy (utilisation at
#: least :data:`THROTTLE_BUSY_PCT`): a clock that fell well below its max under load; the
#: software power cap counts only together with it (a busy GPU at its power limit often runs
#: near max clocks). The mean takes in the idle moments between steps, when the clock drops on
#: its own (the sim reports 345 MHz idle): a busy, unthrottled prefill-heavy sim level read
#: 0.846 of its max (benchmarks/diagnosis.py, one false ``throttled`` at 0.85), unthrottled
#: levels never went lower, throttled ones were at 0.61 or below; an H100 at its power cap
#: held 0.98-1.0 (docs/validation/h100-bottleneck.md).
THROTTLE_CLOCK_SHARE = 0.75
THROTTLE_BUSY_PCT = 50.0

#: The prefix-cache hit rate is inflated when it is this much (absolute share of the prompt
#: tokens) above what the workload is built to reuse: a chat template's shared head stays
#: under it (at most 10 % of the input on the chat endpoint: ``CHAT_CACHED_SHARE``).
CACHE_EXCESS = 0.2

#: DP ranks' running counts (means) are far apart when the least busy runs less than this share
#: of the busiest, and the busiest runs at least :data:`DP_MIN_RUNNING`.
DP_SPREAD = 0.5
DP_MIN_RUNNING = 2.0

#: ``ServerConfig.in_effect`` keys that are a request cap: SGLang and the sim, vLLM, llama.cpp.
CAP_SETTINGS = ("max_running_requests", "max_num_seqs", "total_slots")

_NO_METRICS = "engine metrics (running, waiting)"


# -- figures every rule reads ----------------------------------------------------------------


def _readable(lv: LevelResult) -> ServerMetrics | None:
    m = lv.server_metrics
    if m is None or m.unreadable is not None or m.note is not None or m.running is None:
        return None
    return m


def in_flight(lv: LevelResult) -> float | None:
    """The mean requests in flight by Little's law: completed requests per second times the
    mean end-to-end latency (s); ``None`` without either."""
    e2e = lv.e2el_ms.mean
    if e2e is None or lv.request_throughput <= 0:
        return None
    return lv.request_throughput * e2e / 1000.0


def _closed_target(concurrency: int, lv: LevelResult) -> int:
    """A closed loop's concurrency, at most its requests; a level run for a duration records
    ``num_prompts`` 0 (no count): its concurrency alone."""
    return min(concurrency, lv.num_prompts) if lv.num_prompts > 0 else concurrency


def target(lv: LevelResult) -> float | None:
    """What the level asks to keep in flight: a closed loop's concurrency (at most its
    requests); an open loop's cap when it was reached, else Little's law's mean."""
    load = lv.load
    if load.kind == "closed":
        return float(_closed_target(load.concurrency, lv))
    cap = getattr(load, "max_concurrency", None)
    if cap is not None and lv.max_concurrent_requests >= cap:
        return float(cap)
    return in_flight(lv)


def batch(lv: LevelResult) -> float | None:
    """The running batch: the engine's running mean, else the client's mean in flight."""
    m = _readable(lv)
    if m is not None and m.running is not None:
        return m.running.mean
    return in_flight(lv)


def cap_in_effect(config: ServerConfig | None) -> tuple[float, str] | None:
    """The request cap the configuration in effect says (and its flag's key); SGLang's cap
    per DP rank times the ranks."""
    if config is None:
        return None
    for key in CAP_SETTINGS:
        value = config.in_effect.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            continue
        ranks = config.in_effect.get("dp_size")
        per_dp = "per_dp" in config.sources.get(key, "")
        if per_dp and isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 1:
            return float(value) * ranks, key
        return float(value), key
    return None


def kv_tokens(config: ServerConfig | None) -> float | None:
    """The KV cache's size in tokens from the configuration in effect: SGLang's
    ``max_total_num_tokens``, vLLM's ``num_gpu_blocks`` x ``block_size``; ``None`` unknown."""
    if config is None:
        return None
    values = config.in_effect

    def number(key: str) -> float | None:
        v = values.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 \
            else None

    for key in KV_TOKEN_SETTINGS:
        if (found := number(key)) is not None:
            return found
    blocks, size = number("num_gpu_blocks"), number("block_size")
    return blocks * size if blocks is not None and size is not None else None


def tokens_per_request(lv: LevelResult) -> float | None:
    """Prompt and output tokens of a completed request of the level, on average."""
    if lv.completed <= 0:
        return None
    return (lv.total_input_tokens + lv.total_output_tokens) / lv.completed


def _pinned(g: GaugeStats) -> float:
    """The share of the window the gauge spent at its max (from the mean where the share was
    not kept: a level stored before it was)."""
    if g.share_at_max is not None:
        return g.share_at_max
    return 1.0 if g.max > 0 and g.mean >= g.max * AT_CAP else 0.0


def _previous(seen: Seen, *, smaller_by: float = 1.0) -> LevelResult | None:
    """The level before with the largest batch at most ``1 / smaller_by`` of this one's."""
    now = batch(seen.level)
    if now is None:
        return None
    best: tuple[float, LevelResult] | None = None
    for lv in seen.before:
        b = batch(lv)
        if b is None or b <= 0 or b * smaller_by > now or lv.partial:
            continue
        if best is None or b > best[0]:
            best = (b, lv)
    return best[1] if best else None


def _ratio(now: float | None, then: float | None) -> float | None:
    if now is None or then is None or then <= 0:
        return None
    return now / then


@dataclass(frozen=True)
class Scaling:
    """How a level compares with one before it: the batch's, the step time's and the output
    throughput's growth, and the marginal gain at the larger batch (:data:`MARGINAL_GAIN`)."""

    grew: float
    step: float
    gain: float
    marginal: float

    def line(self, before: str) -> str:
        return (f"against {before}: batch x{self.grew:.1f}, step time (TPOT) x{self.step:.2f}, "
                f"throughput x{self.gain:.2f}; one more request adds {self.marginal:.2f} of an "
                f"average one (bound {MARGINAL_GAIN:g})")

    def figures(self) -> dict[str, float]:
        return {"batch_growth": self.grew, "step_growth": self.step,
                "throughput_growth": self.gain, "marginal_gain": self.marginal}

    @property
    def queued(self) -> bool:
        """The batch grew more than the step time explains (:data:`QUEUED_GROWTH`)."""
        return self.grew / self.step > self.gain * QUEUED_GROWTH


def _scaling(lv: LevelResult, prev: LevelResult) -> Scaling | None:
    """``lv`` against ``prev`` (a smaller batch); the steady windows' throughputs where both
    levels have one (a short level's ramp and tail dilute the whole level's)."""
    b1, b0 = batch(lv), batch(prev)
    s1, s0 = lv.tpot_ms.median, prev.tpot_ms.median
    now, then = lv.steady_output_throughput, prev.steady_output_throughput
    if not now or not then:
        now, then = lv.output_throughput, prev.output_throughput
    gain = _ratio(now, then)
    if b1 is None or b0 is None or s1 is None or s0 is None or gain is None:
        return None
    if b1 <= b0 or b0 <= 0 or s0 <= 0 or s1 <= 0 or gain <= 0:
        return None
    per_request = (s1 - s0) / (b1 - b0)
    return Scaling(grew=b1 / b0, step=s1 / s0, gain=gain,
                   marginal=(s0 - per_request * b0) / s1)


def _gpus(lv: LevelResult) -> list[GpuTelemetry]:
    return [g for g in lv.gpu or () if g.unreadable is None]


def _gpu_busy(lv: LevelResult) -> float | None:
    util = [g.utilization_pct.mean for g in _gpus(lv) if g.utilization_pct is not None]
    return sum(util) / len(util) if util else None


# -- the rules -------------------------------------------------------------------------------


def crashed(seen: Seen) -> Match | None:
    """The level ended before its requests or duration: the server was lost (or the run was
    interrupted). Clear: the level's own record says so."""
    lv = seen.level
    if not lv.partial:
        return None
    why = lv.partial_reason or "the level ended early"
    return Match("crashed", "clear",
                 (f"the level ended early ({lv.completed} of {lv.num_prompts} requests "
                  f"completed, {lv.failed} failed): {why}",),
                 {"completed": lv.completed, "failed": lv.failed})


def errors(seen: Seen) -> Match | None:
    """More requests failed than the level allows (``max_error_rate``), or none completed."""
    lv = seen.level
    if lv.failed == 0 or (lv.error_rate <= seen.max_error_rate and lv.completed > 0):
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(lv.errors.items(), key=lambda kv: -kv[1]))
    return Match("errors", "clear",
                 (f"{lv.failed} of {lv.failed + lv.completed} requests failed "
                  f"({lv.error_rate:.1%}, allowed {seen.max_error_rate:.1%})"
                  + (f": {kinds}" if kinds else ""),),
                 {"error_rate": lv.error_rate, "failed": lv.failed})


def client(seen: Seen) -> Match | None:
    """The client did not hold the load it was asked for: a closed loop whose requests in
    flight never reached its concurrency, an open loop sent late against its schedule (not
    because its own cap was full), or the client's CPU near a core. Likely (the client's
    figures); clear when the engine's metrics also show the server with room (its running
    batch below the target, nothing waiting)."""
    lv = seen.level
    lines: list[str] = []
    figures: dict[str, float] = {"client_cpu_util": lv.client_cpu_util}
    load = lv.load
    if load.kind == "closed":
        want = _closed_target(load.concurrency, lv)
        if lv.max_concurrent_requests < want * HELD_SHARE:
            lines.append(f"the client had at most {lv.max_concurrent_requests} requests in "
                         f"flight of the {want} asked")
            figures.update(max_in_flight=lv.max_concurrent_requests, target=want)
    lag = lv.schedule_lag_ms
    cap = getattr(load, "max_concurrency", None)
    cap_full = cap is not None and lv.max_concurrent_requests >= cap
    if lag is not None and lag.p99 is not None and lag.p99 > SCHEDULE_LAG_MS and not cap_full:
        lines.append(f"sends were {lag.p99:.1f} ms late at p99 against the schedule "
                     f"(bound {SCHEDULE_LAG_MS:g} ms)")
        figures["schedule_lag_p99_ms"] = lag.p99
    if lv.client_cpu_util >= CLIENT_CPU:
        lines.append(f"the client used {lv.client_cpu_util:.0%} of a CPU core "
                     f"(bound {CLIENT_CPU:.0%})")
    if not lines:
        return None
    m = _readable(lv)
    room = (m is not None and m.running is not None and m.waiting is not None
            and m.waiting.mean < QUEUE_MIN)
    if room and m is not None and m.running is not None:
        lines.append(f"the server ran {m.running.mean:.1f} on average with "
                     f"{m.waiting.mean if m.waiting else 0:.1f} waiting: it had room")
    return Match("client", "clear" if room else "likely", tuple(lines), figures)


def throttled(seen: Seen) -> Match | None:
    """A GPU slowed its clock during the level: a thermal, hardware or power-brake clock event
    active in at least :data:`THROTTLE_SHARE` of the samples, or the SM clock below
    :data:`THROTTLE_CLOCK_SHARE` of its max while busy. Likely (telemetry)."""
    gpus = _gpus(seen.level)
    if not gpus:
        seen.lack("GPU telemetry")
        return None
    lines: list[str] = []
    figures: dict[str, float] = {}
    for g in gpus:
        events = {k: v for k, v in g.clock_events.items()
                  if k in THROTTLE_EVENTS and v >= THROTTLE_SHARE}
        clock = g.sm_clock_mhz.mean if g.sm_clock_mhz is not None else None
        busy = g.utilization_pct is not None and g.utilization_pct.mean >= THROTTLE_BUSY_PCT
        slow = (clock is not None and g.max_sm_clock_mhz is not None and busy
                and clock < g.max_sm_clock_mhz * THROTTLE_CLOCK_SHARE)
        if not events and not slow:
            continue
        said = ", ".join(f"{k} {v:.0%} of samples" for k, v in sorted(events.items()))
        power = g.clock_events.get("sw_power_cap", 0.0)
        if slow and power:
            said = ", ".join(p for p in (said, f"sw_power_cap {power:.0%} of samples") if p)
        clock_text = (f"SM clock {clock:.0f} of {g.max_sm_clock_mhz:.0f} MHz"
                      if clock is not None and g.max_sm_clock_mhz else "")
        lines.append(f"GPU {g.index}: " + "; ".join(p for p in (said, clock_text) if p))
        if clock is not None:
            figures[f"gpu{g.index}_sm_clock_mhz"] = clock
        if g.max_sm_clock_mhz is not None:
            figures[f"gpu{g.index}_max_sm_clock_mhz"] = g.max_sm_clock_mhz
        for k, v in events.items():
            figures[f"gpu{g.index}_{k}"] = v
    if not lines:
        return None
    return Match("throttled", "likely", tuple(lines), figures)


def designed_cache_share(workload: WorkloadSpec | None, level: LevelResult) -> float | None:
    """The share of the prompt tokens the workload is built to let a prefix cache serve:
    a trace's prediction from its block hashes; a random workload's fixed prefix over the
    prompt; a shared-prefix workload's prefix over prefix and suffix (every request after the
    first of its prefix); ``None`` where the design does not say (ShareGPT, conversations)."""
    if level.expected_cached_prompt_tokens is not None and level.total_input_tokens > 0:
        return level.expected_cached_prompt_tokens / level.total_input_tokens
    kind = getattr(workload, "kind", None)
    if kind == "random":
        prefix, body = getattr(workload, "prefix_len", 0), getattr(workload, "input_len", 1)
        return float(prefix / (prefix + body))
    if kind == "shared-prefix":
        prefix, suffix = getattr(workload, "prefix_len", 0), getattr(workload, "suffix_len", 1)
        return float(prefix / (prefix + suffix))
    return None


def cache_inflated(seen: Seen) -> Match | None:
    """The prefix cache served far more of the prompts than the workload is built to reuse
    (:data:`CACHE_EXCESS` above its design): the prompts were seen before, prefill was not
    measured in full. Clear from the engine's hit rate; likely from the responses' cached
    tokens."""
    lv = seen.level
    design = designed_cache_share(seen.workload, lv)
    if design is None:
        return None
    m = _readable(lv)
    rate: float | None = None
    confidence: Confidence = "likely"
    source = ""
    if m is not None and m.prefix_cache_hit_rate is not None:
        rate, confidence, source = m.prefix_cache_hit_rate, "clear", "the engine's hit rate"
    elif lv.cached_prompt_tokens is not None and lv.total_input_tokens > 0:
        rate = lv.cached_prompt_tokens / lv.total_input_tokens
        source = "cached prompt tokens in the responses"
    if rate is None:
        seen.lack("prefix-cache hit rate")
        return None
    if rate < design + CACHE_EXCESS:
        return None
    return Match("cache_inflated", confidence,
                 (f"{rate:.0%} of the prompt tokens came from the prefix cache ({source}); the "
                  f"workload is built to reuse {design:.0%}",),
                 {"prefix_cache_hit_rate": rate, "designed_share": design})


def dp_imbalance(seen: Seen) -> Match | None:
    """Under data parallelism the ranks' running counts are far apart: the least busy rank
    runs less than :data:`DP_SPREAD` of the busiest. Clear (the engine's per-rank series)."""
    m = _readable(seen.level)
    if m is None:
        return None
    ranks = {k: g.mean for k, g in m.per_rank.get("running", {}).items()
             if any(part.split("=", 1)[0] in ("dp_rank", "engine") for part in k.split(","))}
    if len(ranks) < 2:
        return None
    busiest, idlest = max(ranks.values()), min(ranks.values())
    if busiest < DP_MIN_RUNNING or idlest >= busiest * DP_SPREAD:
        return None
    top = max(ranks, key=lambda k: ranks[k])
    low = min(ranks, key=lambda k: ranks[k])
    return Match("dp_imbalance", "clear",
                 (f"running {busiest:.1f} on {top} but {idlest:.1f} on {low} "
                  f"({len(ranks)} ranks)",),
                 {"running_max_rank": busiest, "running_min_rank": idlest,
                  "ranks": len(ranks)})


def _against_before(seen: Seen) -> tuple[list[str], dict[str, float]]:
    """TTFT and TPOT against the level before with a smaller batch (evidence, not a
    condition)."""
    prev = _previous(seen, smaller_by=1.0)
    if prev is None or prev is seen.level:
        return [], {}
    lv = seen.level
    ttft = _ratio(lv.ttft_ms.median, prev.ttft_ms.median)
    tpot = _ratio(lv.tpot_ms.median, prev.tpot_ms.median)
    if ttft is None or tpot is None:
        return [], {}
    return ([f"against {prev.label}: TTFT x{ttft:.1f}, TPOT x{tpot:.2f}"],
            {"ttft_growth": ttft, "tpot_growth": tpot})


def _growth(seen: Seen) -> dict[str, float]:
    """The scaling figures (``marginal_gain`` among them) against the level before with a
    batch at least :data:`BATCH_GROWTH` smaller, where the step time explains the batch's
    growth: what a guided study reads to bound what a larger batch can add
    (``tune.guided.batch_bound``); ``{}`` without such a level."""
    prev = _previous(seen, smaller_by=BATCH_GROWTH)
    scaling = _scaling(seen.level, prev) if prev is not None else None
    if scaling is None or scaling.queued:
        return {}
    return scaling.figures()


def running_cap(seen: Seen) -> Match | None:
    """Requests queue behind the request cap: the engine's running count pinned at the cap
    (the configured one, else the plateau it holds) for at least :data:`PINNED_SHARE` of the
    window while :data:`QUEUE_MIN` or more wait. Clear with the cap configured, or with the
    plateau and KV usage below :data:`KV_FULL` (not a full cache holding admission); likely
    from the client alone when the configured cap is below the level's target."""
    lv = seen.level
    cap = cap_in_effect(seen.config)
    m = _readable(lv)
    want = target(lv)
    if m is None or m.running is None or m.waiting is None:
        seen.lack(_NO_METRICS)
        if cap is None:
            seen.lack("the request cap in effect")
            return None
        if want is None or want <= cap[0]:
            return None
        lines, figures = _against_before(seen)
        return Match("running_cap", "likely",
                     (f"{want:.0f} requests asked to be in flight, the engine runs at most "
                      f"{cap[0]:.0f} ({cap[1]})", *lines),
                     {"cap": cap[0], "target": want, **figures})
    running, waiting = m.running, m.waiting
    at = cap[0] if cap is not None else running.max
    if at <= 0 or running.max < at * AT_CAP:
        return None
    pinned = _pinned(running)
    # above a configured cap every request waiting is the cap's; at or below it, only a queue
    # longer than the wait for the next step (QUEUE_SHARE) is
    above = cap is not None and want is not None and want > cap[0]
    queue = QUEUE_MIN if above else max(QUEUE_MIN, QUEUE_SHARE * running.mean)
    # Above a configured cap, the requests the client kept in flight beyond those running
    # queue too, seen by the engine or not: an engine's front end starved of CPU (vLLM's API
    # server on 2 loaded cores) held 13 of 16 before its scheduler, which counted 1 waiting.
    flight = in_flight(lv) if above else None
    if flight is not None and want is not None:
        flight = min(flight, want)  # Little's law over the completed: at most the load's
    held = (flight - running.mean - waiting.mean
            if flight is not None and waiting.mean < queue else 0.0)
    if pinned < PINNED_SHARE or (waiting.mean < queue and held < QUEUE_MIN):
        return None
    kv = m.kv_usage.max if m.kv_usage is not None else None
    if cap is not None:
        confidence: Confidence = "clear"
        cap_text = f"cap {at:.0f} ({cap[1]} in effect)"
    else:
        seen.lack("the request cap in effect")
        confidence = "clear" if kv is not None and kv < KV_FULL else "likely"
        cap_text = f"the plateau {at:.0f} (no cap in the configuration read)"
    lines = [f"running {running.max:.0f} of {cap_text} for {pinned:.0%} of the window, "
             f"{waiting.mean:.0f} waiting on average (max {waiting.max:.0f})"
             + (f", KV {kv:.0%}" if kv is not None else "")]
    if held >= QUEUE_MIN and flight is not None:
        lines.append(f"the client kept {flight:.1f} in flight on average: {held:.1f} more "
                     "than ran or waited in the engine, held before its scheduler (its front "
                     "end)")
    more, figures = _against_before(seen)
    prev = _previous(seen)
    prev_m = _readable(prev) if prev is not None else None
    if prev_m is not None and prev_m.waiting is not None and prev is not None:
        lines.append(f"waiting {prev_m.waiting.mean:.0f} at {prev.label} -> "
                     f"{waiting.mean:.0f}")
    return Match("running_cap", confidence, (*lines, *more),
                 {"cap": at, "running_max": running.max, "running_mean": running.mean,
                  "share_at_cap": pinned, "waiting_mean": waiting.mean,
                  "waiting_max": waiting.max, **({"kv_usage_max": kv} if kv is not None
                                                 else {}),
                  **({"held_before_engine": held} if held >= QUEUE_MIN else {}),
                  **_growth(seen), **figures})


def kv_capacity(seen: Seen) -> Match | None:
    """The KV cache is full: usage at or above :data:`KV_FULL` with requests waiting for room
    (vLLM's waiting by reason ``capacity``), preempted or retracted, or queued while the batch
    runs below its cap. Clear (the engine's metrics); likely from preemptions alone without a
    usage figure."""
    m = _readable(seen.level)
    if m is None:
        seen.lack(_NO_METRICS)
        return None
    kv = m.kv_usage.max if m.kv_usage is not None else None
    pre = m.preemptions or 0.0
    held = m.waiting_capacity.mean if m.waiting_capacity is not None else 0.0
    waiting = m.waiting.mean if m.waiting is not None else 0.0
    cap = cap_in_effect(seen.config)
    below_cap = m.running is not None and (cap is None or m.running.max < cap[0] * AT_CAP)
    figures: dict[str, float] = {"preemptions": pre, "waiting_capacity_mean": held,
                                 "waiting_mean": waiting}
    if kv is None:
        seen.lack("KV-cache usage")
        if pre <= 0:
            return None
        return Match("kv_capacity", "likely",
                     (f"{pre:.0f} requests preempted or retracted during the level "
                      "(no KV usage figure)",), figures)
    figures["kv_usage_max"] = kv
    size, need = kv_tokens(seen.config), tokens_per_request(seen.level)
    if size is not None and need is not None:
        figures.update(kv_free_tokens=(1 - kv) * size, tokens_per_request=need)
    if not _cache_full(seen, kv) or not (
            pre > 0 or held > 0 or (waiting >= QUEUE_MIN and below_cap)):
        return None
    why = [f"{held:.0f} waiting for room" if held > 0 else "",
           f"{pre:.0f} preempted or retracted" if pre > 0 else "",
           f"{waiting:.0f} waiting while the batch runs below its cap"
           if waiting >= QUEUE_MIN and below_cap and not held else ""]
    full = (f"KV cache {kv:.0%} full" if kv >= KV_FULL or size is None or need is None else
            f"KV cache {kv:.0%} full: {(1 - kv) * size:,.0f} tokens free, a request needs "
            f"{need:,.0f}")
    if m.running is not None:
        figures["running_mean"] = m.running.mean
    if cap is not None:
        figures["cap"] = cap[0]
    return Match("kv_capacity", "clear", (f"{full}; " + ", ".join(w for w in why if w),),
                 {**figures, **_growth(seen)})


def _cache_full(seen: Seen, kv: float) -> bool:
    """KV usage at :data:`KV_FULL`, or a free part too small for one request of the level."""
    size, need = kv_tokens(seen.config), tokens_per_request(seen.level)
    return kv >= KV_FULL or (size is not None and need is not None and (1 - kv) * size < need)


def _queued_for_compute(seen: Seen, running: GaugeStats, waiting: float,
                        cap: tuple[float, str] | None) -> Match | None:
    """Requests queue while the batch runs below its cap and the KV cache has room: nothing
    holds them back but the GPU's work (their prefill). Clear with a KV usage figure; likely
    without one (the cache could be what holds them)."""
    m = _readable(seen.level)
    kv = m.kv_usage.max if m is not None and m.kv_usage is not None else None
    if kv is not None and _cache_full(seen, kv):
        return None
    if _pinned(running) >= PINNED_SHARE:
        if _holds_target(seen.level, running, waiting):
            # the batch is the whole closed loop for most of the window: the queue is the
            # requests sent between a finish and the step that admits them (offered_load)
            return None
        # a batch held at one count with room in the cache and under the cap is held by a
        # limit this configuration does not show, not by the GPU's work (which varies it)
        seen.lack("what holds the running count at its plateau")
        return None
    if kv is None:
        seen.lack("KV-cache usage")
    busy = _gpu_busy(seen.level)
    lines = [f"{waiting:.1f} waiting while running {running.mean:.1f} on average (max "
             f"{running.max:.0f})" + (f" below cap {cap[0]:.0f}" if cap is not None else "")
             + (f", KV {kv:.0%}" if kv is not None else "")
             + ": the requests wait for the GPU's work (prefill), not for room"]
    if busy is not None:
        lines.append(f"GPU utilisation {busy:.0f} %")
    more, figures = _against_before(seen)
    return Match("compute", "clear" if kv is not None else "likely", (*lines, *more),
                 {"waiting_mean": waiting, "running_mean": running.mean,
                  "running_max": running.max, **({"kv_usage_max": kv} if kv is not None
                                                 else {}),
                  **({"cap": cap[0]} if cap is not None else {}),
                  **({"gpu_util_pct": busy} if busy is not None else {}), **figures})


def compute(seen: Seen) -> Match | None:
    """The GPU's step is the limit: against the level before with a batch at least
    :data:`BATCH_GROWTH` smaller, one more request adds less than :data:`MARGINAL_GAIN` of an
    average one by the step times (and the step's growth explains the throughput's:
    :data:`QUEUED_GROWTH`), while the batch
    ran below its cap with no queue beyond :data:`QUEUE_SHARE` of it; or, with the engine's
    metrics, requests queue beyond that while the batch runs below its cap and the KV cache
    has room (they wait for prefill). Clear with the engine's metrics; likely from the
    client's figures (and GPU utilisation at or above :data:`GPU_BUSY_PCT` where telemetry
    exists)."""
    lv = seen.level
    m = _readable(lv)
    cap = cap_in_effect(seen.config)
    if m is not None and m.running is not None:
        waiting = m.waiting.mean if m.waiting is not None else 0.0
        if cap is not None and m.running.max >= cap[0] * AT_CAP and _pinned(m.running) >= \
                PINNED_SHARE:
            return None
        if waiting > max(QUEUE_MIN, QUEUE_SHARE * m.running.mean):
            return _queued_for_compute(seen, m.running, waiting, cap)
    prev = _previous(seen, smaller_by=BATCH_GROWTH)
    if prev is None:
        seen.lack("a level before with a smaller batch")
        return None
    scaling = _scaling(lv, prev)
    if scaling is None or scaling.marginal >= MARGINAL_GAIN:
        return None
    if scaling.queued:
        seen.lack(_NO_METRICS if m is None else "a batch the step time explains")
        return None
    busy = _gpu_busy(lv)
    if m is None and busy is not None and busy < GPU_BUSY_PCT:
        # the throughput stopped growing with the batch, but not for the GPU's compute: its
        # kernels ran only part of the time (the engine's scheduling on the host, or something
        # no observer sees: transformers serve on an H100 held 53-58 % so)
        seen.seen_lines.append(
            f"{scaling.line(prev.label)}, while the GPU was busy {busy:.0f} % (below "
            f"{GPU_BUSY_PCT:.0f} %): not the GPU's compute; the engine's own scheduling on "
            "the host, or a limit not observed")
        seen.seen_figures.update({**scaling.figures(), "gpu_util_pct": busy})
        return None
    lines = [scaling.line(prev.label)]
    if busy is not None:
        lines.append(f"GPU utilisation {busy:.0f} %")
    if m is not None and m.running is not None:
        lines.append(f"running {m.running.mean:.0f} on average"
                     + (f" of cap {cap[0]:.0f}" if cap is not None else "")
                     + f", {m.waiting.mean if m.waiting else 0:.1f} waiting")
    figures = {**scaling.figures(), **({"gpu_util_pct": busy} if busy is not None else {})}
    return Match("compute", "clear" if m is not None else "likely", tuple(lines), figures)


def _holds_target(lv: LevelResult, running: GaugeStats, waiting: float) -> bool:
    """A closed loop whose running count sat at its whole concurrency for at least
    :data:`PINNED_SHARE` of the window, with no more running and waiting (means) than it
    sends: it cannot send more than that, so what waits beside it are requests sent after
    others finished, before the step that admits them. Requests of one length finish in
    waves, and on a busy host the next step comes late: the sim capped at 64 at c=16 on a
    2-core CI machine ran 16 for over half its window, with a wave of up to 16 waiting in
    between (more than :data:`QUEUE_SHARE` of the batch on average). More in the engine than
    the loop sends is someone else's load: not this case. ``waiting``: the waiting mean."""
    want = target(lv)
    return (lv.load.kind == "closed" and want is not None and want > 0
            and running.max >= want * AT_CAP and _pinned(running) >= PINNED_SHARE
            and running.mean + waiting <= want / AT_CAP)


def offered_load(seen: Seen) -> Match | None:
    """The server runs everything it is sent: the running batch (plus the short wait before
    admission, at most :data:`QUEUE_SHARE` of it) reaches :data:`HELD_SHARE` of the level's
    target while below its cap: raise the load. Clear with the engine's metrics (for a closed
    loop, with a level before whose smaller batch shows the throughput still growing with the
    batch: marginal gain at least :data:`MARGINAL_GAIN`; likely without one, since a batch
    already saturated runs everything it is sent too); likely from the client's figures when
    the throughput grew so against a level before, or an open loop met its rate."""
    lv = seen.level
    m = _readable(lv)
    want = target(lv)
    cap = cap_in_effect(seen.config)
    if m is not None and m.running is not None and want:
        waiting = m.waiting.mean if m.waiting is not None else 0.0
        queued = waiting > max(QUEUE_MIN, QUEUE_SHARE * m.running.mean)
        queue_ok = not queued or _holds_target(lv, m.running, waiting)
        most = m.running.max + (m.waiting.max if m.waiting is not None else 0.0)
        held = most >= want * HELD_SHARE
        # a load at the cap is admitted whole: the cap holds nothing back until it is passed
        below = cap is None or m.running.max < cap[0] * AT_CAP or want <= cap[0]
        if not (queue_ok and held and below):
            return None
        at_cap = cap is not None and want >= cap[0] * AT_CAP
        lines = [f"running {m.running.mean:.1f} on average (max {m.running.max:.0f}) of "
                 f"{want:.0f} sent, {waiting:.1f} waiting"
                 + (f", cap {cap[0]:.0f}" if cap is not None else "")
                 + ": the server runs everything it is sent"
                 + ("; the load is at the cap: more would queue behind it" if at_cap else "")]
        if queued:  # admitted by _holds_target
            lines.append(f"all {want:.0f} ran for {_pinned(m.running):.0%} of the window; "
                         "the waiting were sent between a finish and the step that admits "
                         "them")
        figures = {"running_mean": m.running.mean, "running_max": m.running.max,
                   "waiting_mean": waiting, "target": want,
                   **({"cap": cap[0]} if cap is not None else {})}
        confidence: Confidence = "clear"
        if lv.load.kind == "closed":
            # a closed loop's throughput is also the server's speed at this batch: that
            # more load still adds throughput takes a level before (a batch already
            # saturated at the first level runs everything it is sent too)
            prev = _previous(seen, smaller_by=BATCH_GROWTH)
            scaling = _scaling(lv, prev) if prev is not None else None
            if prev is None or scaling is None:
                seen.lack("a level before with a smaller batch")
                confidence = "likely"
            else:
                lines.append(scaling.line(prev.label))
                figures.update(scaling.figures())
                if scaling.marginal < MARGINAL_GAIN:
                    confidence = "likely"
        return Match("offered_load", confidence, tuple(lines), figures)
    rate = lv.request_rate
    if lv.load.kind != "closed" and rate is not None and math.isfinite(rate) and rate > 0:
        if lv.achieved_request_rate >= rate * HELD_SHARE:
            return Match("offered_load", "likely",
                         (f"{lv.achieved_request_rate:.2f} requests/s achieved of "
                          f"{rate:g} asked",),
                         {"achieved_rate": lv.achieved_request_rate, "rate": rate})
        return None
    prev = _previous(seen, smaller_by=BATCH_GROWTH)
    if prev is None:
        seen.lack("a level before with a smaller batch")
        return None
    scaling = _scaling(lv, prev)
    if scaling is None or scaling.marginal < MARGINAL_GAIN or scaling.queued:
        return None
    return Match("offered_load", "likely",
                 (scaling.line(prev.label) + ": more load still adds throughput",),
                 scaling.figures())


#: The rules in their order: the first match is the verdict. A level that did not run as
#: asked (crashed, errors, a client that could not send it) says nothing about the server; a
#: throttled host or an inflated cache says the number is not the configuration's; then what
#: holds the batch, from the most specific signature (per-rank counts, a cap, a full cache) to
#: the most general (the step time, the load itself).
RULES: tuple[tuple[str, Rule], ...] = (
    ("crashed", crashed),
    ("errors", errors),
    ("client", client),
    ("throttled", throttled),
    ("cache_inflated", cache_inflated),
    ("dp_imbalance", dp_imbalance),
    ("running_cap", running_cap),
    ("kv_capacity", kv_capacity),
    ("compute", compute),
    ("offered_load", offered_load),
)


def _figures(figures: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in figures.items() if math.isfinite(float(v))}


def diagnose(level: LevelResult, before: Sequence[LevelResult] = (),
             config: ServerConfig | None = None, engine: str | None = None, *,
             workload: WorkloadSpec | None = None,
             max_error_rate: float = 0.01) -> Bottleneck:
    """What limited ``level``, given the levels measured ``before`` it (oldest first), the
    configuration in effect (``config``) and the engine (``engine``: an adapter's name; else
    ``config.engine``, ``config.flavour`` or the metrics' flavour pick the advice book).
    ``workload``: what the run sent (the cache rule needs it); ``max_error_rate``: the run's
    (``BenchConfig.max_error_rate``). Pure: reads only its arguments and the advice books."""
    seen = Seen(level, tuple(before), config, workload, max_error_rate)
    matches: list[tuple[str, Match]] = []
    for name, rule in RULES:
        found = rule(seen)
        if found is not None:
            matches.append((name, found))
    if not matches:
        lines = ["no rule's signature matched"
                 + (f"; not there to decide: {', '.join(seen.missing)}" if seen.missing
                    else ""), *seen.seen_lines]
        figures: dict[str, float] = dict(seen.seen_figures)
        said = _readable(level)
        if said is not None and said.running is not None:
            kv = said.kv_usage.max if said.kv_usage is not None else None
            waiting = said.waiting.mean if said.waiting is not None else None
            running = said.running
            lines.append(f"running {running.mean:.1f} on average (max {running.max:.0f})"
                         + (f", {waiting:.1f} waiting" if waiting is not None else "")
                         + (f", KV {kv:.0%}" if kv is not None else ""))
            figures |= {"running_mean": running.mean, "running_max": running.max,
                       **({"waiting_mean": waiting} if waiting is not None else {}),
                       **({"kv_usage_max": kv} if kv is not None else {})}
        # the engine's own word on what is missing (an engine without a metrics endpoint
        # says so) before the general advice, which names other engines' switches
        book = _book(engine, config, level)
        own = book.get("unknown", ()) if book is not None else ()
        return Bottleneck(verdict="unknown", confidence="unknown", evidence=tuple(lines),
                          figures=_figures(figures), missing=tuple(seen.missing),
                          advice=tuple(e.render(config)
                                       for e in own or GENERAL_ADVICE["unknown"]),
                          rule="unknown")
    name, first = matches[0]
    also: list[BottleneckKind] = []
    for _, m in matches[1:]:
        if m.verdict != first.verdict and m.verdict not in also:
            also.append(m.verdict)
    book = _book(engine, config, level)
    entries = ((book.get(first.verdict, ()) if book is not None else ())
               + GENERAL_ADVICE.get(first.verdict, ()))
    return Bottleneck(verdict=first.verdict, confidence=first.confidence,
                      evidence=first.evidence, figures=_figures(first.figures),
                      advice=tuple(e.render(config) for e in entries),
                      missing=tuple(seen.missing), rule=name, also=tuple(also))


def diagnosed(level: LevelResult, before: Sequence[LevelResult] = (),
              config: ServerConfig | None = None, engine: str | None = None, *,
              workload: WorkloadSpec | None = None,
              max_error_rate: float = 0.01) -> LevelResult:
    """``level`` with its :attr:`~cleanslate.bench.LevelResult.bottleneck` set by
    :func:`diagnose`. A rule that fails on figures it did not expect gives ``unknown`` naming
    the failure: the level is kept whatever the diagnosis does."""
    try:
        verdict = diagnose(level, before, config, engine, workload=workload,
                           max_error_rate=max_error_rate)
    except (ArithmeticError, ValueError, TypeError, AttributeError) as exc:
        verdict = Bottleneck(verdict="unknown", confidence="unknown",
                             evidence=(f"the diagnosis failed: {type(exc).__name__}",),
                             missing=("a diagnosis that ran to its end",), rule="unknown")
    return level.model_copy(update={"bottleneck": verdict})


def _book(engine: str | None, config: ServerConfig | None,
          level: LevelResult) -> AdviceBook | None:
    metrics = level.server_metrics
    for name in (engine, config.engine if config else None, config.flavour if config else None,
                 metrics.flavour if metrics else None):
        book = advice_for(name)
        if book is not None:
            return book
    return None


__all__ = [
    "BOTTLENECK_KINDS",
    "GENERAL_ADVICE",
    "RULES",
    "Advice",
    "AdviceBook",
    "AdviceEntry",
    "Bottleneck",
    "BottleneckKind",
    "Confidence",
    "Direction",
    "Match",
    "Seen",
    "advice_book",
    "advice_for",
    "designed_cache_share",
    "diagnose",
    "diagnosed",
    "register_advice",
]
