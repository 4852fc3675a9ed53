"""The level seam: what watches a level while it runs, and what a run brings to every level.

Every observation of a level (the engine's own metrics, GPU telemetry, and whatever comes
next) is a :class:`LevelObserver`: made for one measurement from a :class:`LevelContext`,
``start()`` when the level starts (a baseline), sampling on its own while it runs, and
``stop()`` when it ends, returning an :class:`Observed`: a typed summary (a field of
:class:`~cleanslate.bench.LevelResult`, named by ``key``) and the raw samples (an artifact,
never part of the result). An observer never raises for what it watches: a source that
cannot be read ends as a summary that says why.

A run passes one :class:`Harness` (the connection pool, tokenizer, live-view hook, stop event,
observers and the sink of raw samples) to every level, probe and trial, instead of each of
these threaded by hand through ``run_level``, ``run_repeats``, ``run_benchmark``, ``find_max``
and ``tune``'s trial. :class:`ObserveOptions` is what a user sets (``--observe-interval``,
``--no-observe``); :func:`observers_for` turns it into the observers of a run.

Anchors: GuideLLM's per-benchmark collectors and nvitop's ``ResourceMetricCollector`` (a
start/sample/stop collector that summarizes a window); written afresh here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import Field

from cleanslate.models import FrozenStrict

if TYPE_CHECKING:
    import aiohttp

    from cleanslate.bench._context import KnownContext
    from cleanslate.bench._ending import CrashCheck
    from cleanslate.bench._models import AnyLoad, BenchConfig, LevelResult
    from cleanslate.bench._runner import ProgressHook
    from cleanslate.bench._server_config import ServerConfig
    from cleanslate.bench._tokens import Tokenizer

#: Seconds between samples unless told (AIPerf scrapes every 333 ms).
DEFAULT_INTERVAL_S = 0.25
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.05, 60.0


class ObserveOptions(FrozenStrict):
    """What a user asks to watch during each level (``bench --observe-interval``,
    ``--no-observe``; a study's ``observe:`` block), part of
    :class:`~cleanslate.bench.BenchConfig`: every level, probe and trial of a run reads it.

    ``engine``: the adapter whose metric names to read (``None``: found from the names the
    endpoint answers). ``gpus``: the GPU indices of the run's scope (``None``: no GPU
    telemetry unless a source is given by the caller). ``gpu_source``: where telemetry comes
    from: ``auto`` (NVML where importable, else ``nvidia-smi``), ``nvml``, ``nvidia-smi``,
    ``sim`` (the simulated GPU's ledger) or ``off``.
    """

    enabled: bool = True
    interval_s: float = Field(default=DEFAULT_INTERVAL_S, ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)
    metrics: bool = True
    engine: str | None = None
    gpus: tuple[int, ...] | None = None
    gpu_source: str = "auto"


@dataclass(frozen=True)
class LevelContext:
    """One measurement about to run: what an observer may need to know.

    ``label``: the level's (or probe's, or repeat's) name as the live view shows it;
    ``session``: the run's pool (scrapes take the same path, the SSH forward included)."""

    label: str
    load: AnyLoad
    config: BenchConfig
    session: aiohttp.ClientSession


@dataclass(frozen=True)
class LevelEnd:
    """How a measurement ended, for an observer's summary.

    ``window``: the steady window (a closed loop's span at its full concurrency) or, when it
    has none, first send to last receive, in ``perf_counter`` seconds; ``level_span``: first
    send to last receive; ``output_tokens``: tokens the client received (energy per token)."""

    window: tuple[float, float] | None
    level_span: tuple[float, float] | None
    output_tokens: int
    completed: int


@dataclass(frozen=True)
class Observed:
    """What one observer saw: ``summary`` is stored as ``LevelResult.<key>`` (a pydantic
    model, or a tuple of them); ``samples`` are the raw samples as JSON-able mappings, written
    as an artifact by the harness's sink."""

    key: str
    summary: Any
    samples: tuple[Mapping[str, Any], ...] = ()


class LevelObserver(Protocol):
    """Watches one measurement. ``start()`` takes the baseline and starts sampling; ``stop()``
    ends sampling, takes a final sample and returns the summary. Neither raises for anything
    the watched source does."""

    key: str

    async def start(self) -> None: ...

    async def stop(self, end: LevelEnd) -> Observed: ...


#: Makes the observer of one measurement (``None``: nothing to watch for it).
ObserverFactory = Callable[[LevelContext], "LevelObserver | None"]
#: Reads a server's configuration in effect: ``(session, base_url) -> ServerConfig``.
ConfigReader = Callable[["aiohttp.ClientSession", str], Awaitable["ServerConfig"]]
#: Receives one measurement's raw samples: ``(label, key, samples)``.
SampleSink = Callable[[str, str, Sequence[Mapping[str, Any]]], None]


@dataclass
class Harness:
    """What a run brings to each of its levels. Every field may be left out: ``session`` is
    made (and closed) by the function that needs it, the tokenizer is loaded from the
    config, and no observer watches."""

    session: aiohttp.ClientSession | None = None
    tokenizer: Tokenizer | None = None
    on_progress: ProgressHook | None = None
    stop: asyncio.Event | None = None
    #: observers beyond those the config's ``observe`` makes (the run's GPU telemetry)
    observers: tuple[ObserverFactory, ...] = ()
    on_samples: SampleSink | None = None
    #: raw samples by (label, key), kept when no sink is given (tests, the API)
    kept: dict[tuple[str, str], tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    #: reads the server's configuration once before the first level (an engine adapter's
    #: ``read_config`` with the flags it was launched with); ``None``: the flavour is found
    #: from what the URL answers and nothing was asked
    read_config: ConfigReader | None = None
    #: called with each level of ``run_benchmark`` once it ended and was diagnosed (its
    #: ``bottleneck`` set): the live view prints the verdict then
    on_level: Callable[[LevelResult], None] | None = None
    #: says after each level of ``run_benchmark`` whether the server died during it (``bench
    #: --run``: the run's exit status and log); ``None``: what the connections showed
    #: (:func:`~cleanslate.bench._ending.connection_crash`)
    check_crash: CrashCheck | None = None
    #: the server's context (prompt plus output tokens) as its caller knows it (a run
    #: record): a trace's rows are fitted to it (:mod:`cleanslate.bench._context`)
    context: KnownContext | None = None
    #: told, before the first level, what a run does that the user did not ask in so many
    #: words (a trace's rows dropped to fit the server's context); ``None``: nobody is told
    on_note: Callable[[str], None] | None = None

    def with_session(self, session: aiohttp.ClientSession,
                     tokenizer: Tokenizer | None) -> Harness:
        """A copy with ``session`` and ``tokenizer`` set (the rest shared)."""
        return Harness(session=session, tokenizer=tokenizer, on_progress=self.on_progress,
                       stop=self.stop, observers=self.observers, on_samples=self.on_samples,
                       kept=self.kept, read_config=self.read_config, on_level=self.on_level,
                       check_crash=self.check_crash, context=self.context,
                       on_note=self.on_note)

    def keep(self, label: str, observed: Observed) -> None:
        if not observed.samples:
            return
        if self.on_samples is not None:
            self.on_samples(label, observed.key, observed.samples)
        else:
            self.kept[(label, observed.key)] = observed.samples


#: Makers of an observer from the options alone (``bench._gpu``'s GPU telemetry of the GPUs
#: ``options.gpus`` names), registered by their modules, which the package imports.
OPTION_OBSERVERS: list[Callable[[ObserveOptions], ObserverFactory | None]] = []


def register_option_observer(
        maker: Callable[[ObserveOptions], ObserverFactory | None]) -> None:
    """Make :func:`~cleanslate.bench._observers.observers_for` ask ``maker`` for an observer
    of every run's options."""
    OPTION_OBSERVERS.append(maker)


__all__ = [
    "DEFAULT_INTERVAL_S",
    "OPTION_OBSERVERS",
    "ConfigReader",
    "Harness",
    "LevelContext",
    "LevelEnd",
    "LevelObserver",
    "ObserveOptions",
    "Observed",
    "ObserverFactory",
    "SampleSink",
    "register_option_observer",
]
