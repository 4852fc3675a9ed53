"""Value objects of the benchmark client: configuration in, results out.

Every model here is a frozen pydantic model that round-trips through JSON. A
:class:`LevelResult` serializes with the metric keys of vLLM's ``vllm bench serve`` result
(``completed``, ``output_throughput``, ``mean_ttft_ms``, ``p99.9_ttft_ms`` ...) flat at the top
of the object, so tools that read vLLM result files can read ours; in Python the latency
distributions are nested :class:`Stats` objects (``level.ttft_ms.p99``).

Units: times in milliseconds where the key ends in ``_ms``, seconds where it ends in ``_s`` or is
``duration``; throughputs in requests/s or tokens/s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from cleanslate.bench._bottleneck import Bottleneck
from cleanslate.bench._conversation import ConversationWorkload, TurnResult
from cleanslate.bench._limits import (
    MAX_BURSTINESS,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_LEVELS,
    MAX_NUM_PROMPTS,
    MAX_PROMPT_TOKENS,
    MAX_REPEATS,
    MAX_REPLAY_SPEEDUP,
    MAX_TIMEOUT_S,
    MIN_BURSTINESS,
    MIN_RATE,
)
from cleanslate.bench._observe import ObserveOptions
from cleanslate.bench._observed import GpuTelemetry, ServerMetrics
from cleanslate.bench._ramp import RampLoad, WindowResult
from cleanslate.bench._server_config import ServerConfig
from cleanslate.bench._trace import TraceInfo, TraceWorkload, check_replay, replay_span_s
from cleanslate.bench._workloads import WorkloadSpec, generate
from cleanslate.errors import InputError
from cleanslate.inputs import check_input_file

#: Percentiles reported for every latency distribution, as ``(key word, percent)``.
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p90", 90.0),
    ("p95", 95.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
)

#: The latency distributions of a level, by vLLM's metric name.
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")

#: Suffixes of the interval keys a repeated level's JSON holds beside a metric ``KEY``:
#: ``KEY_ci_low``, ``KEY_ci_high`` (95 % interval) and ``KEY_cv`` (the repeats' coefficient of
#: variation).
CI_SUFFIXES: tuple[str, ...] = ("_ci_low", "_ci_high", "_cv")

#: A per-request latency limit's key (``BenchConfig.limits``): the statistic it caps, the
#: distribution and ``_ms`` (``p99_ttft_ms``, ``mean_tpot_ms``, ``max_e2el_ms``).
LIMIT_KEY = re.compile(r"^(mean|median|max|p50|p90|p95|p99|p99\.9)_(ttft|tpot|itl|e2el)_ms$")

#: Repeats a ``target_ci_pct`` run takes at least, and at most when ``repeats`` is not set.
TARGET_CI_MIN_REPEATS = 3
TARGET_CI_DEFAULT_CAP = 10

Endpoint = Literal["completions", "chat"]
Arrival = Literal["poisson", "constant", "gamma"]
TokenSource = Literal["server", "tokenizer", "approx", "none"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Stats(_Frozen):
    """Summary of one latency distribution in milliseconds; all ``None`` when it has no sample."""

    count: int = 0
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None

    def flat(self, metric: str) -> dict[str, float | None]:
        """The vLLM-style keys for this distribution, e.g. ``mean_ttft_ms``, ``p99.9_ttft_ms``."""
        return {
            f"mean_{metric}_ms": self.mean,
            f"median_{metric}_ms": self.median,
            f"std_{metric}_ms": self.std,
            f"min_{metric}_ms": self.min,
            f"max_{metric}_ms": self.max,
            f"p50_{metric}_ms": self.median,
            f"p90_{metric}_ms": self.p90,
            f"p95_{metric}_ms": self.p95,
            f"p99_{metric}_ms": self.p99,
            f"p99.9_{metric}_ms": self.p999,
        }

    @classmethod
    def from_flat(cls, data: dict[str, Any], metric: str) -> Stats:
        def g(key: str) -> Any:
            return data.get(f"{key}_{metric}_ms")

        return cls(
            count=int(data.get(f"count_{metric}", 0) or 0),
            mean=g("mean"),
            std=g("std"),
            min=g("min"),
            median=g("median"),
            p90=g("p90"),
            p95=g("p95"),
            p99=g("p99"),
            p999=g("p99.9"),
            max=g("max"),
        )


class SLO(_Frozen):
    """Per-request service-level objectives in milliseconds; ``None`` means no limit.

    A request is *good* when it completed without error and meets every limit that is set.
    ``tpot_ms`` is checked only for requests with more than one output token.
    """

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)

    def is_empty(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None


class ClosedLoop(_Frozen):
    """A fixed number of requests in flight: a new one is sent as soon as one finishes."""

    kind: Literal["closed"] = "closed"
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)

    @property
    def label(self) -> str:
        return f"c={self.concurrency}"


class OpenLoop(_Frozen):
    """Requests sent at a target rate regardless of completions (optionally capped).

    ``arrival``: ``poisson`` (exponential gaps), ``constant`` (equal gaps) or ``gamma`` (gamma gaps
    with shape ``burstiness``: 1 is Poisson, below 1 burstier, above 1 more regular). The mean gap
    is always ``1 / rate``. ``rate`` may be ``inf``: every request is due at once, and
    ``max_concurrency`` then decides how many are in flight. A request due while the cap is
    reached waits for a free slot (so the achieved rate can fall below the target).
    """

    kind: Literal["open"] = "open"
    rate: float = Field(ge=MIN_RATE)
    arrival: Arrival = "poisson"
    burstiness: float = Field(default=1.0, ge=MIN_BURSTINESS, le=MAX_BURSTINESS)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)

    @property
    def label(self) -> str:
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        cap = f",cap={self.max_concurrency}" if self.max_concurrency else ""
        return f"rate={rate}/s {self.arrival}{cap}"


class ReplayLoad(_Frozen):
    """A trace's requests sent at the trace's own times (:mod:`cleanslate.bench._trace`), an
    open loop whose schedule is the workload's, optionally capped. ``speedup`` is this level's
    on top of the workload's ``speedup=`` (levels at 1, 2 and 4 replay the same requests at
    rising rates)."""

    kind: Literal["replay"] = "replay"
    speedup: float = Field(default=1.0, gt=0, le=MAX_REPLAY_SPEEDUP)
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)

    @property
    def label(self) -> str:
        """``replay`` at the workload's times, ``replay=2x`` at twice their rate."""
        cap = f",cap={self.max_concurrency}" if self.max_concurrency else ""
        scale = "" if self.speedup == 1 else f"={self.speedup:g}x"
        return f"replay{scale}{cap}"


Load = Annotated[ClosedLoop | OpenLoop | ReplayLoad | RampLoad, Field(discriminator="kind")]
#: A level's load, as the functions that run one take it.
AnyLoad = ClosedLoop | OpenLoop | ReplayLoad | RampLoad


class BenchConfig(_Frozen):
    """What to benchmark and how: the server, the workload, the limits of each level.

    A level runs ``num_prompts`` requests, or sends requests for ``duration_s`` seconds and then
    waits for those in flight; exactly one of the two is used (``duration_s`` wins when both are
    set). ``warmup`` requests are sent before the first level of a run and not measured.

    Bounds (``docs/bench.md``): each request must end within ``request_timeout_s`` of its send
    (default: 600 s plus 1 s per output token asked for) and may wait at most
    ``read_timeout_s`` for its next byte; sizes are capped (:mod:`cleanslate.bench._limits`).
    """

    url: str
    model: str
    endpoint: Endpoint = "completions"
    workload: WorkloadSpec = Field(default_factory=lambda: _default_workload())
    loads: tuple[Load, ...] = Field(
        default=(ClosedLoop(concurrency=1),), min_length=1, max_length=MAX_LEVELS
    )
    num_prompts: int | None = Field(default=None, ge=1, le=MAX_NUM_PROMPTS)
    duration_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    warmup: int = Field(default=0, ge=0, le=MAX_NUM_PROMPTS)
    seed: int = 0
    tokenizer: str | None = None
    slo: SLO = SLO()
    ignore_eos: bool = True
    request_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds from a request's send to its last byte; None: 600 s plus 1 s "
        "per output token asked for",
    )
    read_timeout_s: float = Field(
        default=600.0, gt=0, le=MAX_TIMEOUT_S, description="seconds to wait for the next byte"
    )
    stall_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="no byte from any request for this long while requests are in flight: "
        "probe the server; end the level if it does not accept a connection",
    )
    api_key: str | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    repeats: int | None = Field(
        default=None, ge=1, le=MAX_REPEATS,
        description="measurements of each level (each with the seed seed + repeat index); "
        "None: 1, or up to 10 with target_ci_pct")
    target_ci_pct: float | None = Field(
        default=None, gt=0, lt=100,
        description="repeat a level (at least 3 times, at most repeats) until the 95 % "
        "interval's half-width of its output throughput is at most this percent of its mean")
    max_error_rate: float = Field(
        default=0.01, ge=0, le=1,
        description="a level whose share of failed requests is above this is not a "
        "throughput result (valid: false)")
    observe: ObserveOptions = Field(
        default_factory=ObserveOptions, description="what watches each level: the engine's "
        "metrics and the GPUs, how often (--observe-interval, --no-observe)")
    limits: dict[str, float] = Field(
        default_factory=dict,
        description="per-request latency limits by key (p99_ttft_ms: 8000): each level "
        "counts the samples that met each (limit_counts)")

    @field_validator("limits")
    @classmethod
    def _limits(cls, value: dict[str, float]) -> dict[str, float]:
        for key, limit in value.items():
            if not LIMIT_KEY.match(key):
                raise ValueError(
                    f"{key!r} is not a latency key (STAT_METRIC_ms: STAT one of mean, median, "
                    "max, p50, p90, p95, p99, p99.9; METRIC one of ttft, tpot, itl, e2el)")
            if not math.isfinite(limit) or limit <= 0:
                raise ValueError(f"{key}: the limit must be a positive number of ms, not {limit}")
        return value

    @model_validator(mode="after")
    def _repeats(self) -> BenchConfig:
        if (self.target_ci_pct is not None and self.repeats is not None
                and self.repeats < TARGET_CI_MIN_REPEATS):
            raise ValueError(f"target_ci_pct repeats a level at least {TARGET_CI_MIN_REPEATS} "
                             f"times: repeats must be at least {TARGET_CI_MIN_REPEATS}, not "
                             f"{self.repeats}")
        return self

    @property
    def max_repeats(self) -> int:
        """The most measurements of one level: ``repeats``, else 10 with ``target_ci_pct``,
        else 1."""
        if self.repeats is not None:
            return self.repeats
        return TARGET_CI_DEFAULT_CAP if self.target_ci_pct is not None else 1

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        """An ``http(s)://HOST[:PORT][/v1]`` URL that every request can be sent to."""
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError("the URL contains whitespace or control characters")
        try:
            split = urlsplit(value)
            port = split.port
        except ValueError as exc:  # "Port out of range 0-65535", a port that is not a number
            raise ValueError(f"{value!r} is not a valid URL: {exc}") from None
        if split.scheme not in ("http", "https"):
            raise ValueError(f"{value!r} is not an http(s) URL (http://HOST:PORT)")
        if not split.hostname:
            raise ValueError(f"{value!r} names no host (http://HOST:PORT)")
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port {port} is out of range 1-65535")
        if split.query or split.fragment:
            raise ValueError(f"{value!r}: give the server's base URL, without ?query or #part")
        return value

    @model_validator(mode="after")
    def _loads_fit(self) -> BenchConfig:
        """A replay needs a trace; a conversation's users are its level's concurrency."""
        is_trace = isinstance(self.workload, TraceWorkload)
        for load in self.loads:
            if isinstance(load, ReplayLoad) and not is_trace:
                raise ValueError("a replay level sends a trace's requests at their times: "
                                 "give a trace workload (trace:path=FILE,format=...)")
        spec = self.workload
        if isinstance(spec, ConversationWorkload):
            for load in self.loads:
                if isinstance(load, RampLoad):
                    raise ValueError("a conversation workload runs on closed or open loops "
                                     "(users or a rate of new conversations), not on a ramp")
        if isinstance(spec, ConversationWorkload) and spec.users is not None:
            for load in self.loads:
                if not isinstance(load, ClosedLoop) or load.concurrency != spec.users:
                    raise ValueError(f"users={spec.users} is the concurrency of every level "
                                     f"of a conversation workload; {load.label} is not "
                                     f"c={spec.users} (leave users out, or the levels)")
        return self

    @model_validator(mode="after")
    def _bounded(self) -> BenchConfig:
        """The prompts of a level are built before it starts: cap their total tokens (a
        replay's are bounded as the trace is read)."""
        per_prompt = self.workload.max_input_tokens()
        for load in self.loads:
            if isinstance(load, ReplayLoad):
                self._replay_bounded(load)
                continue
            n = self.prompts_for(load)
            if n > MAX_NUM_PROMPTS:
                raise ValueError(
                    f"{load.label} would use {n:,} prompts (5 per slot): at most "
                    f"{MAX_NUM_PROMPTS:,}; set num_prompts"
                )
            if n * per_prompt > MAX_PROMPT_TOKENS:
                raise ValueError(
                    f"{load.label}: {n:,} prompts of up to {per_prompt:,} input tokens hold "
                    f"{n * per_prompt:,} tokens; at most {MAX_PROMPT_TOKENS:,} per level "
                    "(about 2.8 GB of client memory); use fewer prompts or shorter inputs"
                )
        return self

    def _replay_bounded(self, load: ReplayLoad) -> None:
        """A replay level sends for at most ``MAX_DURATION_S`` (a trace that cannot be read
        is refused when its prompts are built, with its own error)."""
        if not isinstance(self.workload, TraceWorkload):
            return
        try:
            span = replay_span_s(self.workload)
        except InputError:
            return
        if span / load.speedup > MAX_DURATION_S:
            raise ValueError(f"{load.label} would send for {span / load.speedup:,.0f} s: a "
                             f"level sends for at most {MAX_DURATION_S:,.0f} s; replay a "
                             "window of the trace (start=, duration=), a sample or faster")

    def prompts_for(self, load: AnyLoad) -> int:
        """Requests per level when ``num_prompts`` is not set: 5 per slot, at least 50; a
        replay's every request of the trace's selection (at most ``MAX_NUM_PROMPTS``); a rate
        ramp's the requests it is expected to send, and a tenth more."""
        if isinstance(load, RampLoad):
            if load.of == "rate":
                return min(MAX_NUM_PROMPTS, math.ceil(load.expected_requests() * 1.1) + 10)
            return max(50, 5 * (load.max_concurrency or 1))
        if self.num_prompts is not None:
            return self.num_prompts
        if isinstance(load, ReplayLoad):
            return MAX_NUM_PROMPTS
        slots = load.concurrency if isinstance(load, ClosedLoop) else (load.max_concurrency or 10)
        return max(50, 5 * slots)


def check_workload_files(workload: WorkloadSpec, speedups: Iterable[float] = (), *,
                         where: str | None = None) -> None:
    """Read the file a workload names (a ShareGPT dataset, a conversation file, a trace) as
    its first level will, before anything runs: a regular file within its size cap
    (:func:`cleanslate.inputs.check_input_file`, errors at ``where``), its rows, lengths and
    histories, and for a trace each replay level's duration at ``speedups``. InputError on
    bad input; the run's own prompts are built again later."""
    file = getattr(workload, "path", None)
    if not isinstance(file, str):
        return
    kind: Literal["trace", "dataset"] = "trace" if isinstance(workload, TraceWorkload) \
        else "dataset"
    try:
        check_input_file(file, kind=kind, where=where)
    except InputError as exc:
        raise InputError(f"the workload's {kind}: {exc.message}", where=exc.where,
                         hint=exc.hint) from None
    generate(workload, 1, seed=0)
    if isinstance(workload, TraceWorkload):
        check_replay(workload, speedups, where=where)


def _default_workload() -> WorkloadSpec:
    from cleanslate.bench._workloads import RandomWorkload

    return RandomWorkload()


#: Where a level's crash was read: the run's log (its engine's crash patterns), the exit
#: status its supervisor recorded, or only what the client's connections showed.
CrashSource = Literal["log", "exit_status", "connections"]


class LevelCrash(_Frozen):
    """The server died during a level: at which level (``label``), why (``cause``, the
    vocabulary of a study's trials and ``--find-max``'s probes: ``python_exception``, ``oom``,
    ``killed``, ``exited``, or ``connection_refused`` ... when only the connections tell), its
    evidence (``line``: the log's root-cause line, the exit status, or the connection errors)
    and where that was read (``source``)."""

    label: str
    cause: str
    line: str
    source: CrashSource

    def describe(self) -> str:
        """``the server crashed at c=256: python_exception: AttributeError: ...``."""
        return f"the server crashed at {self.label}: {self.cause}: {self.line}"


class LevelResult(_Frozen):
    """The measured outcome of one level (one concurrency or one rate).

    Serialized (``model_dump`` / JSON) flat, with vLLM's key names first; validated back from
    the same flat form. ``partial`` is true when the level ended before its request count or
    duration (the server died, the run was interrupted); ``partial_reason`` says why.
    """

    label: str
    load: Load
    completed: int
    failed: int
    sent: int = Field(
        default=0, description="requests sent: always completed + failed (a request that "
        "ended in any way other than completing is failed, by its class in errors)")
    num_prompts: int
    duration: float = Field(description="first send -> last receive, seconds")
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    good_requests: int | None
    max_concurrency: int | None
    max_concurrent_requests: int
    request_rate: float | None
    burstiness: float | None
    achieved_request_rate: float
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2el_ms: Stats
    errors: dict[str, int] = Field(default_factory=dict)
    error_details: dict[str, str] = Field(
        default_factory=dict,
        description="the first detail (an HTTP error body, an exception) of each error kind",
    )
    malformed_sse_events: int = 0
    connection_retries: int = Field(
        default=0, description="requests sent again on a new connection because the server "
        "had closed a kept-alive one without saying so (llama.cpp)")
    output_samples: int = Field(
        default=0, description="responses of the level whose text was checked "
        "(cleanslate.outputs)")
    output_issues: dict[str, int] = Field(
        default_factory=dict, description="sampled responses per issue: nan, empty, "
        "degenerate, error_finish, short")
    output_evidence: tuple[str, ...] = Field(
        default=(), description="up to 3 of the bad sampled outputs, as printable text")
    bad_output: str | None = Field(
        default=None, description="the issue that breaks this level's output (a failed level), "
        "or None")
    cached_prompt_tokens: int | None = Field(
        default=None, description="prompt tokens the server served from its prefix cache, summed "
        "over the requests whose usage says so (usage.prompt_tokens_details.cached_tokens); "
        "None when the server reports no such figure")
    output_tokens_source: TokenSource
    input_tokens_source: TokenSource
    requested_output_tokens: int = 0
    short_output_requests: int = Field(
        default=0, description="requests that got fewer output tokens than they asked for"
    )
    partial: bool = False
    partial_reason: str | None = None
    client_cpu_s: float
    client_wall_s: float
    client_cpu_util: float
    warnings: tuple[str, ...] = ()
    seed: int | None = Field(
        default=None, description="the seed of this measurement's prompts and arrivals (the "
        "run's seed plus the repeat index); None for a level of several repeats")
    error_rate: float = Field(
        default=0.0, description="failed / (completed + failed) requests")
    valid: bool = Field(
        default=True, description="whether the level is a throughput result: false when its "
        "error rate is above max_error_rate, it ended early or no request completed")
    invalid_reason: str | None = None
    steady_share: float | None = Field(
        default=None, description="the steady window's share of the level's duration (closed "
        "loops: the span where requests in flight were at least 95 % of the concurrency)")
    steady_duration: float | None = None
    steady_output_throughput: float | None = Field(
        default=None, description="output tokens received inside the steady window per second")
    steady_request_throughput: float | None = Field(
        default=None, description="requests completed inside the steady window per second")
    steady_requests: int | None = Field(
        default=None, description="completed requests sent and ended inside the window (the "
        "steady latencies' samples)")
    steady_median_ttft_ms: float | None = None
    steady_p99_ttft_ms: float | None = None
    steady_median_tpot_ms: float | None = None
    steady_p99_tpot_ms: float | None = None
    steady_ok: bool | None = Field(
        default=None, description="false when the steady window is under STEADY_FLOOR of the "
        "level; None for open loops")
    schedule_lag_ms: Stats | None = Field(
        default=None, description="how late each request was sent against its schedule (open "
        "loops, replays, rate ramps); None for a closed loop")
    expected_cached_prompt_tokens: int | None = Field(
        default=None, description="prompt tokens a prefix cache with room for everything "
        "serves to the requests sent, predicted from a trace's block hashes; None without")
    turns: tuple[TurnResult, ...] = Field(
        default=(), description="per turn of a conversation workload: TTFT, input and cached "
        "tokens (empty for other workloads)")
    windows: tuple[WindowResult, ...] = Field(
        default=(), description="per window of a ramp: its load, throughputs and latencies "
        "(empty for other loads)")
    limit_counts: dict[str, tuple[int, int]] = Field(
        default_factory=dict, description="per BenchConfig.limits key: (samples that met the "
        "limit, samples)")
    n_repeats: int = 1
    first_repeat_slow: bool | None = Field(
        default=None, description="with 3 or more repeats: whether the first was significantly "
        "slower than the rest (first_repeat_slow); None below 3")
    ci: dict[str, tuple[float | None, float | None, float | None]] = Field(
        default_factory=dict, description="per metric key: (ci_low, ci_high, cv) over the "
        "repeats; serialized flat as KEY_ci_low, KEY_ci_high, KEY_cv")
    repeats: tuple[LevelResult, ...] = Field(
        default=(), description="each repeat's own result, in order (empty for one)")
    server_metrics: ServerMetrics | None = Field(
        default=None, description="the engine's own metrics over the level (None: not "
        "observed); with repeats, pooled over them")
    gpu: tuple[GpuTelemetry, ...] | None = Field(
        default=None, description="telemetry of each GPU in the run's scope over the level "
        "(None: not observed)")
    bottleneck: Bottleneck | None = Field(
        default=None, description="what limited the level, from its observations, the levels "
        "before it and the configuration in effect (None: not diagnosed)")
    crash: LevelCrash | None = Field(
        default=None, description="the server died during this level: its cause and where "
        "it was read (None: it did not, or nobody looked); left out of the JSON when None, "
        "so a stored level's layout is unchanged")

    def interval(self, key: str) -> tuple[float | None, float | None]:
        """The 95 % interval of a metric key over the repeats (``(None, None)`` without)."""
        low, high, _cv = self.ci.get(key, (None, None, None))
        return low, high

    def metric(self, key: str) -> Any:
        """Any serialized key of this level, e.g. ``metric("p99_ttft_ms")``."""
        return self.model_dump()[key]

    @model_serializer(mode="wrap")
    def _flatten(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if "ttft_ms" not in data and "mean_ttft_ms" in data:
            # already flat: pydantic calls a self-referencing model's serializer on its own
            # output when it is nested (BenchResult.levels, LevelResult.repeats)
            return data
        head_keys = (
            "completed",
            "failed",
            "num_prompts",
            "duration",
            "total_input_tokens",
            "total_output_tokens",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "request_goodput",
            "max_concurrency",
            "request_rate",
            "burstiness",
        )
        out: dict[str, Any] = {k: data.pop(k) for k in head_keys}
        for metric in LATENCY_METRICS:
            stats: Stats = getattr(self, f"{metric}_ms")
            data.pop(f"{metric}_ms")
            out.update(stats.flat(metric))
            out[f"count_{metric}"] = stats.count
        ci = data.pop("ci", {})
        if data.get("crash", 0) is None:
            del data["crash"]
        out.update(data)
        for key, values in ci.items():
            for suffix, value in zip(CI_SUFFIXES, values, strict=True):
                out[key + suffix] = value
        return out

    @model_validator(mode="after")
    def _counted(self) -> LevelResult:
        if self.sent != self.completed + self.failed:
            raise ValueError(f"{self.label}: {self.sent} requests sent, but {self.completed} "
                             f"completed and {self.failed} failed: every request sent is one "
                             "or the other")
        return self

    @model_validator(mode="before")
    @classmethod
    def _unflatten(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sent" not in data and "completed" in data:
            # written before requests sent were recorded: every request was one or the other
            data = {**data, "sent": int(data["completed"]) + int(data.get("failed") or 0)}
        if isinstance(data, dict) and "ci" not in data and any(
                isinstance(k, str) and k.endswith("_ci_low") for k in data):
            data = dict(data)
            ci: dict[str, list[Any]] = {}
            for key in [k for k in data if isinstance(k, str)]:
                for i, suffix in enumerate(CI_SUFFIXES):
                    if key.endswith(suffix):
                        ci.setdefault(key[: -len(suffix)], [None, None, None])[i] = data.pop(key)
                        break
            data["ci"] = {k: tuple(v) for k, v in ci.items()}
        if isinstance(data, dict) and "ttft_ms" not in data and "mean_ttft_ms" in data:
            data = dict(data)
            for metric in LATENCY_METRICS:
                data[f"{metric}_ms"] = Stats.from_flat(data, metric)
                for key in (*Stats().flat(metric), f"count_{metric}"):
                    data.pop(key, None)
        return data


class BenchResult(_Frozen):
    """One run of the client: its metadata and one :class:`LevelResult` per level, in order."""

    tool: str = "cleanslate bench"
    bench_id: str | None = Field(default=None, description="its id in the store (`cleanslate "
                                 "runs`, `report BENCH_ID`); None: not recorded (--no-store)")
    run_id: str | None = Field(default=None, description="the recorded run it measured "
                               "(bench --run); None: a bare --url")
    version: str
    started_at: str
    finished_at: str
    url: str
    model: str
    endpoint: Endpoint
    backend: str = Field(description="vLLM-style backend name: openai or openai-chat")
    workload: WorkloadSpec
    seed: int
    tokenizer: str | None
    slo: SLO
    warmup: int
    num_prompts: int | None
    duration_s: float | None
    levels: tuple[LevelResult, ...]
    partial: bool
    client_cpu_s: float
    client_wall_s: float
    warnings: tuple[str, ...] = ()
    max_repeats: int = Field(default=1, description="the most measurements of each level "
                             "(BenchConfig.max_repeats); each level's n_repeats says how many")
    target_ci_pct: float | None = None
    max_error_rate: float = 0.01
    limits: dict[str, float] = Field(default_factory=dict)
    observe: ObserveOptions | None = Field(
        default=None, description="what watched each level (None: a result from before "
        "levels were observed)")
    trace: TraceInfo | None = Field(
        default=None, description="a trace workload's file, format, column mapping and "
        "selection")
    server_config: ServerConfig | None = Field(
        default=None, description="the configuration the server said it runs with, read "
        "once before the first level, and how it differs from the flags asked (None: not "
        "read: --no-observe, or a result from before it was)")
    ended_early: str | None = Field(
        default=None, description="why the bench ended at its last level, whether or not "
        "more were asked: the server crashed (that level's crash), or every request of the "
        "level failed for one cause, with the fix as options to give (None: neither)")

    @property
    def failed(self) -> bool:
        """True when no level was measured, or any level ended early, had a failed request,
        broke its output or is not a result (no request completed, too many failed)."""
        return (self.partial or not self.levels
                or any(lv.failed > 0 or lv.bad_output or not lv.valid for lv in self.levels))


#: Numeric fields that describe how a level was measured, not what: no objective names them.
_NOT_METRICS = frozenset({"seed", "n_repeats"})


def _level_metrics() -> frozenset[str]:
    numeric = (int, float, int | None, float | None)
    keys = {name for name, f in LevelResult.model_fields.items()
            if f.annotation in numeric and name not in _NOT_METRICS}
    for metric in LATENCY_METRICS:
        keys.update(Stats().flat(metric))
        keys.add(f"count_{metric}")
    return frozenset(keys)


#: The numeric keys of a serialized :class:`LevelResult`: what a study's objective may name
#: (``output_throughput``, ``request_goodput``, ``p99_ttft_ms``, ``mean_e2el_ms`` ...).
LEVEL_METRICS: frozenset[str] = _level_metrics()
