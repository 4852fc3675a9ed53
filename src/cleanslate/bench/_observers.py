"""The observers of a level: which ones a run's :class:`~cleanslate.bench.ObserveOptions` makes
(:func:`observers_for`), and starting and stopping them around a measurement
(:func:`start_all`, :func:`stop_all`). Apart from :mod:`cleanslate.bench._observe` (the seam's
types, which every observer imports) so that no observer imports what imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cleanslate.bench import _gpu  # noqa: F401  (registers the GPU telemetry of options.gpus)
from cleanslate.bench._metric_names import MetricMap, registered_maps
from cleanslate.bench._observe import (
    OPTION_OBSERVERS,
    Harness,
    LevelContext,
    LevelEnd,
    LevelObserver,
    Observed,
    ObserveOptions,
    ObserverFactory,
)
from cleanslate.bench._observed import ServerMetrics
from cleanslate.bench._server_metrics import ServerMetricsObserver


def metrics_observer(options: ObserveOptions,
                     maps: Sequence[MetricMap] | None = None) -> ObserverFactory:
    """The engine-metrics observer of each measurement: scrapes ``config.url`` through the
    run's pool every ``options.interval_s``. ``maps``: the engine's own (one) or every
    engine's (a bare URL); by default those the engines registered
    (:func:`~cleanslate.bench._metric_names.registered_maps`: ``options.engine``'s own, else
    all). With none registered (``cleanslate.engines`` never imported) there is nothing to
    read the names with, and the level's ``server_metrics`` says so (:data:`NO_MAPS`)."""
    def make(ctx: LevelContext) -> LevelObserver:
        known = maps if maps is not None else registered_maps(options.engine)
        if not known:
            return _Unobservable(ServerMetrics(url=ctx.config.url, unreadable=NO_MAPS))
        return ServerMetricsObserver(ctx.config.url, known, session=ctx.session,
                                     interval_s=options.interval_s)

    return make


#: Why a level of a program that never imported the engines has no engine metrics.
NO_MAPS = ("no engine's metric names are known: import cleanslate.engines (the engines "
           "register them) before running the benchmark")


class _Unobservable:
    """An observer with nothing to watch: its summary says why, and it makes no request."""

    key = "server_metrics"

    def __init__(self, summary: ServerMetrics) -> None:
        self.summary = summary

    async def start(self) -> None:
        return None

    async def stop(self, end: LevelEnd) -> Observed:
        return Observed(self.key, self.summary)


def observers_for(options: ObserveOptions | None, *,
                  maps: Sequence[MetricMap] | None = None,
                  extra: Sequence[ObserverFactory] = ()) -> tuple[ObserverFactory, ...]:
    """The observers ``options`` asks for (none when ``options`` is ``None`` or disabled:
    ``extra`` neither), then ``extra`` (the harness's own: the GPU telemetry of a run whose
    GPUs the caller knows)."""
    if options is None or not options.enabled:
        return ()
    made: list[ObserverFactory] = []
    if options.metrics:
        made.append(metrics_observer(options, maps))
    for maker in OPTION_OBSERVERS:  # GPU telemetry of the GPUs the options name
        factory = maker(options)
        if factory is not None:
            made.append(factory)
    return (*made, *extra)


async def start_all(harness: Harness, ctx: LevelContext,
                    failures: list[str] | None = None) -> list[LevelObserver]:
    """Make and start the observers of one measurement: those ``ctx.config.observe`` asks
    for, then the harness's own. An observer promises not to raise; one that does anyway (a
    bug) is left out and said in ``failures``: it costs its observation, never the level."""
    started: list[LevelObserver] = []
    for factory in observers_for(ctx.config.observe, extra=harness.observers):
        try:
            observer = factory(ctx)
            if observer is None:
                continue
            await observer.start()
        except Exception as exc:  # an observer's bug, reported below
            if failures is not None:
                failures.append(_failed("start", exc))
            continue
        started.append(observer)
    return started


async def stop_all(observers: Sequence[LevelObserver], end: LevelEnd,
                   failures: list[str] | None = None) -> list[Observed]:
    """Stop every observer of a measurement, in parallel (each takes a final sample). One
    that raises is left out and said in ``failures``, as in :func:`start_all`."""
    results = await asyncio.gather(*(o.stop(end) for o in observers), return_exceptions=True)
    seen: list[Observed] = []
    for observer, result in zip(observers, results, strict=True):
        if isinstance(result, Observed):
            seen.append(result)
        elif isinstance(result, asyncio.CancelledError):
            raise result
        elif failures is not None:
            failures.append(_failed(f"stop ({observer.key})", result))
    return seen


def _failed(step: str, exc: BaseException) -> str:
    return f"an observer failed at its {step}: {type(exc).__name__}: {str(exc)[:200]}"


__all__ = ["metrics_observer", "observers_for", "start_all", "stop_all"]
