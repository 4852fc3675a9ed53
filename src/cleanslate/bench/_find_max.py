"""Run a capacity search (:mod:`cleanslate.bench._capacity`) against a server.

Each probe is a level of the bench (closed loop for ``concurrency``, open loop for ``rate``)
with prompts of its own (seed ``config.seed + 1000 x probe``, plus the extension's index: no
probe is served from the prefix cache of another), after one warm-up before the first. A probe
whose SLO intervals straddle their targets is measured again with other prompts and decided on
the pooled requests (:func:`cleanslate.bench.combine`), up to ``max_extensions`` times.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from cleanslate.bench._bottleneck import diagnosed
from cleanslate.bench._capacity import (
    DEFAULT_MAX_EXTENSIONS,
    CapacityResult,
    CapacitySearch,
    Probe,
    ProbeVerdict,
    StopReason,
    probe_from_level,
)
from cleanslate.bench._context import fit_config
from cleanslate.bench._models import BenchConfig, ClosedLoop, LevelResult, OpenLoop
from cleanslate.bench._observe import Harness
from cleanslate.bench._repeats import combine
from cleanslate.bench._runner import (
    _measure,
    level_seed,
    load_tokenizer,
    make_session,
    read_config_once,
)
from cleanslate.bench._workloads import generate

#: Watches the server after each measurement: ``(cause, detail)`` when it crashed, else
#: ``None``. The bench's own (:func:`partial_is_crash`) knows only what the client saw.
ServerCheck = Callable[[LevelResult], Awaitable[tuple[str, str] | None]]

#: Seeds of one probe's measurements are ``seed + SEED_STRIDE x probe + extension``.
SEED_STRIDE = 1000


@dataclass(frozen=True)
class ProbeStart:
    """A measurement of the search about to start, for a progress line.

    ``index``: the probe's number from 0; ``extension``: 0 for its first measurement, then 1,
    2 ... for each one more (its intervals straddled their targets); ``load``: concurrency or
    requests/s, ``label`` as the probe's (``c=64``); ``requests``: requests it sends
    (``None`` when it runs for ``duration_s`` seconds); ``probes_left_at_most``: the search's
    bound on the probes still to run, this one included
    (:meth:`~cleanslate.bench.CapacitySearch.probes_left_at_most`); ``max_extensions``: the
    most measurements a probe may add."""

    index: int
    extension: int
    load: float
    label: str
    requests: int | None
    duration_s: float | None
    probes_left_at_most: int
    max_extensions: int


async def partial_is_crash(level: LevelResult) -> tuple[str, str] | None:
    """A level that ended early (not by a stop request) lost its server."""
    if level.partial and level.partial_reason != "interrupted":
        return "crashed", level.partial_reason or "the level ended early"
    return None


def probe_load(search: CapacitySearch, value: float, template: OpenLoop | None
               ) -> ClosedLoop | OpenLoop:
    """The bench load of one probe: a closed loop of ``value`` requests in flight, or an open
    loop at ``value`` requests/s with the template's arrival process and cap."""
    if search.dimension == "concurrency":
        return ClosedLoop(concurrency=int(value))
    base = template or OpenLoop(rate=value)
    return base.model_copy(update={"rate": value})


def probe_requests(config: BenchConfig, search: CapacitySearch,
                   load: ClosedLoop | OpenLoop) -> int:
    """Requests of one measurement of a probe: the bench's count for the load, at least the
    fewest that can show the SLO's highest target met (:meth:`CapacitySLO.min_requests`), and
    for a closed loop at least its concurrency (fewer requests than slots never put the probe's
    load in flight: a fixed ``num_prompts`` of 40 would pass c=1024 at the load of c=40)."""
    least = load.concurrency if isinstance(load, ClosedLoop) else 1
    return max(config.prompts_for(load), search.slo.min_requests(), least)


async def find_max(
    config: BenchConfig,
    search: CapacitySearch,
    harness: Harness | None = None,
    *,
    warmup: int = 0,
    max_extensions: int = DEFAULT_MAX_EXTENSIONS,
    check_server: ServerCheck | None = None,
    on_probe: Callable[[Probe], None] | None = None,
    on_start: Callable[[ProbeStart], None] | None = None,
) -> CapacityResult:
    """Drive ``search`` to its end against ``config``'s server and return its answer.

    ``config``: the server, workload and client settings (its ``loads`` are ignored but for an
    open loop's arrival process, ``slo`` and ``limits`` are set from the search's SLO).
    ``harness``: the run's pool, tokenizer, live view, stop event and observers (every probe
    is observed like a level). ``warmup`` requests go before the first probe.
    ``check_server`` says after every measurement whether the server crashed (default: a
    level that ended early). ``on_probe`` receives each probe as it is decided, ``on_start``
    each measurement as it starts (:class:`ProbeStart`)."""
    harness = harness or Harness()
    tokenizer = harness.tokenizer
    if tokenizer is None and config.tokenizer:
        tokenizer = load_tokenizer(config.tokenizer)
    if harness.session is None:
        async with make_session(config) as own:
            return await find_max(config, search, harness.with_session(own, tokenizer),
                                  warmup=warmup, max_extensions=max_extensions,
                                  check_server=check_server, on_probe=on_probe,
                                  on_start=on_start)
    harness = harness.with_session(harness.session, tokenizer)
    stop = harness.stop
    check = check_server or partial_is_crash
    assert harness.session is not None
    server_config = await read_config_once(harness, harness.session, config)
    config, _fit = await fit_config(config, harness, server_config)  # a trace: to the context
    template = next((x for x in config.loads if isinstance(x, OpenLoop)), None)
    base = config.model_copy(update={"slo": search.slo.per_request(),
                                     "limits": search.slo.count_keys(), "num_prompts": None
                                     if config.duration_s is not None else config.num_prompts})
    reference: LevelResult | None = None
    probed: list[LevelResult] = []  # the levels of the probes before: each verdict reads them
    index = 0
    while (value := search.next_load()) is not None:
        if stop is not None and stop.is_set():
            search.stop(StopReason.INTERRUPTED)
            break
        load = probe_load(search, value, template)
        n = probe_requests(base, search, load)
        left = search.probes_left_at_most()
        cfg = base if base.duration_s is not None else base.model_copy(
            update={"num_prompts": n})
        measured: list[LevelResult] = []
        samples: list[dict[str, np.ndarray]] = []
        crash: tuple[str, str] | None = None
        probe: Probe | None = None
        for extension in range(max_extensions + 1):
            seed = config.seed + SEED_STRIDE * index + extension
            one = cfg.model_copy(update={"seed": seed})
            if on_start is not None:
                on_start(ProbeStart(index=index, extension=extension, load=value,
                                    label=load.label,
                                    requests=None if cfg.duration_s is not None else n,
                                    duration_s=cfg.duration_s, probes_left_at_most=left,
                                    max_extensions=max_extensions))
            prompts = generate(one.workload, one.prompts_for(load),
                               seed=level_seed(seed, load.label), tokenizer=tokenizer)
            level, sample = await _measure(
                one, load, harness, prompts,
                warmup if index == 0 and extension == 0 else 0, reference,
                tag=load.label if extension == 0 else f"{load.label} extension {extension}")
            measured.append(level)
            samples.append(sample)
            crash = await check(level)
            pooled = combine(measured, samples, max_error_rate=config.max_error_rate,
                             seed=seed) if len(measured) > 1 else level
            pooled = diagnosed(pooled, probed, server_config, config.observe.engine,
                               workload=config.workload, max_error_rate=config.max_error_rate)
            interrupted = stop is not None and stop.is_set()
            probe = probe_from_level(index, search.dimension, value, pooled, search.slo,
                                     measurements=len(measured), crash=crash,
                                     interrupted=interrupted and crash is None)
            if probe.verdict != ProbeVerdict.UNRESOLVED:
                break
        assert probe is not None
        if reference is None and probe.verdict not in (ProbeVerdict.CRASHED,
                                                       ProbeVerdict.INTERRUPTED):
            reference = measured[0]
        if probe.level is not None:
            probed.append(probe.level)
        search.record(probe)
        if on_probe is not None:
            on_probe(probe)
        index += 1
        if probe.verdict == ProbeVerdict.ERRORS and search.low is None and all(
                m.completed == 0 for m in measured):
            # Not one request answered, and none passed before: a server that answers
            # nothing (a wrong model name, a broken engine) is not made to by halving the
            # load, so the search ends here (nothing passes) instead of probing down to one.
            search.stop(StopReason.NOTHING_PASSES)
    return search.result().model_copy(update={"server_config": server_config})
