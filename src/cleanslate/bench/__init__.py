"""The benchmark client: load a running OpenAI-compatible server and measure it.

Programmatic use (the tuner's)::

    from cleanslate.bench import BenchConfig, ClosedLoop, run_benchmark
    config = BenchConfig(url=..., model=..., loads=(ClosedLoop(concurrency=64),))
    result = asyncio.run(run_benchmark(config))
    result.levels[0].output_throughput, result.levels[0].ttft_ms.p99, result.model_dump_json()

:func:`run_level` runs one level over a caller-owned ``aiohttp`` session. Results are frozen
pydantic models; their JSON uses vLLM's ``vllm bench serve`` key names (``docs/bench.md``, which
also defines every metric). A new workload kind subclasses :class:`Workload` and registers its
generator with :func:`register_workload`.

The runner (:func:`run_benchmark`, :func:`run_level`, :func:`make_session`,
:class:`LevelProgress`) needs aiohttp and numpy and loads on first use: the records of a study
(``LevelResult``) are read without them (``cleanslate report``, ``stop``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports
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
from cleanslate.bench._workloads import (
    WORKLOADS,
    Prompt,
    RandomWorkload,
    SharedPrefixWorkload,
    ShareGPTWorkload,
    Workload,
    WorkloadSpec,
    generate,
    parse_workload,
    register_workload,
    workload_from_dict,
)

if TYPE_CHECKING:
    from cleanslate.bench._runner import LevelProgress, make_session, run_benchmark, run_level

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(
    ("LevelProgress", "make_session", "run_benchmark", "run_level"), "cleanslate.bench._runner"))

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
    "Workload",
    "WorkloadSpec",
    "generate",
    "make_session",
    "parse_workload",
    "register_workload",
    "run_benchmark",
    "run_level",
    "workload_from_dict",
]
