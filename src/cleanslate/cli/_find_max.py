"""``cleanslate bench --find-max``: the capacity search's options, run and rendering
(``docs/bench.md``, "Capacity under an SLO").

The options become a :class:`~cleanslate.bench.CapacitySearch` (:func:`build_search`; every
refusal names its option, exit 2), :func:`~cleanslate.bench.find_max` runs it, one line per
probe is printed on stderr as it is decided (:func:`probe_line`), then the probes in load order
(:func:`probe_table`) and the answer's summary. Exit codes (:func:`exit_code`): 0 the search
ended with an answer (a capacity, a crash above it included), 1 no answer, 2 bad input.

Imported when the command runs (the client stack comes with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cleanslate import __version__
from cleanslate.bench import (
    DEFAULT_MAX_LOAD,
    DEFAULT_START,
    MAX_CONCURRENCY,
    MIN_RATE,
    PER_REQUEST_KEYS,
    BenchConfig,
    CapacityResult,
    CapacitySearch,
    CapacitySLO,
    Endpoint,
    LevelResult,
    Probe,
    ProbeStart,
    ProbeVerdict,
    StopReason,
    WorkloadSpec,
    parse_slo_keys,
    worst_check,
)
from cleanslate.cli._render import duration_text
from cleanslate.errors import ExitCode, InputError
from cleanslate.models import FrozenStrict

if TYPE_CHECKING:
    import aiohttp
    from rich.console import Console

    from cleanslate.bench import ConfigReader, SampleFiles, ServerConfig

DIMENSIONS = ("concurrency", "rate")
#: The least warm-up before the first probe when ``--warmup`` is not given.
MIN_DEFAULT_WARMUP = 8
#: Stopping rules whose capacity is an answer (exit 0); any other is none (exit 1).
ANSWERED = frozenset({StopReason.TOLERANCE, StopReason.MAX_LOAD, StopReason.CRASHED})


#: Bytes of the end of a server log read to classify a crash.
LOG_TAIL_BYTES = 1 << 20


@dataclass(frozen=True)
class FindMaxPlan:
    """What the options asked for: the search (fresh, not yet run), the extensions of a
    straddling probe, the warm-up before the first probe, and the server's log (with its
    engine's crash patterns) to classify a crash from."""

    search: CapacitySearch
    max_extensions: int
    warmup: int
    server_log: Path | None = None
    engine: str = "command"


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text, read as the run files are
    (:func:`cleanslate.hosts.files.read_under`: a regular file of this user, opened without
    blocking and without following a link, so a log swapped for a FIFO or a link after the
    options were checked is not read); ``""`` when it cannot be read or is refused."""
    from cleanslate.hosts.files import read_under

    absolute = path.absolute()
    try:
        data = read_under(str(absolute.parent), str(absolute), max_bytes=limit, tail=True)
    except OSError:
        return ""
    return data.decode(errors="replace")


def log_check(path: Path, engine: str) -> Callable[[LevelResult], Awaitable[
        tuple[str, str] | None]]:
    """A crash check for :func:`~cleanslate.bench.find_max`: a probe that ended early (not by
    Ctrl-C) lost its server, and its cause is what the engine's crash patterns find in the
    log (``python_exception: AttributeError: ...``, as a study classifies a crash), else the
    client's own reason (``server unreachable at ...``)."""
    from cleanslate.engines import classify_log
    from cleanslate.redact import redact_text

    async def check(level: LevelResult) -> tuple[str, str] | None:
        if not level.partial or level.partial_reason == "interrupted":
            return None
        # the log may still be written as the server goes down
        await asyncio.sleep(0.2)
        crash = classify_log(engine, read_tail(path))
        if crash is None:
            return "crashed", level.partial_reason or "the level ended early"
        return str(crash.cause), redact_text(crash.line.strip())

    return check


def number_text(x: float) -> str:
    """``8`` for 8.0, ``2.5`` for 2.5 (a load as the bench's options write it)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number(value: float, option: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"must be a positive number, not {value:g}", where=option)
    return value


def build_slo(slo: str | None, attainment: float | None, confidence: float) -> CapacitySLO:
    """``--slo`` with ``--slo-attainment`` and ``--confidence`` as the search's SLO. Without
    an attainment target every key is a statistic (``p99_tpot_ms``); with one every key is a
    per-request limit (``tpot_ms``)."""
    if slo is None or not slo.strip():
        raise InputError("--find-max needs the SLOs it searches under", where="--slo",
                         hint="e.g. --slo p99_tpot_ms=200, or --slo tpot_ms=50 "
                         "--slo-attainment 0.99")
    try:
        limits = parse_slo_keys(slo)
    except ValueError as exc:
        raise InputError(str(exc), where="--slo") from None
    per_request = [k for k in limits if k in PER_REQUEST_KEYS]
    statistics = [k for k in limits if k not in PER_REQUEST_KEYS]
    if attainment is None and per_request:
        raise InputError(
            f"{', '.join(per_request)} is a per-request limit: it needs an attainment target",
            where="--slo",
            hint="add --slo-attainment 0.99 (the share of requests that must meet every "
            "limit), or give a statistic instead: p99_tpot_ms=200")
    if attainment is not None and statistics:
        raise InputError(
            f"{', '.join(statistics)} is a statistic: with --slo-attainment the SLOs are "
            "per-request limits", where="--slo-attainment",
            hint="give ttft_ms=, tpot_ms=, e2e_ms= with --slo-attainment, or leave "
            "--slo-attainment out (each statistic is then met by its own share: p99: 99 %)")
    if attainment is not None and not 0 < attainment < 1:
        raise InputError(f"a share between 0 and 1 (0.99 is 99 %), not {attainment:g}",
                         where="--slo-attainment")
    if not 0.5 <= confidence <= 0.999:
        raise InputError(f"a level between 0.5 and 0.999 (0.95 is 95 %), not {confidence:g}",
                         where="--confidence")
    try:
        return CapacitySLO(limits=limits, attainment=attainment, confidence=confidence)
    except ValidationError as exc:
        raise InputError.from_validation(exc, where="--slo") from None


def build_plan(
    *,
    dimension: str,
    slo: str | None,
    attainment: float | None,
    start: float | None,
    max_load: float | None,
    tolerance: float,
    max_probes: int,
    max_extensions: int,
    cliff: float,
    confidence: float,
    warmup: int | None,
    max_concurrency: int | None = None,
    server_log: Path | None = None,
    engine: str | None = None,
) -> FindMaxPlan:
    """The search the ``--find-max`` options ask for; :class:`InputError` naming the option
    on bad input. Without ``warmup``: the start's concurrency (an open loop's cap,
    ``max_concurrency``, when it has one), at least :data:`MIN_DEFAULT_WARMUP`."""
    if dimension not in DIMENSIONS:
        raise InputError(f"{dimension!r} is not a dimension to search", where="--find-max",
                         hint="concurrency (closed loop) or rate (open loop, requests/s)")
    capacity_slo = build_slo(slo, attainment, confidence)
    first = _number(start, "--start") if start is not None else DEFAULT_START[dimension]
    cap = _number(max_load, "--max-load") if max_load is not None else DEFAULT_MAX_LOAD[dimension]
    for value, option in ((first, "--start"), (cap, "--max-load")):
        if dimension == "concurrency" and not float(value).is_integer():
            raise InputError(f"a concurrency is a whole number of requests, not {value:g}",
                             where=option)
        if dimension == "concurrency" and value > MAX_CONCURRENCY:
            raise InputError(f"must be at most {MAX_CONCURRENCY} requests in flight, not "
                             f"{value:g}", where=option)
        if dimension == "rate" and value < MIN_RATE:
            raise InputError(f"must be at least {MIN_RATE:g} requests/s, not {value:g}",
                             where=option)
    if first > cap:
        raise InputError(f"the start ({first:g}) is above the most load ({cap:g})",
                         where="--start", hint="lower --start or raise --max-load")
    if not 0 < tolerance < 1:
        raise InputError(f"a share between 0 and 1 (0.1 is 10 %), not {tolerance:g}",
                         where="--tolerance")
    if max_probes < 1:
        raise InputError(f"must be at least 1, not {max_probes}", where="--max-probes")
    if max_extensions < 0:
        raise InputError(f"must be at least 0, not {max_extensions}", where="--max-extensions")
    if not 0 < cliff < 1:
        raise InputError(f"a share between 0 and 1 (0.2 is a fall of 20 %), not {cliff:g}",
                         where="--cliff")
    search = CapacitySearch(dimension, capacity_slo,  # type: ignore[arg-type]
                            start=first, max_load=cap, tolerance=tolerance,
                            max_probes=max_probes, cliff=cliff)
    if warmup is None:
        slots = search.start if dimension == "concurrency" else (max_concurrency or 0)
        warmup = max(MIN_DEFAULT_WARMUP, math.ceil(slots))
    if engine is not None:
        from cleanslate.engines import engine_class

        try:
            engine_class(engine)
        except InputError as exc:
            raise InputError(exc.message, where="--engine", hint=exc.hint) from None
    if server_log is not None and not server_log.is_file():
        raise InputError(f"{server_log} is not a file", where="--server-log",
                         hint="the log the server writes (cleanslate serve: its run's "
                         "server.log)")
    return FindMaxPlan(search=search, max_extensions=max_extensions, warmup=warmup,
                       server_log=server_log, engine=engine or "command")


# --- rendering --------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def statistic_keys(slo: CapacitySLO) -> list[str]:
    """The statistics shown for an SLO: its keys, or with an attainment target the p99 of
    each limited metric (``tpot_ms`` -> ``p99_tpot_ms``)."""
    if slo.attainment is None:
        return list(slo.limits)
    names = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2el_ms"}
    return ["p99_" + names[key] for key in slo.limits]


def statistics(probe: Probe, slo: CapacitySLO) -> list[tuple[str, float | None]]:
    """The SLO's statistics at a probe (:func:`statistic_keys`): each key's own value
    (``p99_tpot_ms``), or with an attainment target the p99 of each limited metric."""
    if slo.attainment is None:
        return [(c.key, c.value) for c in probe.checks]
    if probe.level is None:
        return []
    dumped = probe.level.model_dump()
    out: list[tuple[str, float | None]] = []
    for name in statistic_keys(slo):
        value = dumped.get(name)
        out.append((name, float(value) if isinstance(value, int | float) else None))
    return out


def _stats_text(probe: Probe, slo: CapacitySLO) -> str:
    return ", ".join(f"{k} {'-' if v is None else f'{v:.1f}'}" for k, v in statistics(probe, slo))


def _worst_text(probe: Probe) -> str:
    worst = worst_check(probe.checks)
    if worst is None or worst.met is None or worst.n is None:
        return "-"
    return (f"{worst.key} {worst.met}/{worst.n} = {_pct(worst.share)} "
            f"[{_pct(worst.low)}, {_pct(worst.high)}] vs {_pct(worst.target)}")


def probe_line(probe: Probe, slo: CapacitySLO) -> Text:
    """``c=16: pass, 381 requests in 1 measurement; p99_tpot_ms 381/381 = 100.0% [99.0%,
    100.0%] vs 99.0%; p99_tpot_ms 5.2; 12,345 tok/s`` (plus the cause): plain text, so the
    server's words in a cause are never read as markup."""
    style = {ProbeVerdict.PASS: "green", ProbeVerdict.FAIL: "yellow",
             ProbeVerdict.UNRESOLVED: "magenta"}.get(probe.verdict, "red")
    line = Text(f"{probe.label}: ")
    line.append(probe.verdict.value, style=style)
    many = "s" if probe.measurements != 1 else ""
    line.append(f", {probe.requests} requests in {probe.measurements} measurement{many}")
    worst = _worst_text(probe)
    if worst != "-":
        line.append(f"; {worst}")
    stats = _stats_text(probe, slo)
    if stats:
        line.append(f"; {stats}")
    if probe.output_throughput is not None:
        line.append(f"; {probe.output_throughput:,.0f} tok/s")
    if probe.cause:
        line.append(f"; {probe.cause}" + (f": {probe.detail}" if probe.detail else ""))
    if probe.level is not None and probe.level.bottleneck is not None:
        from cleanslate.bench import bound_by

        line.append(f"; bound by {bound_by(probe.level.bottleneck)}")
    return line


@dataclass
class ProbeClock:
    """Times the search for its progress lines: since when it runs, and per decided probe its
    load, requests, measurements and seconds (all its measurements together).

    A measurement's estimate (:meth:`estimate`) comes from the probes measured so far: for a
    ``duration_s`` level, that duration plus the overhead the measured probes showed; for a
    number of requests, the seconds per request of the highest measured load at or below this
    one (a higher load serves at least as fast: the estimate errs long), else of the lowest,
    scaled by the loads (a lower load serves its requests proportionally slower). Before any
    probe was measured there is none."""

    started: float = field(default_factory=time.monotonic)
    measured: list[tuple[float, int, int, float]] = field(default_factory=list)
    _probe_started: float | None = None

    def start(self, start: ProbeStart) -> None:
        if start.extension == 0:
            self._probe_started = time.monotonic()

    def decided(self, probe: Probe) -> None:
        if self._probe_started is not None and probe.requests:
            self.measured.append((probe.load, probe.requests, max(1, probe.measurements),
                                  time.monotonic() - self._probe_started))
        self._probe_started = None

    def estimate(self, start: ProbeStart) -> float | None:
        """Seconds the measurement ``start`` is expected to take, or ``None`` (nothing
        measured yet)."""
        if not self.measured:
            return None
        if start.duration_s is not None:
            overhead = sorted(max(0.0, s / m - start.duration_s)
                              for _, _, m, s in self.measured)[len(self.measured) // 2]
            return start.duration_s + overhead
        if not start.requests:
            return None
        below = [x for x in self.measured if x[0] <= start.load]
        if below:
            load, requests, _, seconds = max(below, key=lambda x: x[0])
            return start.requests * seconds / requests
        load, requests, _, seconds = min(self.measured, key=lambda x: x[0])
        return start.requests * seconds / requests * load / start.load

    def line(self, start: ProbeStart) -> Text:
        """``probe 3: c=64, 381 requests (about 25 s; 1 min 10 s so far, about 2 min left at
        most; estimates from the probes so far)``; a probe measured again says so."""
        what = f"probe {start.index + 1}: {start.label}"
        if start.extension:
            what += (f" measured again ({start.extension + 1} of at most "
                     f"{start.max_extensions + 1}: its intervals straddle their targets)")
        if start.requests is not None:
            what += f", {start.requests:,} {'more ' if start.extension else ''}requests"
        elif start.duration_s is not None:
            what += f", {start.duration_s:g} s of requests"
        so_far = duration_text(time.monotonic() - self.started)
        estimate = self.estimate(start)
        if estimate is None:
            return Text(f"{what} ({so_far} so far; no estimate until a probe has been "
                        f"measured; at most {start.probes_left_at_most} probes)")
        left = estimate * max(1, start.probes_left_at_most)
        return Text(f"{what} (about {duration_text(estimate)}; {so_far} so far, about "
                    f"{duration_text(left)} left at most; estimates from the probes so far)")


def _share_cell(probe: Probe) -> tuple[str, str, str]:
    """The worst check's key, ``met/n share [low-high]`` (in %) and target, for the table."""
    worst = worst_check(probe.checks)
    if worst is None or worst.met is None or worst.n is None:
        return "-", "-", "-"
    low = "-" if worst.low is None else f"{worst.low * 100:.1f}"
    high = "-" if worst.high is None else f"{worst.high * 100:.1f}"
    share = "-" if worst.share is None else f"{worst.share * 100:.1f}"
    target = "-" if worst.target is None else f"{worst.target * 100:g}"
    return worst.key, f"{worst.met}/{worst.n} {share} [{low}-{high}]", target


def probe_table(result: CapacityResult) -> Table:
    """The probes in load order: verdict, requests, measurements, the worst check's share with
    its interval against the target, the SLO's statistics, throughput, goodput, what the
    observers saw (running, waiting, KV %, GPU % / W, as in bench's table: only when some
    probe has them), ``bound by`` (the probe's bottleneck verdict, when some probe has one:
    :func:`~cleanslate.bench.bound_by`), cause. With one SLO its key is in the title, not in
    a column."""
    from cleanslate.bench import bound_by, observed_cells, observed_headers, observed_kinds

    what = "concurrency" if result.dimension == "concurrency" else "rate (req/s)"
    keys = list(result.slo.limits) if result.slo.attainment is None else ["attainment"]
    one = len(keys) == 1
    table = Table(title=escape(
        f"capacity search on {what}: {', '.join(keys) if one else 'SLOs'}, "
        f"tolerance {result.tolerance:.0%}, {result.slo.confidence:.0%} intervals"))
    stat_keys = statistic_keys(result.slo)
    cols = [("load", False), ("verdict", False), ("requests", True), ("meas.", True),
            *([] if one else [("worst check", False)]), ("met, % [interval]", False),
            ("target %", True),
            (stat_keys[0] if len(stat_keys) == 1 else "SLO statistics (ms)", False),
            ("out tok/s", True), ("goodput/s", True)]
    metrics, gpu = observed_kinds([p.level for p in result.probes])
    diagnosed = any(p.level is not None and p.level.bottleneck is not None
                    for p in result.probes)
    cols += [(h, True) for h in observed_headers(metrics, gpu)]
    cols += [("bound by", False)] * diagnosed + [("cause", False)]
    for col, right in cols:
        table.add_column(escape(col), justify="right" if right else "left")
    for p in sorted(result.probes, key=lambda p: (p.load, p.index)):
        stats = statistics(p, result.slo)
        shown = (("-" if stats[0][1] is None else f"{stats[0][1]:.1f}") if len(stats) == 1
                 else _stats_text(p, result.slo) or "-")
        key, met, target = _share_cell(p)
        table.add_row(
            escape(p.label), p.verdict.value, str(p.requests), str(p.measurements),
            *([] if one else [escape(key)]), escape(met), escape(target), escape(shown),
            "-" if p.output_throughput is None else f"{p.output_throughput:,.0f}",
            "-" if p.request_goodput is None else f"{p.request_goodput:.2f}",
            *(observed_cells(p.level, metrics, gpu) if p.level is not None
              else ["-"] * len(observed_headers(metrics, gpu))),
            *([escape(bound_by(p.level.bottleneck if p.level is not None else None))]
              if diagnosed else []),
            escape(p.cause or "-"))
    return table


def exit_code(result: CapacityResult) -> ExitCode:
    """0 when the search ended with an answer (a capacity, narrowed to the tolerance, every
    probe to the cap passing, or bounded by a crash above it), else 1 (nothing passed, the
    server was unreachable at the first probe, interrupted, out of probes)."""
    if result.capacity is not None and result.stopped_by in ANSWERED:
        return ExitCode.OK
    return ExitCode.FAILED


# --- the JSON document ------------------------------------------------------------------------
class FindMaxDocument(FrozenStrict):
    """``cleanslate bench --find-max --json``: where and what was searched, and the answer
    with every probe (each with its measured level)."""

    tool: Literal["cleanslate bench --find-max"] = "cleanslate bench --find-max"
    version: str
    started_at: str
    finished_at: str
    url: str
    model: str
    endpoint: Endpoint
    workload: WorkloadSpec
    seed: int
    warmup: int
    max_extensions: int
    find_max: CapacityResult
    bench_id: str | None = None  # its id in the store (None: not recorded, --no-store)
    run_id: str | None = None  # the recorded run it measured (bench --run; None: --url)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# --- the run ----------------------------------------------------------------------------------
def config_reader(config: BenchConfig) -> ConfigReader | None:
    """``--engine``'s own reading of the configuration in effect (where that engine says it,
    nothing asked: the bench did not launch it); ``None``: the flavour is found from what the
    server answers."""
    name = config.observe.engine
    if name is None:
        return None
    from cleanslate.engines import get_engine

    adapter = get_engine(name)

    async def read(session: aiohttp.ClientSession, url: str) -> ServerConfig:
        return await adapter.read_config(session, url)

    return read


async def _search(config: BenchConfig, plan: FindMaxPlan, *, live: Console | None,
                  on_probe: object, on_start: object = None,
                  samples: SampleFiles | None = None) -> CapacityResult:
    from cleanslate.bench import Harness, LiveView, discard_samples, find_max
    from cleanslate.cli._common import console_err

    def note(text: str) -> None:  # a trace fitted to the context: said before the first probe
        console_err.print(Text(f"trace: {text}"), soft_wrap=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    kwargs = {"warmup": plan.warmup, "max_extensions": plan.max_extensions,
              "on_probe": on_probe, "on_start": on_start,
              "check_server": None if plan.server_log is None
              else log_check(plan.server_log, plan.engine)}
    if live is None:
        return await find_max(config, plan.search,
                              Harness(stop=stop, on_samples=samples or discard_samples,
                                      read_config=config_reader(config), on_note=note),
                              **kwargs)  # type: ignore[arg-type]
    with LiveView(live) as view:
        return await find_max(config, plan.search,
                              Harness(on_progress=view.on_progress, stop=stop,
                                      on_samples=samples or discard_samples,
                                      read_config=config_reader(config), on_note=note),
                              **kwargs)  # type: ignore[arg-type]


def run(config: BenchConfig, plan: FindMaxPlan, *, json_out: str | None, show_live: bool,
        console: Console, console_err: Console,
        samples: SampleFiles | None = None) -> tuple[ExitCode, str]:
    """Run the search, print it, and return the exit code and the JSON document (made with
    or without ``--json``: the bench is recorded from it). Probe lines go to stderr unless the
    document goes to stdout.
    ``samples``: where each probe's observers' raw samples go (``bench --observe-dir``)."""
    to_stdout = json_out == "-"
    slo = plan.search.slo

    clock = ProbeClock()

    def on_start(start: ProbeStart) -> None:
        # On stderr, TTY or not and with --json - too: a search can run for many minutes.
        clock.start(start)
        console_err.print(clock.line(start), soft_wrap=True, highlight=False)

    def on_probe(probe: Probe) -> None:
        clock.decided(probe)
        if not to_stdout:
            console_err.print(probe_line(probe, slo), soft_wrap=True)
            if probe.level is not None:
                for kind, detail in probe.level.error_details.items():
                    if detail:  # the server's own words, as text (never markup)
                        console_err.print(Text(f"  first {kind}: {detail}"), soft_wrap=True)

    started = _now()
    result = asyncio.run(_search(config, plan, live=console_err if show_live else None,
                                 on_probe=on_probe, on_start=on_start, samples=samples))
    finished = _now()
    document = FindMaxDocument(
        version=__version__, started_at=started, finished_at=finished, url=config.url,
        model=config.model, endpoint=config.endpoint, workload=config.workload,
        seed=config.seed, warmup=plan.warmup, max_extensions=plan.max_extensions,
        find_max=result).model_dump_json(indent=2)
    human = console_err if to_stdout else console
    if result.probes:
        human.print(probe_table(result))
    from cleanslate.bench import bound_lines

    ordered = sorted(result.probes, key=lambda p: (p.load, p.index))
    for said in bound_lines([p.level for p in ordered]):  # evidence: text, never markup
        human.print(Text(said), soft_wrap=True)
    for probe in result.probes:
        for warning in probe.warnings:
            console_err.print(Text(f"warning: {probe.label}: {warning}", style="yellow"),
                              soft_wrap=True)
    from cleanslate.bench import observation_notes

    for note in observation_notes([p.level for p in result.probes if p.level is not None]):
        console_err.print(Text(note, style="dim"), soft_wrap=True)
    code = exit_code(result)
    head = "DONE" if code == ExitCode.OK else "NO ANSWER"
    line = Text(f"{head}: ", style="bold green" if code == ExitCode.OK else "bold red")
    line.append(result.summary())
    human.print(line, soft_wrap=True)
    for said in result.server_config.report() if result.server_config is not None else ():
        human.print(Text(f"server config: {said}"), soft_wrap=True)
    first = result.probes[0] if result.probes else None
    if (first is not None and first.verdict == ProbeVerdict.CRASHED and first.level is not None
            and first.level.completed == 0):
        console_err.print(Text(f"no request to {config.url} completed at the first probe: is "
                               "the server running there (and --url right)?", style="red"),
                          soft_wrap=True)
    return code, document


__all__ = ["FindMaxDocument", "FindMaxPlan", "build_plan", "build_slo", "exit_code",
           "log_check", "number_text", "probe_line", "probe_table", "read_tail", "run",
           "statistic_keys", "statistics"]
