"""The benchmark client: load a running OpenAI-compatible server and measure it.

Programmatic use (the tuner's)::

    from cleanslate.bench import BenchConfig, ClosedLoop, run_benchmark
    config = BenchConfig(url=..., model=..., loads=(ClosedLoop(concurrency=64),))
    result = asyncio.run(run_benchmark(config))
    result.levels[0].output_throughput, result.levels[0].ttft_ms.p99, result.model_dump_json()

:func:`run_level` runs one level over a caller-owned ``aiohttp`` session, once;
:func:`run_repeats` measures it ``BenchConfig.repeats`` times and combines the repeats with
intervals; :func:`first_repeat_slow` says whether a first repeat is to be discarded.
Results are frozen pydantic models; their JSON uses vLLM's ``vllm bench serve`` key names
(``docs/bench.md``, which also defines every metric). A new workload kind subclasses
:class:`Workload` and registers its
generator with :func:`register_workload`.

The runner (:func:`run_benchmark`, :func:`run_level`, :func:`run_repeats`,
:func:`make_session`, :class:`LevelProgress`) needs aiohttp and numpy, and the statistics of
repeats (:func:`combine`, :func:`first_repeat_slow`) numpy and scipy; they load on first
use: the records of a study (``LevelResult``) are read without them (``cleanslate report``,
``stop``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports
from cleanslate.bench._bottleneck import (
    BOTTLENECK_KINDS,
    Advice,
    AdviceBook,
    AdviceEntry,
    Bottleneck,
    BottleneckKind,
    Confidence,
    advice_book,
    advice_for,
    diagnose,
    diagnosed,
    register_advice,
)
from cleanslate.bench._bound_text import bound_by, bound_evidence, bound_line, bound_lines
from cleanslate.bench._capacity import (
    CAPACITY_OBJECTIVES,
    DEFAULT_CLIFF,
    DEFAULT_MAX_EXTENSIONS,
    DEFAULT_MAX_LOAD,
    DEFAULT_MAX_PROBES,
    DEFAULT_START,
    DEFAULT_TOLERANCE,
    PER_REQUEST_KEYS,
    CapacityResult,
    CapacitySearch,
    CapacitySLO,
    Probe,
    ProbeVerdict,
    SloCheck,
    StopReason,
    level_key,
    parse_slo_keys,
    share_target,
    worst_check,
)
from cleanslate.bench._context import KnownContext
from cleanslate.bench._conversation import ConversationWorkload, TurnResult
from cleanslate.bench._gpu import GPU_SOURCES, GpuObserver, gpu_observer, local_gpus
from cleanslate.bench._limits import (
    MAX_CONCURRENCY,
    MAX_DURATION_S,
    MAX_LEVELS,
    MAX_NUM_PROMPTS,
    MAX_REPLAY_SPEEDUP,
    MIN_RATE,
)
from cleanslate.bench._metric_names import (
    VOCABULARY,
    MetricMap,
    Source,
    engine_total,
    no_metrics,
    register_metric_map,
    registered_maps,
)
from cleanslate.bench._models import (
    LEVEL_METRICS,
    SLO,
    TARGET_CI_MIN_REPEATS,
    BenchConfig,
    BenchResult,
    ClosedLoop,
    Endpoint,
    LevelCrash,
    LevelResult,
    Load,
    OpenLoop,
    ReplayLoad,
    Stats,
    check_workload_files,
)
from cleanslate.bench._observe import (
    ConfigReader,
    Harness,
    LevelContext,
    LevelEnd,
    LevelObserver,
    Observed,
    ObserveOptions,
    ObserverFactory,
)
from cleanslate.bench._observed import GaugeStats, GpuTelemetry, ServerMetrics
from cleanslate.bench._ramp import RampLoad, WindowResult, parse_ramp
from cleanslate.bench._sample_files import (
    MAX_SAMPLE_FILE_BYTES,
    SampleFile,
    SampleFiles,
    discard_samples,
    observed_folder,
    read_sample_files,
)
from cleanslate.bench._server_config import (
    ConfigDifference,
    ServerConfig,
    read_server_config,
    requested_flags,
)
from cleanslate.bench._server_config import Flavour as ConfigFlavour
from cleanslate.bench._trace import TraceFit, TraceInfo, TraceWorkload
from cleanslate.bench._workloads import (
    WORKLOADS,
    Prompt,
    RandomWorkload,
    SharedPrefixWorkload,
    ShareGPTWorkload,
    Workload,
    WorkloadSpec,
    generate,
    key_values,
    parse_workload,
    register_workload,
    workload_from_dict,
)

if TYPE_CHECKING:
    from cleanslate.bench._client import printable
    from cleanslate.bench._ending import CrashCheck, connection_crash, errors_text
    from cleanslate.bench._find_max import ProbeStart, find_max
    from cleanslate.bench._keepalive import (
        fresh_session,
        is_stale,
        note_retry,
        request_context,
        trace_config,
    )
    from cleanslate.bench._live import (
        LiveView,
        gpu_totals,
        live_readings,
        observation_notes,
        observed_cells,
        observed_headers,
        observed_kinds,
        summary_table,
    )
    from cleanslate.bench._observers import observers_for
    from cleanslate.bench._repeats import STEADY_FLOOR, combine, first_repeat_slow
    from cleanslate.bench._runner import (
        LevelProgress,
        make_session,
        run_benchmark,
        run_level,
        run_repeats,
    )
    from cleanslate.bench._server_metrics import (
        MetricsObservation,
        MetricsObserver,
        parse_scrape,
        summarize,
    )

__getattr__, __dir__ = lazy_exports(__name__, {
    "find_max": "cleanslate.bench._find_max",
    "ProbeStart": "cleanslate.bench._find_max",
    **dict.fromkeys(("LiveView", "detail_tables", "gpu_totals", "live_readings",
                     "observation_notes", "observed_cells", "observed_headers",
                     "observed_kinds", "summary_table"),
                    "cleanslate.bench._live"),
    "printable": "cleanslate.bench._client",
    **dict.fromkeys(("CrashCheck", "connection_crash", "errors_text"),
                    "cleanslate.bench._ending"),
    "observers_for": "cleanslate.bench._observers",
    **dict.fromkeys(("fresh_session", "is_stale", "note_retry", "request_context",
                     "trace_config"), "cleanslate.bench._keepalive"),
    **dict.fromkeys(("LevelProgress", "make_session", "run_benchmark", "run_level",
                     "run_repeats"), "cleanslate.bench._runner"),
    **dict.fromkeys(("STEADY_FLOOR", "combine", "first_repeat_slow"),
                    "cleanslate.bench._repeats"),
    **dict.fromkeys(("MetricsObservation", "MetricsObserver", "parse_scrape",
                     "summarize"), "cleanslate.bench._server_metrics"),
})

__all__ = [
    "BOTTLENECK_KINDS",
    "CAPACITY_OBJECTIVES",
    "DEFAULT_CLIFF",
    "DEFAULT_MAX_EXTENSIONS",
    "DEFAULT_MAX_LOAD",
    "DEFAULT_MAX_PROBES",
    "DEFAULT_START",
    "DEFAULT_TOLERANCE",
    "GPU_SOURCES",
    "LEVEL_METRICS",
    "MAX_CONCURRENCY",
    "MAX_DURATION_S",
    "MAX_LEVELS",
    "MAX_NUM_PROMPTS",
    "MAX_REPLAY_SPEEDUP",
    "MAX_SAMPLE_FILE_BYTES",
    "MIN_RATE",
    "PER_REQUEST_KEYS",
    "SLO",
    "STEADY_FLOOR",
    "TARGET_CI_MIN_REPEATS",
    "VOCABULARY",
    "WORKLOADS",
    "Advice",
    "AdviceBook",
    "AdviceEntry",
    "BenchConfig",
    "BenchResult",
    "Bottleneck",
    "BottleneckKind",
    "CapacityResult",
    "CapacitySLO",
    "CapacitySearch",
    "ClosedLoop",
    "Confidence",
    "ConfigDifference",
    "ConfigFlavour",
    "ConfigReader",
    "ConversationWorkload",
    "CrashCheck",
    "Endpoint",
    "GaugeStats",
    "GpuObserver",
    "GpuTelemetry",
    "Harness",
    "KnownContext",
    "LevelContext",
    "LevelCrash",
    "LevelEnd",
    "LevelObserver",
    "LevelProgress",
    "LevelResult",
    "LiveView",
    "Load",
    "MetricMap",
    "MetricsObservation",
    "MetricsObserver",
    "ObserveOptions",
    "Observed",
    "ObserverFactory",
    "OpenLoop",
    "Probe",
    "ProbeStart",
    "ProbeVerdict",
    "Prompt",
    "RampLoad",
    "RandomWorkload",
    "ReplayLoad",
    "SampleFile",
    "SampleFiles",
    "ServerConfig",
    "ServerMetrics",
    "ShareGPTWorkload",
    "SharedPrefixWorkload",
    "SloCheck",
    "Source",
    "Stats",
    "StopReason",
    "TraceFit",
    "TraceInfo",
    "TraceWorkload",
    "TurnResult",
    "WindowResult",
    "Workload",
    "WorkloadSpec",
    "advice_book",
    "advice_for",
    "bound_by",
    "bound_evidence",
    "bound_line",
    "bound_lines",
    "check_workload_files",
    "combine",
    "connection_crash",
    "detail_tables",
    "diagnose",
    "diagnosed",
    "discard_samples",
    "engine_total",
    "errors_text",
    "find_max",
    "first_repeat_slow",
    "fresh_session",
    "generate",
    "gpu_observer",
    "gpu_totals",
    "is_stale",
    "key_values",
    "level_key",
    "live_readings",
    "local_gpus",
    "make_session",
    "no_metrics",
    "note_retry",
    "observation_notes",
    "observed_cells",
    "observed_folder",
    "observed_headers",
    "observed_kinds",
    "observers_for",
    "parse_ramp",
    "parse_scrape",
    "parse_slo_keys",
    "parse_workload",
    "printable",
    "read_sample_files",
    "read_server_config",
    "register_advice",
    "register_metric_map",
    "register_workload",
    "registered_maps",
    "request_context",
    "requested_flags",
    "run_benchmark",
    "run_level",
    "run_repeats",
    "share_target",
    "summarize",
    "summary_table",
    "trace_config",
    "workload_from_dict",
    "worst_check",
]
