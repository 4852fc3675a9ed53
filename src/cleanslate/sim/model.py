"""The performance model of the simulated engine (see ``docs/sim-model.md``).

The simulated engine behaves like an SGLang server running a 70B-class dense model in FP8 on
H200-sized GPUs, with every time scaled so that a benchmark finishes in seconds. Everything here
is a pure function of :class:`SimSettings`; the scheduler (:mod:`cleanslate.sim.engine`) asks
this module how long each step takes and how much simulated memory each worker holds.

Units: memory in MiB (per GPU unless the name says otherwise), times in seconds (the constants
are written in milliseconds and converted), lengths in tokens.

This module is imported by the workers, so it uses the standard library only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, cast

#: The default simulated GPU: an H200 (``nvidia-smi`` reports 143771 MiB).
DEFAULT_GPU_MIB = 143_771

# --- memory (MiB) ----------------------------------------------------------------------------
WEIGHTS_MIB = 80_000.0  # whole model; each TP rank holds WEIGHTS_MIB / tp
KV_MIB_PER_TOKEN = 0.3125  # whole model (80 layers x 8 KV heads x 128 x 2 x 2 bytes); / tp
CONTEXT_MIB = 1024.0  # CUDA context + allocator state, outside the static pool
REQ_TABLE_BYTES_PER_TOKEN = 4  # request-to-token table: one int32 per slot and context token
ACT_MIB_PER_CHUNK_TOKEN = 0.25  # prefill activations per chunk token, outside the pool; / tp
GRAPH_BASE_MIB = 1024.0  # CUDA graph memory pool, outside the static pool ...
GRAPH_MIB_PER_BS = 8.0  # ... plus this per captured batch size up to `cuda-graph-max-bs`
RUNTIME_RESERVE_FRACTION = 0.035  # NCCL buffers, fragmentation: share of the GPU kept free

# --- time (milliseconds) ---------------------------------------------------------------------
LAUNCH_GRAPH_MS = 1.5  # per-step launch overhead when the decode batch replays a CUDA graph
LAUNCH_EAGER_MS = 9.0  # per-step launch overhead without CUDA graphs (Python kernel launches)
DECODE_BASE_MS = 14.0  # reading the weights once per step; / tp
DECODE_PER_SEQ_MS = 0.08  # per sequence in the batch; / tp
DECODE_PER_KTOK_MS = 0.07  # per 1,000 tokens of context (KV reads); / tp
PREFILL_BASE_MS = 10.0  # per prefill step (eager, never a graph); / tp
PREFILL_PER_TOKEN_MS = 0.025  # per prompt token in the chunk; / tp
ALLREDUCE_MS = 0.6  # per step and per doubling of tp (0 at tp 1)
MAX_SM_CLOCK_MHZ = 1980  # the simulated GPU's largest SM clock (an H200's); throttle-clock runs
#                          it lower and every step takes MAX_SM_CLOCK_MHZ / MHZ as long
STEP_NOISE_SIGMA = 0.03  # log-normal noise of each step (averages out over a level)
RUN_NOISE_SIGMA = 0.024  # log-normal factor drawn once per start (H200: 2.4 % between restarts)
DRIFT_SIGMA = 0.025  # log-normal drift inside one server (H200: 2.0-4.3 % run to run) ...
DRIFT_TAU_S = 10.0  # ... with this correlation time, in unscaled simulated seconds
COLD_PREFILL = 1.6  # prefill steps right after a start take this much longer (H200: TTFT of
COLD_DECODE = 1.05  # the first run 370-529 ms against 230-310 ms), decode steps this, ...
COLD_STEPS = 600  # ... both decaying linearly to 1 over this many steps

# --- scheduling (SGLang's defaults) -----------------------------------------------------------
INIT_NEW_TOKEN_RATIO = 0.7  # share of a request's remaining max_tokens guessed at admission ...
MIN_NEW_TOKEN_RATIO = 0.098  # ... decaying to this (0.7 x 0.14) ...
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # ... over this many decode steps
CLIP_MAX_NEW_TOKENS = 4096  # the guess counts at most this many remaining tokens
RETRACT_DECODE_STEPS = 20  # a retraction frees room for this many decode steps of the batch

#: The memory fraction above which start-up fails depends on CUDA graphs and the prefill chunk
#: (both live outside the static pool): for the default settings about 0.928 with CUDA graphs
#: and 0.944 without them (see :meth:`SimModel.memory_plan`).

class SteadyWorkload(TypedDict):
    """The workload :func:`steady_value` scores a configuration under: prompts of
    ``input_len`` tokens asking for ``output_len`` tokens (``kind`` as a study file names it)."""

    kind: str
    input_len: int
    output_len: int


#: The default search space of the quick start (flag -> values, SGLang spelling), meant with
#: :data:`QUICKSTART_FIXED`, :data:`QUICKSTART_WORKLOAD`, :data:`QUICKSTART_CONCURRENCY` and
#: :data:`QUICKSTART_TTFT_SLO_S` (:func:`steady_value` scores it). Its best configuration
#: (0.88, CUDA graphs on, 128 or more running, chunk 16384) needs several factors at once: more
#: memory for the KV cache means a larger batch, until 0.92 with that chunk's activations and
#: the graphs does not start; CUDA graphs speed every decode step; a larger chunk pays fewer
#: fixed prefill costs; 64 running requests cap the batch; and with CUDA graphs, a decode batch
#: above ``cuda-graph-max-bs`` (128) crashes at concurrency 256 but not at 128.
QUICKSTART_SPACE: dict[str, list[float] | list[bool] | list[int]] = {
    "mem-fraction-static": [0.80, 0.85, 0.88, 0.92, 0.95],
    "disable-cuda-graph": [True, False],
    "max-running-requests": [64, 128, 256, 512],
    "chunked-prefill-size": [1024, 4096, 16384],
}

#: The fixed flags and workload the quick-start space is meant for.
QUICKSTART_FIXED: dict[str, int] = {"tp-size": 1, "cuda-graph-max-bs": 128}
QUICKSTART_WORKLOAD: SteadyWorkload = {"kind": "random", "input_len": 1024, "output_len": 128}
QUICKSTART_CONCURRENCY: list[int] = [32, 128, 256]
#: The latency bound the quick-start surface is judged under: mean TTFT, seconds.
QUICKSTART_TTFT_SLO_S = 8.0


@dataclass(frozen=True)
class SimSettings:
    """The flags of ``cleanslate sim serve`` that the model reads (SGLang names, snake case)."""

    tp_size: int = 1
    mem_fraction_static: float = 0.88
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 160
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    context_length: int = 32768
    disable_radix_cache: bool = False
    gpu_memory_mib: int = DEFAULT_GPU_MIB
    time_scale: float = 1.0
    seed: int = 0
    noise_seed: int | None = None
    run_marker: str | None = None
    host_noise: float = 0.0
    cold_start: float = COLD_PREFILL
    cold_start_decode: float = COLD_DECODE
    cold_start_steps: int = COLD_STEPS
    drift: float = DRIFT_SIGMA

    def to_dict(self) -> SettingsDict:
        """The settings as a dict of their fields (a copy)."""
        return cast(SettingsDict, dict(self.__dict__))


class SettingsDict(TypedDict):
    """:class:`SimSettings` as a dict (:meth:`SimSettings.to_dict`): one key per field."""

    tp_size: int
    mem_fraction_static: float
    disable_cuda_graph: bool
    cuda_graph_max_bs: int
    max_running_requests: int
    chunked_prefill_size: int
    context_length: int
    disable_radix_cache: bool
    gpu_memory_mib: int
    time_scale: float
    seed: int
    noise_seed: int | None
    run_marker: str | None
    host_noise: float
    cold_start: float
    cold_start_decode: float
    cold_start_steps: int
    drift: float


@dataclass(frozen=True)
class MemoryPlan:
    """What one TP rank allocates, in MiB of its GPU."""

    context_mib: float
    weights_mib: float
    static_pool_mib: float
    kv_cache_mib: float
    graph_mib: float
    total_mib: float
    available_mib: float
    kv_capacity_tokens: int
    oom_at_start: bool
    not_enough_for_kv: bool
    fields: dict[str, float] = field(default_factory=dict)


def noise_source(settings: SimSettings) -> tuple[str, int | str]:
    """Where a start's noise (its run factor, drift and step noise) is drawn from: ``--noise-seed``
    when given, else the run's marker (``CLEANSLATE_RUN``: every start of a study differs),
    else ``--seed``. Returns ``(what, seed)``."""
    if settings.noise_seed is not None:
        return "noise-seed", settings.noise_seed
    if settings.run_marker:
        return "run marker", "run:" + settings.run_marker
    return "seed", settings.seed


def host_factor(sigma: float, host_key: str) -> float:
    """The per-host (per-slot) factor on step times: ``exp(N(0, sigma))`` drawn from
    ``host_key`` (the host name and the GPU ids the server was given), so two slots of one
    machine differ and one slot stays the same from start to start; 1 when ``sigma`` is 0."""
    if sigma <= 0:
        return 1.0
    return math.exp(random.Random("host:" + host_key).gauss(0.0, sigma))


class SimModel:
    """Step times and memory of one simulated server. See ``docs/sim-model.md``."""

    def __init__(self, settings: SimSettings) -> None:
        self.s = settings
        self.noise_from, source = noise_source(settings)
        self._rng = random.Random(source)
        self.run_factor = math.exp(self._rng.gauss(0.0, RUN_NOISE_SIGMA))
        self.host_factor = 1.0
        self.host_key = ""
        self.steps = 0
        self._drift = self._rng.gauss(0.0, settings.drift) if settings.drift > 0 else 0.0

    def set_host(self, host_key: str) -> None:
        """Draw the host factor (``--host-noise``) from ``host_key``."""
        self.host_key = host_key
        self.host_factor = host_factor(self.s.host_noise, host_key)

    def cold_factor(self, prefill: bool, step: int | None = None) -> float:
        """The cold-start slowdown of step number ``step`` (this server's next one when
        ``None``) since the engine started: ``--cold-start`` or ``--cold-start-decode`` at the
        first step, decaying linearly to 1 at ``--cold-start-steps``."""
        k = self.steps if step is None else step
        n = self.s.cold_start_steps
        peak = self.s.cold_start if prefill else self.s.cold_start_decode
        if n <= 0 or k >= n:
            return 1.0
        return 1.0 + (peak - 1.0) * (1.0 - k / n)

    def drift_factor(self) -> float:
        """The slow drift's current factor (``exp`` of an Ornstein-Uhlenbeck process)."""
        return math.exp(self._drift)

    # --- memory ---------------------------------------------------------------------------
    def chunk_tokens(self) -> int:
        """The prefill chunk; ``-1`` or ``0`` (chunking off) means the whole context length."""
        c = self.s.chunked_prefill_size
        return self.s.context_length if c <= 0 else c

    def captured_bs(self) -> int:
        """The largest batch captured in a CUDA graph: ``cuda-graph-max-bs``, but never more
        than ``max-running-requests`` (SGLang captures no batch its request pool cannot hold);
        0 with ``disable-cuda-graph``."""
        if self.s.disable_cuda_graph:
            return 0
        return max(1, min(self.s.cuda_graph_max_bs, self.s.max_running_requests))

    def graph_mib(self) -> float:
        """CUDA graph memory per GPU (0 with ``disable-cuda-graph``)."""
        if self.s.disable_cuda_graph:
            return 0.0
        return GRAPH_BASE_MIB + GRAPH_MIB_PER_BS * self.captured_bs()

    def workspace_mib(self) -> float:
        """Prefill activations for one full chunk, per GPU. They are allocated outside the
        static pool (as SGLang's are), so a large chunk at a large memory fraction runs out of
        memory; the sim reserves them at start (SGLang would fail at the first large prefill)."""
        return ACT_MIB_PER_CHUNK_TOKEN * self.chunk_tokens() / max(1, self.s.tp_size)

    def memory_plan(self) -> MemoryPlan:
        s = self.s
        tp = max(1, s.tp_size)
        total = float(s.gpu_memory_mib)
        static = s.mem_fraction_static * total
        weights = WEIGHTS_MIB / tp
        slots = (REQ_TABLE_BYTES_PER_TOKEN * s.max_running_requests * s.context_length
                 / (1024 * 1024))
        kv = static - weights - slots
        act = self.workspace_mib()
        graph = self.graph_mib()
        reserve = RUNTIME_RESERVE_FRACTION * total
        needed = static + CONTEXT_MIB + act + graph + reserve
        kv_tokens = int(kv / (KV_MIB_PER_TOKEN / tp)) if kv > 0 else 0
        return MemoryPlan(
            context_mib=CONTEXT_MIB,
            weights_mib=weights,
            static_pool_mib=static,
            kv_cache_mib=max(0.0, kv),
            graph_mib=graph,
            total_mib=CONTEXT_MIB + static + act + graph,
            available_mib=total,
            kv_capacity_tokens=kv_tokens,
            oom_at_start=needed > total,
            not_enough_for_kv=kv <= 0,
            fields={"slots_mib": slots, "activation_mib": act, "reserve_mib": reserve},
        )

    # --- time -----------------------------------------------------------------------------
    def uses_graph(self, batch: int) -> bool:
        return not self.s.disable_cuda_graph and batch <= self.s.cuda_graph_max_bs

    def crashes_at_batch(self, batch: int) -> bool:
        """The natural crash: with CUDA graphs on, a decode batch larger than
        ``cuda-graph-max-bs`` falls back to the eager attention path, whose (simulated) metadata
        bug raises ``AttributeError``. Fixes: ``--disable-cuda-graph``, a larger
        ``--cuda-graph-max-bs``, or a smaller ``--max-running-requests``."""
        return not self.s.disable_cuda_graph and batch > self.s.cuda_graph_max_bs

    def _allreduce_ms(self) -> float:
        tp = max(1, self.s.tp_size)
        return ALLREDUCE_MS * math.log2(tp) if tp > 1 else 0.0

    def decode_step_ms(self, batch: int, context_tokens: int) -> float:
        """Noise-free duration of one decode step of ``batch`` sequences holding
        ``context_tokens`` tokens of KV cache in total (milliseconds, before time scaling)."""
        tp = max(1, self.s.tp_size)
        launch = LAUNCH_GRAPH_MS if self.uses_graph(batch) else LAUNCH_EAGER_MS
        work = (
            DECODE_BASE_MS + DECODE_PER_SEQ_MS * batch + DECODE_PER_KTOK_MS * context_tokens / 1000
        )
        return launch + work / tp + self._allreduce_ms()

    def prefill_step_ms(self, tokens: int) -> float:
        """Noise-free duration of one prefill step over ``tokens`` prompt tokens (ms)."""
        tp = max(1, self.s.tp_size)
        work = PREFILL_BASE_MS + PREFILL_PER_TOKEN_MS * tokens
        return LAUNCH_EAGER_MS + work / tp + self._allreduce_ms()

    def noisy_seconds(self, ms: float, prefill: bool = False) -> float:
        """A step's wall duration: ms -> s, times the run and host factors, the cold start,
        the drift, step noise and the time scale (the step is counted)."""
        noise = math.exp(self._rng.gauss(0.0, STEP_NOISE_SIGMA))
        cold = self.cold_factor(prefill)
        self.steps += 1
        factor = self.run_factor * self.host_factor * cold * math.exp(self._drift) * noise
        sigma = self.s.drift
        if sigma > 0:
            # One Ornstein-Uhlenbeck step over this step's unscaled duration.
            rho = math.exp(-ms / 1000.0 / DRIFT_TAU_S)
            self._drift = (rho * self._drift
                           + sigma * math.sqrt(1 - rho * rho) * self._rng.gauss(0.0, 1.0))
        return ms / 1000.0 * factor * self.s.time_scale

    # --- steady-state estimate (for docs and tests; the running sim is the truth) ----------
    def batch_limit(self, input_len: int, output_len: int) -> int:
        """Most requests of this shape that can run at once: the smaller of
        ``max-running-requests`` and the KV capacity over (prompt + output) tokens."""
        plan = self.memory_plan()
        per_req = input_len + output_len
        return max(0, min(self.s.max_running_requests, plan.kv_capacity_tokens // per_req))

    def estimate(self, concurrency: int, input_len: int, output_len: int) -> dict[str, float]:
        """A closed-loop steady-state estimate: output tokens/s and mean TTFT (s)."""
        plan = self.memory_plan()
        if plan.oom_at_start or plan.not_enough_for_kv:
            return {"output_throughput": 0.0, "ttft_s": math.inf, "batch": 0}
        b = min(concurrency, self.batch_limit(input_len, output_len))
        if b <= 0:
            return {"output_throughput": 0.0, "ttft_s": math.inf, "batch": 0}
        ctx = b * (input_len + output_len / 2)
        decode_s = self.decode_step_ms(b, int(ctx)) / 1000 * self.s.time_scale
        # Each prompt pays its tokens plus a share of a step's fixed cost: up to `chunk`
        # tokens of prompts go into one prefill step (an optimistic packing).
        chunk = self.chunk_tokens()
        per_step = max(1.0, chunk / max(1, input_len))
        fixed_ms = self.prefill_step_ms(0)
        per_req_ms = fixed_ms * max(1.0, input_len / chunk) / per_step + (
            PREFILL_PER_TOKEN_MS * input_len / max(1, self.s.tp_size)
        )
        prefill_s = per_req_ms / 1000 * self.s.time_scale
        # b requests finish every output_len decode steps; their prompts are prefilled in
        # batches of up to `chunk` tokens.
        cycle_s = output_len * decode_s + prefill_s * b
        throughput = b * output_len / cycle_s
        # Prefill comes first, so a finished batch's successors arrive together and are
        # prefilled one after another: on average a request waits for half of them.
        waiting = max(0, concurrency - b)
        ttft = prefill_s * (b + 1) / 2 + waiting * cycle_s / b
        return {"output_throughput": throughput, "ttft_s": ttft, "batch": float(b)}


#: The size of the sim's request pool when ``--max-running-requests`` is not given: the most
#: requests that can run at once (SGLang sizes its pool from the KV capacity and the context
#: length, 2048 to 4096 requests; the sim keeps the 256 it has always had).
REQUEST_POOL_SIZE = 256


def auto_max_running_requests(settings: SimSettings) -> int:
    """The batch limit the sim chooses when ``--max-running-requests`` is not given, by
    SGLang's rule: half the KV cache's tokens, at most the request pool
    (:data:`REQUEST_POOL_SIZE`), at least 1. The KV cache is sized with the pool's request
    table (``settings.max_running_requests`` is ignored)."""
    plan = SimModel(replace(settings, max_running_requests=REQUEST_POOL_SIZE)).memory_plan()
    return max(1, min(REQUEST_POOL_SIZE, plan.kv_capacity_tokens // 2))


def settings_from_flags(flags: Mapping[str, object]) -> SimSettings:
    """Build settings from SGLang-spelled flags (``mem-fraction-static`` ...); unknown keys are
    ignored here (the CLI validates them)."""
    kw: dict[str, Any] = {}  # the flags' values as given: the dataclass does not convert
    for key, value in flags.items():
        name = key.lstrip("-").replace("-", "_")
        if name in SimSettings.__dataclass_fields__:
            kw[name] = value
    return SimSettings(**kw)


def steady_value(flags: Mapping[str, object], concurrency: list[int] | None = None,
                 ttft_slo_s: float = QUICKSTART_TTFT_SLO_S,
                 workload: SteadyWorkload | None = None) -> float | None:
    """What a study's trial of these flags would score, from the steady-state estimate: the
    output tokens/s of its best level, the levels climbing in ascending order and stopping at
    the first crash (CUDA graphs above ``cuda-graph-max-bs``) or mean TTFT above the SLO, as
    ``cleanslate tune`` does. ``None`` when the server does not start or no level passes.
    Defaults: the quick-start levels, SLO and workload (flags are added to
    :data:`QUICKSTART_FIXED` by the caller when meant)."""
    model = SimModel(settings_from_flags(flags))
    plan = model.memory_plan()
    if plan.oom_at_start or plan.not_enough_for_kv:
        return None
    work = workload or QUICKSTART_WORKLOAD
    best: float | None = None
    for level in sorted(concurrency or QUICKSTART_CONCURRENCY):
        est = model.estimate(level, int(work["input_len"]), int(work["output_len"]))
        if est["batch"] <= 0 or model.crashes_at_batch(int(est["batch"])):
            break
        if est["ttft_s"] > ttft_slo_s:
            break
        best = est["output_throughput"] if best is None else max(best, est["output_throughput"])
    return best


# --- capacity under an SLO: the true boundary ---------------------------------------------------
#: The SLO statistics :func:`true_capacity` knows the truth of (see its docstring for why these).
TRUE_CAPACITY_KEYS = ("median_itl_ms", "p50_itl_ms")


def median_itl_ms(model: SimModel, concurrency: int, input_len: int, output_len: int) -> float:
    """The median inter-token latency (ms, wall clock) of a warm closed loop of ``concurrency``
    clients sending prompts of ``input_len`` tokens for ``output_len`` tokens each (fixed
    lengths, ``ignore_eos``) to the server ``model`` describes.

    Most gaps between two tokens of a stream are one decode step of the whole running batch; a
    gap that holds a prefill step (another request's prompt, or the rest of its own) is longer.
    While fewer than half of the gaps hold one, the median gap is a decode step: of ``b =
    min(concurrency, batch limit)`` sequences holding ``b x (input_len + output_len / 2)``
    tokens of KV on average (each running request holds its prompt and the 1 to
    ``output_len - 1`` tokens it generated), :meth:`SimModel.decode_step_ms` of that, times the
    server's run factor (logged at its start), its host factor and the time scale. The step
    noise has median 1; the drift (``--drift``) and the cold start (``--cold-start-decode``,
    over the first ``--cold-start-steps`` steps) are left out: with the drift on, the measured
    median moves by its factor (sd 2.5 % by default)."""
    batch = max(1, min(concurrency, model.batch_limit(input_len, output_len) or concurrency))
    context = int(batch * (input_len + output_len / 2))
    ms = model.decode_step_ms(batch, context)
    return ms * model.run_factor * model.host_factor * model.s.time_scale


def true_capacity(model: SimModel, limit_ms: float, input_len: int, output_len: int, *,
                  key: str = "median_itl_ms", max_concurrency: int = 4096) -> int:
    """The true boundary of a sim configuration under one SLO: the most closed-loop concurrency
    (1 to ``max_concurrency``) whose ``key`` statistic stays within ``limit_ms``, for a
    workload of fixed lengths (``range_ratio`` 0, ``ignore_eos``); 0 when not even one client
    does. A concurrency at which the server crashes (CUDA graphs on and a batch above
    ``cuda-graph-max-bs``) never passes, so the boundary stops below it.

    ``key`` is the median ITL (``median_itl_ms`` / ``p50_itl_ms``), computed by
    :func:`median_itl_ms`: it grows with the batch until the batch limit (clients beyond it
    queue, and a queued request's gaps are the batch's), so a limit met at the batch limit is
    met at every concurrency and the answer is ``max_concurrency``. Why not a TPOT percentile:
    a request's TPOT holds every prefill step that ran between its first and last token, and
    how many there are depends on how the clients' re-sent requests straggle in (each group
    that arrives after a prefill step began pays the step's fixed cost again), which the
    client's machine sets, not the model (``docs/sim-model.md``, "Capacity under an SLO").

    ``model``: the server's own :class:`SimModel` (its settings and noise source give the
    run factor it logs); the boundary is computed by scanning concurrencies upwards."""
    if key not in TRUE_CAPACITY_KEYS:
        raise ValueError(f"{key}: the sim's true boundary is known for "
                         f"{', '.join(TRUE_CAPACITY_KEYS)}")
    plan = model.memory_plan()
    if plan.oom_at_start or plan.not_enough_for_kv or input_len + output_len > (
            plan.kv_capacity_tokens):
        return 0
    limit = model.batch_limit(input_len, output_len) or 1
    best = 0
    for c in range(1, max_concurrency + 1):
        batch = min(c, limit)
        if model.crashes_at_batch(batch):
            break
        if median_itl_ms(model, c, input_len, output_len) > limit_ms:
            break
        best = c
        if c >= limit:  # the batch no longer grows: every higher concurrency is the same
            return max_concurrency
    return best


# --- the constraint that binds: known truth for bottleneck verdicts -----------------------------
#: The verdicts :func:`binding_constraint` gives: a subset of ``cleanslate.bench``'s
#: ``BottleneckKind``, spelled the same (this room may not import the bench's).
TruthKind = Literal["offered_load", "running_cap", "kv_capacity", "compute", "throttled",
                    "crashed", "errors"]

#: The decode batch saturates the step-time model when one more sequence adds less than this
#: share of what an average sequence of the batch contributes to throughput (the throughput's
#: elasticity in the batch: at 0.5 doubling the batch adds at most ~41 % more tokens/s).
SATURATION_GAIN = 0.5
#: A concurrency within this share of a limit (either side), or a marginal gain within this of
#: :data:`SATURATION_GAIN`, is *borderline*: the noise, the optimistic admission or the
#: closed loop's straggling may put a level on either side, so a test should not rely on it.
BORDERLINE_SHARE = 0.15


@dataclass(frozen=True)
class Binding:
    """What :func:`binding_constraint` found: ``verdict`` (the constraint that binds),
    ``reason`` (one printable sentence with the figures), ``beneath`` (under a throttle, what
    would bind at full clock; else the verdict again) and ``borderline`` (a reason when the
    cell sits near a boundary, else ``None``). Figures: ``batch`` (requests running at once,
    expected), ``running_cap`` (``max-running-requests`` in effect), ``kv_limit`` (requests of
    the workload's full length the KV cache holds), ``kv_admit_limit`` (the most the optimistic
    admission takes before retracting), ``graph_max_bs`` (0 with CUDA graphs off),
    ``saturation_batch`` (the smallest batch whose marginal gain is below
    :data:`SATURATION_GAIN`), ``marginal_gain`` (at ``batch``)."""

    verdict: TruthKind
    reason: str
    beneath: TruthKind
    borderline: str | None
    batch: int
    running_cap: int
    kv_limit: int
    kv_admit_limit: int
    graph_max_bs: int
    saturation_batch: int
    marginal_gain: float


def _uncached_prefill_ms(model: SimModel, input_len: int, prefix_share: float) -> float:
    """Prefill milliseconds one request costs in a steady closed loop: its uncached prompt
    tokens, plus its share of a prefill step's fixed cost when up to a chunk of prompts share a
    step (the packing :meth:`SimModel.estimate` assumes)."""
    n = max(1.0, input_len * (1.0 - prefix_share))
    chunk = model.chunk_tokens()
    per_step = max(1.0, chunk / n)
    fixed_ms = model.prefill_step_ms(0)
    return fixed_ms * max(1.0, n / chunk) / per_step + (
        PREFILL_PER_TOKEN_MS * n / max(1, model.s.tp_size))


def cycle_throughput(model: SimModel, batch: int, input_len: int, output_len: int,
                     prefix_share: float = 0.0) -> float:
    """Noise-free output tokens per millisecond of a closed loop holding ``batch`` requests
    running: each request decodes ``output_len`` steps of :meth:`SimModel.decode_step_ms`
    (the batch holding ``batch x (input_len + output_len / 2)`` tokens of KV) and its
    uncached prompt is prefilled once (prefill steps stall every decode)."""
    if batch <= 0:
        return 0.0
    decode = model.decode_step_ms(batch, int(batch * (input_len + output_len / 2)))
    prefill = _uncached_prefill_ms(model, input_len, prefix_share)
    return batch * output_len / (output_len * decode + batch * prefill)


def marginal_gain(model: SimModel, batch: int, input_len: int, output_len: int,
                  prefix_share: float = 0.0) -> float:
    """What one more running sequence adds to :func:`cycle_throughput`, as a share of what an
    average sequence of ``batch`` contributes: ``(T(b+1) - T(b)) / (T(b) / b)``; 1 while the
    step's fixed cost dominates, falling towards 0 as per-sequence work (KV reads, the
    per-sequence term, prefill) fills the step. CUDA graphs are assumed to hold at ``b + 1``
    where they hold at ``b`` (the eager step beyond ``cuda-graph-max-bs`` is a crash)."""
    b = max(1, batch)
    t0 = cycle_throughput(model, b, input_len, output_len, prefix_share)
    plain = replace(model.s, cuda_graph_max_bs=max(model.s.cuda_graph_max_bs, b + 1))
    t1 = cycle_throughput(SimModel(plain) if model.uses_graph(b) else model, b + 1,
                          input_len, output_len, prefix_share)
    return (t1 - t0) / (t0 / b) if t0 > 0 else 0.0


def binding_constraint(settings: SimSettings, input_len: int, output_len: int,
                       concurrency: int, *, prefix_share: float = 0.0,
                       throttle_mhz: int | None = None) -> Binding:
    """The constraint that binds a closed loop of ``concurrency`` clients sending prompts of
    ``input_len`` tokens (``prefix_share`` of them a prefix the cache holds) for
    ``output_len`` tokens each (fixed lengths, ``ignore_eos``) to the sim started with
    ``settings`` (``max_running_requests`` as in effect: :func:`auto_max_running_requests`
    when the flag is not given) and the ``throttle-clock`` fault at ``throttle_mhz``.

    The first rule that holds decides (``docs/sim-model.md``, "Known truth"):

    1. ``crashed``: the server does not start (the memory plan's OOM or no room for KV), or
       with CUDA graphs on the running batch ``min(c, cap, KV admission limit)`` exceeds
       ``cuda-graph-max-bs`` (:meth:`SimModel.crashes_at_batch`).
    2. ``errors``: a request is longer than the context or than the whole KV cache (400).
    3. ``throttled``: the throttle fault is on (every step 1980/MHz times longer, whatever
       else binds: ``beneath`` says what that is).
    4. ``running_cap``: ``c`` exceeds ``max-running-requests`` and the KV cache holds at least
       that many full-length requests: the rest wait behind the cap.
    5. ``kv_capacity``: ``c`` exceeds the KV limit, ``kv_capacity_tokens // (input_len +
       output_len)`` (and it is below the cap): the rest wait for memory, with retractions.
    6. ``compute``: every request runs (``c`` at or below both limits) and the step-time
       model is saturated: :func:`marginal_gain` at ``b = c`` is below
       :data:`SATURATION_GAIN`.
    7. ``offered_load``: every request runs and one more would still add throughput: the
       server takes all it is sent.

    ``borderline`` names the reason when ``c`` lies within :data:`BORDERLINE_SHARE` of the
    limit that decides (``c`` in ``(limit / 1.15, limit x 1.15]``), the cap lies between the
    KV limit and the optimistic admission's limit (``kv_capacity_tokens // (input_len +
    0.098 x output_len)``: both bind in turn), ``cuda-graph-max-bs`` lies in that same range
    (a crash depends on how far admission overshoots), or the marginal gain is within 0.15 of
    the threshold."""
    model = SimModel(settings)
    plan = model.memory_plan()
    cap = max(1, settings.max_running_requests)
    per_req = input_len + output_len
    kv_tokens = plan.kv_capacity_tokens
    kv_limit = kv_tokens // per_req if per_req > 0 else 0
    admit = int(kv_tokens // max(1.0, input_len + MIN_NEW_TOKEN_RATIO * output_len))
    graph_bs = 0 if settings.disable_cuda_graph else settings.cuda_graph_max_bs
    c = max(1, concurrency)
    batch = min(c, cap, max(kv_limit, 1))

    def gain(b: int) -> float:
        return marginal_gain(model, b, input_len, output_len, prefix_share)

    saturation = next((b for b in range(1, 4097) if gain(b) < SATURATION_GAIN), 4097)
    g = gain(batch)

    def make(verdict: TruthKind, reason: str, border: str | None = None,
             beneath: TruthKind | None = None, at: int = batch) -> Binding:
        return Binding(verdict=verdict, reason=reason, beneath=beneath or verdict,
                       borderline=border, batch=at, running_cap=cap, kv_limit=kv_limit,
                       kv_admit_limit=admit, graph_max_bs=graph_bs,
                       saturation_batch=saturation, marginal_gain=g)

    def near(x: float, limit: float) -> bool:
        return limit / (1 + BORDERLINE_SHARE) < x <= limit * (1 + BORDERLINE_SHARE)

    if plan.oom_at_start or plan.not_enough_for_kv:
        why = ("out of memory at start" if plan.oom_at_start
               else "no room for the KV cache in the static pool")
        return make("crashed", f"the server does not start: {why}", at=0)
    if per_req > settings.context_length or per_req > kv_tokens:
        return make("errors", f"a request of {per_req} tokens exceeds the context "
                    f"({settings.context_length}) or the KV cache ({kv_tokens} tokens)", at=0)
    reached = min(c, cap, max(admit, 1))
    if model.crashes_at_batch(reached):
        return make("crashed", f"a decode batch of {reached} exceeds cuda-graph-max-bs "
                    f"{graph_bs} with CUDA graphs on",
                    "the admission's overshoot past the KV limit decides the crash"
                    if min(c, cap, kv_limit) <= graph_bs else None, at=reached)

    verdict: TruthKind
    border: str | None = None
    if c > cap and cap <= kv_limit:
        verdict = "running_cap"
        reason = (f"{c} clients, max-running-requests {cap} (the KV cache holds {kv_limit}): "
                  f"{c - cap} wait behind the cap")
        if near(c, cap):
            border = f"c={c} within {BORDERLINE_SHARE:.0%} of the cap {cap}"
        elif near(kv_limit, cap):
            border = f"the KV limit {kv_limit} within {BORDERLINE_SHARE:.0%} of the cap {cap}"
    elif c > kv_limit:
        verdict = "kv_capacity"
        reason = (f"{c} clients, the KV cache holds {kv_limit} requests of {per_req} tokens "
                  f"({kv_tokens} tokens; cap {cap}): the rest wait for memory")
        if near(c, kv_limit):
            border = f"c={c} within {BORDERLINE_SHARE:.0%} of the KV limit {kv_limit}"
        elif cap <= max(admit, kv_limit * (1 + BORDERLINE_SHARE)):
            border = (f"the cap {cap} lies within {BORDERLINE_SHARE:.0%} of the KV limit "
                      f"{kv_limit} or below the optimistic admission's {admit}: both bind")
    else:
        verdict = "compute" if g < SATURATION_GAIN else "offered_load"
        reason = (f"all {c} clients run (cap {cap}, KV limit {kv_limit}); one more sequence "
                  f"adds {g:.2f} of an average one's throughput (saturated below "
                  f"{SATURATION_GAIN}, from batch {saturation})")
        limit = min(cap, kv_limit)
        if abs(g - SATURATION_GAIN) < BORDERLINE_SHARE:
            border = f"marginal gain {g:.2f} within {BORDERLINE_SHARE} of {SATURATION_GAIN}"
        elif near(c, limit):
            border = f"c={c} within {BORDERLINE_SHARE:.0%} of the limit {limit}"
    if throttle_mhz is not None:
        return make("throttled", f"SM clock held at {throttle_mhz} of {MAX_SM_CLOCK_MHZ} MHz "
                    f"(every step x{MAX_SM_CLOCK_MHZ / throttle_mhz:.2f}); beneath it: "
                    f"{reason}", border, verdict)
    return make(verdict, reason, border)
