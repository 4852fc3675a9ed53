"""The study file: what to tune, how, and what counts as better.

Schema (YAML; ``docs/study.md`` has the full reference)::

    name: glm5-nvfp4
    engine: sglang
    model: /models/GLM-5-NVFP4
    host: ssh://root@10.1.230.175        # default: local
    port: 30000                          # default: the engine's
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    fixed: {tp-size: 8}                  # flags of every trial
    baseline: {mem-fraction-static: 0.85, disable-cuda-graph: true, max-running-requests: 64}
    space:
      mem-fraction-static: [0.85, 0.88, 0.92]          # a list: these values
      disable-cuda-graph: [true, false]
      max-running-requests: {int: [64, 2048], log: true}   # a range (ints or floats)
    strategy: ablation                   # grid | ablation | tpe | random | guided
    # guided: {then: tpe}                # guided only: the rest of the budget to TPE
    workload: {kind: random, input_len: 1024, output_len: 256}
    concurrency: [64, 256, 512]
    requests_per_level: 200              # or duration_s_per_level: 30
    objective: {maximize: output_throughput}
    slo: {ttft_p99_ms: 5000, tpot_p99_ms: 100}
    budget: {trials: 30, hours: 12}
    hosts: [gpu-a, gpu-b]                # a fleet: ssh config names, ssh:// URLs or local
    slots: [{gpus: [0, 1]}, {gpus: [2, 3], port: 30010}]   # per host: one trial each at once
    lease_timeout_s: 60                  # a slot's lease without a heartbeat this long expires

Everything is validated when the file is loaded, before any server starts (``docs/study.md``
lists the caps): the workload, the objective (a numeric key of a benchmark level), the SLO keys,
the levels and the prompts they need, the space (range bounds, ``points``, the number of planned
configurations), every flag value of ``fixed``, ``space`` and ``baseline``, and the sampler's
distributions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from cleanslate.bench import (
    CAPACITY_OBJECTIVES,
    DEFAULT_CLIFF,
    DEFAULT_MAX_EXTENSIONS,
    DEFAULT_MAX_LOAD,
    DEFAULT_MAX_PROBES,
    DEFAULT_START,
    DEFAULT_TOLERANCE,
    LEVEL_METRICS,
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_LEVELS,
    MAX_NUM_PROMPTS,
    MAX_REPLAY_SPEEDUP,
    SLO,
    BenchConfig,
    CapacitySearch,
    CapacitySLO,
    ClosedLoop,
    LevelResult,
    ObserveOptions,
    ReplayLoad,
    check_workload_files,
    workload_from_dict,
)
from cleanslate.config import line_of, read_yaml, validation_error
from cleanslate.engines import engine_class, flag_args
from cleanslate.errors import InputError
from cleanslate.launch.config import ServerFields
from cleanslate.models import Port
from cleanslate.store import level_metric
from cleanslate.tune.factors import (
    MAX_POINTS,
    SAMPLED_STRATEGIES,
    Factor,
    Range,
    Scalar,
    distribution,
)

#: SLO keys: ``<metric>_<stat>_ms`` with metric ttft/tpot/itl/e2e and a vLLM statistic.
_SLO_KEY = re.compile(r"^(ttft|tpot|itl|e2el?)_(mean|median|p50|p90|p95|p99|p99\.9|max)_ms$")

#: A study's name: its identity in the store, a folder under the artifacts
#: (``studies/<name>/``), the Slurm job's name and the ``--study`` of every worker. Letters,
#: digits, ``.``, ``_`` and ``-``, starting with a letter or digit (never ``..``, never an
#: option), at most 100 characters: nothing in it can end a line, leave a folder or need quoting.
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_STUDY_NAME = 100

#: The default warm-up of each server of a study: one request per slot of its first level,
#: within these bounds.
MIN_WARMUP = 8
MAX_WARMUP = 256

#: Factors (flags) in the search space.
MAX_FACTORS = 100
#: Configurations a grid or ablation study plans (each one is a whole verified cycle, minutes
#: to hours: 10,000 is months of GPU time).
MAX_PLANNED = 10_000
#: The longest ``verify_deadline_s`` (a day).
MAX_VERIFY_DEADLINE_S = 86_400.0
#: Hosts of a study, and slots per host (a slot runs one trial at a time).
MAX_HOSTS = 1_000
MAX_SLOTS = 64


def study_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a study (see :data:`STUDY_NAME`); ``None`` when it can."""
    if STUDY_NAME.fullmatch(name) is not None:
        return None
    if not name:
        return "the study's name is empty"
    if len(name) > MAX_STUDY_NAME:
        return f"the study's name has {len(name):,} characters: at most {MAX_STUDY_NAME}"
    bad = next((c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))), None)
    if bad is not None:
        return (f"the study's name holds {bad!r}: a name is letters, digits, '.', '_' and '-' "
                "(it names a folder, a Slurm job and a command-line argument)")
    return f"the study's name starts with {name[0]!r}: it starts with a letter or a digit"


class SlotSpec(BaseModel):
    """One entry of ``slots:``: the GPUs (and optionally the port) of one trial at a time on
    each host. A slot without ``gpus`` takes the study's; without ``port``, the study's port
    (or the engine's default) plus the slot's index."""

    model_config = ConfigDict(extra="forbid")

    gpus: list[int] | None = Field(default=None, min_length=1)
    port: Port | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(g < 0 for g in value):
            raise ValueError("GPU indices are 0 or more")
        return value


@dataclass(frozen=True)
class Slot:
    """Where one trial runs at a time: a host, its GPUs (``None``: all) and a port. ``index``
    is the slot's place in ``slots:`` (the same on every host)."""

    host: str
    gpus: tuple[int, ...] | None
    port: int
    index: int = 0

    @property
    def key(self) -> str:
        """The slot's identity in the store and in reports: ``host/gpus/port``."""
        gpus = ",".join(map(str, self.gpus)) if self.gpus is not None else "all"
        return f"{self.host}/gpus={gpus}/port={self.port}"


def _slot_conflicts(slots: list[SlotSpec], study_gpus: list[int] | None,
                    ports: list[int]) -> str | None:
    """The first conflict between the slots of one host (a GPU named by two slots, two slots on
    one port), as a message naming the key; ``None`` when there is none."""
    seen_gpus: dict[int, int] = {}
    for index, slot in enumerate(slots):
        gpus = slot.gpus if slot.gpus is not None else study_gpus
        if gpus is None and len(slots) > 1:
            return (f"slots[{index}].gpus: a host with several slots needs each slot's GPUs "
                    "(or the study's gpus: for one slot)")
        for gpu in dict.fromkeys(gpus or ()):
            if gpu in seen_gpus:
                return (f"slots[{index}].gpus: GPU {gpu} is also in slots[{seen_gpus[gpu]}]: "
                        "a GPU belongs to one slot of a host")
            seen_gpus[gpu] = index
    seen_ports: dict[int, int] = {}
    for index, port in enumerate(ports):
        if port in seen_ports:
            return (f"slots[{index}].port: port {port} is also the port of "
                    f"slots[{seen_ports[port]}]: give each slot its own port")
        seen_ports[port] = index
    return None




class Objective(BaseModel):
    """``{maximize: METRIC}`` or ``{minimize: METRIC}``, a key of a benchmark level
    (``output_throughput``, ``request_goodput``, ``p99_ttft_ms`` ...). A trial's value is the
    best over its levels that meet the SLOs."""

    model_config = ConfigDict(extra="forbid")

    maximize: str | None = None
    minimize: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Objective:
        if (self.maximize is None) == (self.minimize is None):
            raise ValueError("give exactly one of maximize: METRIC or minimize: METRIC")
        if self.minimize in CAPACITY_OBJECTIVES:
            raise ValueError(f"{self.minimize} is the most load served within the SLOs: it is "
                             f"maximized (objective: {{maximize: {self.minimize}}})")
        if self.metric not in LEVEL_METRICS and self.metric not in CAPACITY_OBJECTIVES:
            raise ValueError(
                f"{self.metric!r} is not a metric of a benchmark level; e.g. "
                "output_throughput, total_token_throughput, request_throughput, "
                "request_goodput, p99_ttft_ms, mean_tpot_ms, p99_e2el_ms (docs/bench.md), "
                "or a capacity: max_concurrency_under_slo, max_goodput (docs/study.md)")
        return self

    @property
    def metric(self) -> str:
        return self.maximize or self.minimize or ""

    @property
    def capacity(self) -> bool:
        """Whether the objective is the answer of a capacity search
        (``max_concurrency_under_slo``, ``max_goodput``), not a level's key."""
        return self.metric in CAPACITY_OBJECTIVES

    @property
    def direction(self) -> Literal["maximize", "minimize"]:
        return "maximize" if self.maximize else "minimize"

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Objective:
        """The objective of a study spec as the store keeps it (the study file's JSON). A spec
        without a valid one (cleanslate never stores such a spec) reads as the default,
        ``maximize: output_throughput``."""
        try:
            return cls.model_validate(spec.get("objective"))
        except ValidationError:
            return cls(maximize="output_throughput")

    def value(self, level: LevelResult) -> float | None:
        """The metric at a level, as a finite number (``None``: not measured)."""
        return level_metric(level, self.metric)

    def best(self, levels: Iterable[LevelResult]) -> LevelResult | None:
        """The level with the best value in this direction (the first of equals); ``None``
        when no level has a value."""
        scored = [(v, lv) for lv in levels if (v := self.value(lv)) is not None]
        if not scored:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(scored, key=lambda pair: pair[0])[1]


class CapacitySpec(BaseModel):
    """``capacity:``, the search a trial runs with a capacity objective (``docs/study.md``,
    "Capacity under an SLO"): double the concurrency from ``start`` while probes pass (up to
    ``max_load``), then bisect to ``tolerance``; a probe passes when the Wilson interval of each
    SLO's attainment (or, with ``attainment``, of the share of requests that met every limit)
    is at or above its target, and one that straddles it is measured again up to
    ``max_extensions`` times, then ``unresolved``. ``cliff``: a fall in output throughput
    between two passing probes beyond this share is reported. Defaults: those of
    ``cleanslate bench --find-max`` (:mod:`cleanslate.bench._capacity`)."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(default=int(DEFAULT_START["concurrency"]), ge=1, le=MAX_CONCURRENCY)
    max_load: int = Field(default=int(DEFAULT_MAX_LOAD["concurrency"]), ge=1,
                          le=MAX_CONCURRENCY)
    tolerance: float = Field(default=DEFAULT_TOLERANCE, gt=0, lt=1)
    attainment: float | None = Field(default=None, gt=0, lt=1)
    max_probes: int = Field(default=DEFAULT_MAX_PROBES, ge=1, le=100)
    max_extensions: int = Field(default=DEFAULT_MAX_EXTENSIONS, ge=0, le=20)
    cliff: float = Field(default=DEFAULT_CLIFF, gt=0, lt=1)

    @model_validator(mode="after")
    def _bounds(self) -> CapacitySpec:
        if self.start > self.max_load:
            raise ValueError(f"start ({self.start}) is above max_load ({self.max_load})")
        return self


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trials: int | None = Field(default=None, ge=1)
    hours: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class Guided(BaseModel):
    """``strategy: guided``'s options: ``then`` is what gets the budget once the binding
    verdict has no step left in the space: ``tpe`` (Optuna's TPE over the flags no rule maps,
    the guided flags held at the incumbent's values) or ``none`` (the study ends there)."""

    model_config = ConfigDict(extra="forbid")

    then: Literal["tpe", "none"] = "none"


class Statistics(BaseModel):
    """How sure a study is of its numbers (``docs/statistics.md``).

    ``replicates``: ``1`` measures each configuration once (single-shot); ``N`` measures each
    ``N`` times (a new server each time, the same seeds for every configuration); ``auto``
    measures each once and races a configuration whose first measurement comes within the noise
    of the incumbent against it, in interleaved pairs, until the pairs' difference is a win, a
    loss or a tie (inside ``tie_margin``) or ``max_replicates`` pairs are used (undecided).
    ``confidence`` is that of every interval; ``max_error_rate`` the share of failed requests
    above which a level is not a throughput result."""

    model_config = ConfigDict(extra="forbid")

    replicates: Literal["auto"] | int = 1
    tie_margin: float = Field(default=0.03, gt=0, lt=0.5)
    confidence: float = Field(default=0.95, ge=0.5, le=0.999)
    max_replicates: int = Field(default=5, ge=2, le=50)
    max_error_rate: float = Field(default=0.01, ge=0, lt=1)

    @field_validator("replicates", mode="before")
    @classmethod
    def _replicates(cls, value: object) -> object:
        # Before pydantic's coercion, which reads true as 1 and "3" as 3.
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 50:
            raise ValueError("replicates is auto or a number from 1 to 50")
        return value

    @property
    def racing(self) -> bool:
        return self.replicates == "auto"

    def fixed_count(self) -> int:
        """Measurements per configuration with a fixed ``replicates`` (1 with ``auto``: a race
        adds its own)."""
        return 1 if self.replicates == "auto" else int(self.replicates)


class StudySpec(ServerFields):
    """A study file. See the module docstring. The server keys (engine, model, host, port, gpus,
    env, launch, python, readiness_path, ready_timeout_s, smoke, smoke_timeout_s, grace_s) are
    those of a server file (:class:`~cleanslate.launch.config.ServerFields`)."""

    name: str
    fixed: dict[str, Any] = Field(default_factory=dict)
    baseline: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Factor]
    strategy: Literal["grid", "ablation", "tpe", "random", "guided"] = "tpe"
    guided: Guided = Field(default_factory=Guided,
                           description="strategy: guided only: {then: tpe | none}")
    workload: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "random", "input_len": 1024, "output_len": 256})
    endpoint: Literal["completions", "chat"] = "completions"
    concurrency: list[int] = Field(
        default_factory=list, max_length=MAX_LEVELS,
        description="the levels of every trial (required but with a capacity objective, "
        "which searches the load itself)")
    replay: bool | list[float] = Field(
        default=False,
        description="the levels of every trial replay the trace workload at its own times "
        "(instead of concurrency: levels): true for one level, or the time scales of rising "
        "levels, e.g. [1, 2, 4] (on top of the workload's speedup)")
    requests_per_level: int | None = Field(default=None, ge=1, le=MAX_NUM_PROMPTS)
    duration_s_per_level: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    warmup: int | None = Field(
        default=None, ge=0, le=MAX_NUM_PROMPTS,
        description="requests sent to each server and not measured before its first level; "
        "None: one per slot of the first level (at least 8, at most 256)")
    objective: Objective = Field(default_factory=lambda: Objective(maximize="output_throughput"))
    slo: dict[str, float] = Field(default_factory=dict)
    capacity: CapacitySpec = Field(default_factory=CapacitySpec)
    budget: Budget = Field(default_factory=Budget)
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Optuna's and the prompts'")
    verify_deadline_s: float = Field(default=120.0, gt=0, le=MAX_VERIFY_DEADLINE_S)
    retries: int = Field(default=2, ge=0, le=100,
                         description="cleanings of a dirty host per trial")
    hosts: list[str] | None = Field(default=None, min_length=1, max_length=MAX_HOSTS)
    slots: list[SlotSpec] | None = Field(default=None, min_length=1, max_length=MAX_SLOTS)
    lease_timeout_s: float = Field(default=60.0, ge=1, le=86_400,
                                   description="a lease without a heartbeat this long expires")
    statistics: Statistics = Field(default_factory=Statistics)
    observe: ObserveOptions = Field(
        default_factory=ObserveOptions, description="what watches each level of every trial: "
        "the engine's metrics (its own names) and the run's GPUs; enabled, interval_s")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = study_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        for index, host in enumerate(value):
            if not host.strip():
                raise ValueError(f"hosts[{index}] is empty: give an ssh config name, an "
                                 "ssh:// URL or local")
        for index, host in enumerate(value):
            if host in value[:index]:
                raise ValueError(f"hosts[{index}]: {host} is named twice")
        return value

    @field_validator("space")
    @classmethod
    def _space(cls, value: dict[str, Factor]) -> dict[str, Factor]:
        if not value:
            raise ValueError("the search space is empty: give at least one flag with values")
        if len(value) > MAX_FACTORS:
            raise ValueError(f"{len(value)} factors: at most {MAX_FACTORS}")
        for name, factor in value.items():
            if isinstance(factor, list) and len(factor) == 0:
                raise ValueError(f"{name}: no values")
            if isinstance(factor, list) and len(factor) > MAX_POINTS:
                raise ValueError(f"{name}: {len(factor)} values, at most {MAX_POINTS}")
        return value

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(c < 1 or c > MAX_CONCURRENCY for c in value):
            raise ValueError(f"concurrency levels are 1 to {MAX_CONCURRENCY:,}")
        return sorted(set(value))

    @field_validator("replay", mode="before")
    @classmethod
    def _replay_levels(cls, value: object) -> object:
        """``true``/``false``, or time scales, in rising order as concurrency levels are."""
        if isinstance(value, bool):
            return value
        shape = "write replay: true, or the time scales of its levels, e.g. [1, 2, 4]"
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not true, false or a list: {shape}")
        if not value:
            raise ValueError(f"[] names no level: {shape}")
        if len(value) > MAX_LEVELS:
            raise ValueError(f"{len(value)} levels, at most {MAX_LEVELS}")
        for x in value:
            if isinstance(x, bool) or not isinstance(x, int | float) or not (
                    0 < x <= MAX_REPLAY_SPEEDUP):
                raise ValueError(f"{x!r} is not a time scale: a number above 0 and at most "
                                 f"{MAX_REPLAY_SPEEDUP:g} ({shape})")
        return sorted({float(x) for x in value})

    @field_validator("workload")
    @classmethod
    def _workload(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            workload_from_dict(value)
        except InputError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("slo")
    @classmethod
    def _slo(cls, value: dict[str, float]) -> dict[str, float]:
        for key, limit in value.items():
            if not _SLO_KEY.match(key):
                raise ValueError(f"unknown SLO {key!r}: write METRIC_STAT_ms, e.g. ttft_p99_ms, "
                                 "tpot_p99_ms, e2e_p99_ms, itl_mean_ms")
            if not limit > 0:
                raise ValueError(f"SLO {key} must be positive")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        if self.replay and self.concurrency:
            raise ValueError("replay: sets the levels of every trial: leave concurrency: out "
                             "(or replay:)")
        mismatch = capacity_problem(self.objective.metric, self.slo,
                                    self.concurrency or self.replay, self.capacity.attainment)
        if mismatch is not None:
            raise ValueError(f"{mismatch[0]}: {mismatch[1]}")
        if self.objective.capacity:
            try:
                self.capacity_search()
            except ValueError as exc:
                raise ValueError(f"capacity: {str(exc).removeprefix('Value error, ')}"
                                 ) from None
        overlap = set(self.fixed) & set(self.space)
        if overlap:
            raise ValueError(f"flags both fixed and searched: {', '.join(sorted(overlap))}")
        unknown = set(self.baseline) - set(self.space)
        if unknown:
            raise ValueError(f"baseline sets flags that are not in the space: "
                             f"{', '.join(sorted(unknown))}")
        if self.strategy == "guided":
            problem = guided_problem(self)
            if problem is not None:
                raise ValueError(problem)
        if self.strategy == "ablation":
            missing = set(self.space) - set(self.baseline)
            if missing:
                raise ValueError(f"ablation needs a baseline value for every factor; missing: "
                                 f"{', '.join(sorted(missing))}")
        planned = self.planned_count()
        if planned is not None and planned > MAX_PLANNED:
            raise ValueError(f"the {self.strategy} plans {planned:,} configurations: at most "
                             f"{MAX_PLANNED:,}; use fewer values, or strategy: tpe with a budget")
        problem = _slot_conflicts(self.slots or [SlotSpec()], self.gpus, self.slot_ports())
        if problem is not None:
            raise ValueError(problem)
        try:  # the levels' benchmark: prompts x lengths within the client's caps
            self.bench_config("http://127.0.0.1:1", ignore_eos=True)
        except ValidationError as exc:
            raise ValueError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None
        return self

    def slot_ports(self) -> list[int]:
        """The port of each slot of a host: its ``port``, else the study's port (or the
        engine's default) plus the slot's index."""
        base = self.port or engine_class(self.engine).default_port
        return [slot.port if slot.port is not None else base + index
                for index, slot in enumerate(self.slots or [SlotSpec()])]

    def slot_list(self) -> list[Slot]:
        """Every slot of the study: each of ``hosts`` (default: the study's ``host``, else this
        machine) times each of ``slots`` (default: one slot with the study's GPUs and port)."""
        hosts = self.hosts or [self.host or "local"]
        entries = self.slots or [SlotSpec()]
        ports = self.slot_ports()
        out = []
        for host in hosts:
            for index, entry in enumerate(entries):
                gpus = entry.gpus if entry.gpus is not None else self.gpus
                out.append(Slot(host=host, gpus=tuple(gpus) if gpus is not None else None,
                                port=ports[index], index=index))
        return out

    def for_slot(self, slot: Slot) -> StudySpec:
        """This study as one slot runs it: the slot's host, GPUs and port."""
        return self.model_copy(update={
            "host": slot.host, "port": slot.port,
            "gpus": list(slot.gpus) if slot.gpus is not None else None})

    def planned_count(self) -> int | None:
        """How many configurations a grid or ablation study plans (``None`` for samplers),
        computed without building them."""
        if self.strategy == "grid":
            return self.grid_size()
        if self.strategy == "ablation":
            return 1 + sum(len(self.factor_values(n)) - 1 for n in self.space)
        return None

    def bench_config(self, url: str, *, ignore_eos: bool) -> BenchConfig:
        """The benchmark of every trial's levels against the server at ``url`` (with a
        capacity objective, one level at the search's start: the search sets its own)."""
        slo = SLO(**{k: v for k, v in (("ttft_ms", self.slo.get("ttft_p99_ms")),
                                       ("tpot_ms", self.slo.get("tpot_p99_ms")),
                                       ("e2e_ms", self.slo.get("e2e_p99_ms"))) if v})
        return BenchConfig(
            url=url, model=self.model, endpoint=self.endpoint,
            workload=workload_from_dict(self.workload, where="workload"),
            loads=self.replay_loads() or tuple(
                ClosedLoop(concurrency=c) for c in self.concurrency) or (
                ClosedLoop(concurrency=self.capacity.start),),
            num_prompts=self.requests_per_level, duration_s=self.duration_s_per_level,
            seed=self.seed, slo=slo, ignore_eos=ignore_eos,
            observe=self.observe.model_copy(update={"engine": self.engine}),
        )

    def replay_loads(self) -> tuple[ReplayLoad, ...]:
        """The replay levels of ``replay:`` (none without it)."""
        if self.replay is True:
            return (ReplayLoad(),)
        if not self.replay:
            return ()
        return tuple(ReplayLoad(speedup=x) for x in self.replay)

    def warmup_requests(self) -> int:
        """Requests each server gets, unmeasured, before its first level: ``warmup``, or by
        default one per slot of the first level, at least :data:`MIN_WARMUP` and at most
        :data:`MAX_WARMUP` (on an H200 the first level after a start was the slowest every
        time without it: ``docs/statistics.md``)."""
        if self.warmup is not None:
            return self.warmup
        first = self.concurrency[0] if self.concurrency else self.capacity.start
        return max(MIN_WARMUP, min(MAX_WARMUP, first))

    def capacity_slo(self) -> CapacitySLO:
        """What a probe of the capacity search must meet: the study's SLOs as level keys
        (:meth:`slo_limits`), or with ``capacity.attainment`` each SLO's limit per request
        (``tpot_p99_ms: 50`` -> ``tpot_ms: 50``: the share of requests meeting every limit must
        reach the attainment), at the study's confidence."""
        limits = self.slo_limits()
        if self.capacity.attainment is not None:
            per_request = CapacitySLO(limits=limits).per_request()
            limits = {k: v for k, v in per_request.model_dump().items() if v is not None}
        return CapacitySLO(limits=limits, attainment=self.capacity.attainment,
                           confidence=self.statistics.confidence)

    def capacity_search(self) -> CapacitySearch:
        """A fresh capacity search of one trial (or replicate): on concurrency, from
        ``capacity.start``, the same for every measurement of every configuration."""
        c = self.capacity
        return CapacitySearch("concurrency", self.capacity_slo(), start=c.start,
                              max_load=c.max_load, tolerance=c.tolerance,
                              max_probes=c.max_probes, cliff=c.cliff)

    def slo_limits(self) -> dict[str, float]:
        """SLOs as level keys: ``ttft_p99_ms`` -> ``p99_ttft_ms`` (vLLM's spelling)."""
        out = {}
        for key, limit in self.slo.items():
            match = _SLO_KEY.match(key)
            assert match is not None
            metric, stat = match.groups()
            metric = "e2el" if metric.startswith("e2e") else metric
            out[f"{stat}_{metric}_ms"] = limit
        return out

    def factor_values(self, name: str) -> list[Scalar]:
        factor = self.space[name]
        return factor.discrete() if isinstance(factor, Range) else list(factor)

    def grid_size(self) -> int:
        return math.prod(len(self.factor_values(n)) for n in self.space)


def guided_problem(spec: StudySpec) -> str | None:
    """What keeps ``spec`` from running ``strategy: guided`` (``None``: nothing): it starts at
    its baseline, which must set every flag of the space (each step changes one flag of the
    incumbent), and it runs one trial at a time (each step depends on the last one's verdict),
    so on one slot."""
    missing = [name for name in spec.space if name not in spec.baseline]
    if missing:
        return (f"strategy: guided starts at the baseline and changes one flag at a time: give "
                f"baseline: a value for every flag of the space; missing: {', '.join(missing)}")
    if len(spec.slot_list()) > 1:
        return ("strategy: guided runs one trial at a time (each step reads the last one's "
                "verdict): give it one slot (no hosts: or slots: list of several)")
    return None


def capacity_problem(metric: object, slo: object, concurrency: object,
                     attainment: object) -> tuple[str, str] | None:
    """What is wrong between a capacity objective and the keys around it, as ``(key,
    message)``: a capacity objective needs ``slo:`` and takes no ``concurrency:`` (it searches
    the load itself), with ``capacity.attainment`` every SLO has a per-request limit (TTFT,
    TPOT, E2E: not ITL); any other objective needs ``concurrency:``. ``None`` when nothing
    is. Reads raw values too (the file before it is validated, for the line of the key)."""
    if metric in CAPACITY_OBJECTIVES:
        if not slo:
            return ("objective", f"{metric} is the most load served within the SLOs: give "
                    "slo: (e.g. slo: {tpot_p90_ms: 50})")
        if concurrency:
            return ("concurrency", f"{metric} searches the load itself: leave concurrency: "
                    "out and set capacity: {start: ..., max_load: ...}")
        if attainment is not None and isinstance(slo, dict):
            itl = [k for k in slo if str(k).startswith("itl_")]
            if itl:
                return ("slo", f"{itl[0]}: with capacity.attainment every SLO is a limit per "
                        "request, and ITL has none: use ttft_*, tpot_* or e2e_* keys")
        return None
    if not concurrency:
        return ("concurrency", "give the levels of every trial (e.g. concurrency: [64, 256], "
                "or replay: true with a trace workload); only a capacity objective "
                "(max_concurrency_under_slo, max_goodput) goes without")
    return None


def _check_capacity_keys(data: object, root: yaml.Node | None, path: Path) -> None:
    """The capacity objective's needs (:func:`capacity_problem`), checked on the file as
    written so that the error names the line of the key at fault."""
    if not isinstance(data, dict):
        return
    objective = data.get("objective")
    metric = None
    if isinstance(objective, dict):
        metric = objective.get("maximize", objective.get("minimize"))
    capacity = data.get("capacity")
    attainment = capacity.get("attainment") if isinstance(capacity, dict) else None
    if not isinstance(metric, str) or "minimize" in (objective or {}):
        return  # a bad or minimized objective is the model's error, at its line
    problem = capacity_problem(metric, data.get("slo"),
                               data.get("concurrency") or data.get("replay"), attainment)
    if problem is not None:
        key, message = problem
        loc: tuple[int | str, ...] = (key,) if key in data else ("objective",)
        raise InputError(f"{key}: {message}", where=_at(path, root, loc),
                         hint="see docs/study.md, \"Capacity under an SLO\"")


def _check_guided_keys(data: object, root: yaml.Node | None, path: Path) -> None:
    """``strategy: guided`` without a baseline for every flag of the space, checked on the file
    as written so that the error names the line of ``baseline:`` (or of ``strategy:`` when
    there is none)."""
    if not isinstance(data, dict) or data.get("strategy") != "guided":
        return
    space, baseline = data.get("space"), data.get("baseline") or {}
    if not isinstance(space, dict) or not isinstance(baseline, dict):
        return  # the model's error, at its line
    missing = [str(name) for name in space if name not in baseline]
    if missing:
        loc: tuple[int | str, ...] = ("baseline",) if "baseline" in data else ("strategy",)
        raise InputError(
            f"strategy: guided starts at the baseline and changes one flag at a time: "
            f"baseline: needs a value for every flag of the space; missing: "
            f"{', '.join(missing)}", where=_at(path, root, loc),
            hint="add baseline: {FLAG: VALUE, ...} with one of the space's values for each "
                 "(see docs/study.md, \"strategy: guided\")")


def _at(path: Path, root: yaml.Node | None, loc: tuple[int | str, ...]) -> str:
    line = line_of(root, loc)
    return f"{path}:{line}" if line else str(path)


def _check_flags(spec: StudySpec, root: yaml.Node | None, path: Path) -> None:
    """Every flag name and value of ``fixed``, ``baseline`` and the space's values must make an
    engine argument (a scalar, a list of scalars or a mapping)."""
    checks: list[tuple[tuple[int | str, ...], str, Any]] = []
    checks += [(("fixed", k), k, v) for k, v in spec.fixed.items()]
    checks += [(("baseline", k), k, v) for k, v in spec.baseline.items()]
    for name in spec.space:
        checks += [(("space", name), name, v) for v in spec.factor_values(name)]
    for loc, key, value in checks:
        try:
            flag_args({key: value})
        except InputError as exc:
            raise InputError(exc.message, where=_at(path, root, loc), hint=exc.hint) from None


def _check_distributions(spec: StudySpec, root: yaml.Node | None, path: Path) -> None:
    """The sampler's distribution of each factor can be built (Optuna refuses, e.g., a
    ``step`` with ``log: true``, or a step below 1 on an integer range)."""
    for name in spec.space:
        try:
            distribution(spec.space[name], spec.factor_values(name),
                         sampled=spec.strategy in SAMPLED_STRATEGIES)
        except (ValueError, TypeError) as exc:
            raise InputError(f"space {name}: {exc}", where=_at(path, root, ("space", name)),
                             hint="see docs/study.md for ranges") from None


def _check_inputs(spec: StudySpec, root: yaml.Node | None, path: Path) -> None:
    """The file a workload names (a ShareGPT dataset, a conversation file, a trace) is read
    here as the first level will read it (the benchmark client runs in this process): a
    file that cannot be opened is an error at the study's line; one whose content is wrong,
    at the file's own line (:func:`cleanslate.bench.check_workload_files`)."""
    check_workload_files(workload_from_dict(spec.workload),
                         [load.speedup for load in spec.replay_loads()],
                         where=_at(path, root, ("workload", "path")))


def load_study(path: Path) -> tuple[StudySpec, yaml.Node | None]:
    """Load and validate a study file, everything that can be checked before a launch
    (see the module docstring); errors name file:line (exit 2)."""
    hint = "see docs/study.md for the keys of a study file"
    data, root = read_yaml(path)
    _check_capacity_keys(data, root, path)
    _check_guided_keys(data, root, path)
    if not isinstance(data, dict):
        raise InputError("expected a mapping of keys to values at the top level",
                         where=f"{path}:1", hint=hint)
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as exc:
        raise validation_error(path, root, exc, hint) from None
    _check_flags(spec, root, path)
    _check_distributions(spec, root, path)
    _check_inputs(spec, root, path)
    if spec.strategy == "ablation" or spec.baseline:
        for name, value in spec.baseline.items():
            if value not in spec.factor_values(name):
                line = line_of(root, ("baseline", name))
                raise InputError(
                    f"baseline {name}: {value!r} is not one of the space's values "
                    f"{spec.factor_values(name)}", where=f"{path}:{line}",
                    hint="add it to the space or pick one of its values")
    return spec, root
