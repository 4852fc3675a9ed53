"""The benchmark client: load a running OpenAI-compatible server and measure it (DESIGN section 7).

Programmatic use (the tuner's)::

    from cleanslate.bench import BenchConfig, ClosedLoop, run_benchmark
    config = BenchConfig(url=..., model=..., loads=(ClosedLoop(concurrency=64),))
    result = asyncio.run(run_benchmark(config))
    result.levels[0].output_throughput, result.levels[0].ttft_ms.p99, result.model_dump_json()

:func:`run_level` runs one level over a caller-owned ``aiohttp`` session. Results are frozen
pydantic models; their JSON uses vLLM's ``vllm bench serve`` key names (``docs/bench.md``).
"""

from __future__ import annotations

from cleanslate.bench._models import (
    LEVEL_METRICS,
    SLO,
    BenchConfig,
    BenchResult,
    ClosedLoop,
    LevelResult,
    Load,
    OpenLoop,
    Stats,
)
from cleanslate.bench._runner import LevelProgress, make_session, run_benchmark, run_level
from cleanslate.bench._workloads import (
    WORKLOADS,
    Prompt,
    RandomWorkload,
    SharedPrefixWorkload,
    ShareGPTWorkload,
    WorkloadSpec,
    generate,
    parse_workload,
    register_workload,
    workload_from_dict,
)

__all__ = [
    "LEVEL_METRICS",
    "SLO",
    "WORKLOADS",
    "BenchConfig",
    "BenchResult",
    "ClosedLoop",
    "LevelProgress",
    "LevelResult",
    "Load",
    "OpenLoop",
    "Prompt",
    "RandomWorkload",
    "ShareGPTWorkload",
    "SharedPrefixWorkload",
    "Stats",
    "WorkloadSpec",
    "generate",
    "make_session",
    "parse_workload",
    "register_workload",
    "run_benchmark",
    "run_level",
    "workload_from_dict",
]
