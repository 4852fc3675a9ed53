"""The rich live view of a running benchmark and the summary table printed after it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from time import perf_counter
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cleanslate.bench._bound_text import bound_by, bound_line
from cleanslate.bench._client import printable
from cleanslate.bench._models import BenchResult, LevelResult
from cleanslate.bench._runner import LevelProgress


class LiveView:
    """Shows the current level: requests done, in flight, output tokens/s, errors, achieved vs
    target rate; above it, each level that ended with its bottleneck verdict. Use as a context
    manager and pass :meth:`on_progress` and :meth:`on_level` to ``run_benchmark`` (the
    harness's ``on_progress`` and ``on_level``)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.current: LevelProgress | None = None
        #: one line per level that ended: ``c=64 bound by running_cap: <evidence>: <advice>``
        self.ended: list[str] = []
        self._live = Live(console=console, refresh_per_second=4, get_renderable=self.render)

    def on_progress(self, progress: LevelProgress) -> None:
        self.current = progress

    def on_level(self, level: LevelResult) -> None:
        """A level ended: keep its verdict's line (none for a level not diagnosed)."""
        if level.bottleneck is not None:
            self.ended.append(bound_line(level.label, level.bottleneck))

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def render(self) -> RenderableType:
        p = self.current
        ended = [Text(line, style="dim") for line in self.ended]
        if p is None:
            return Group(*ended, "starting...")
        elapsed = max(perf_counter() - p.t_start, 1e-9)
        total = f"/{p.total}" if p.total is not None else f" ({elapsed:.0f}/{p.duration_s:.0f} s)"
        errors = ", ".join(f"{k}={v}" for k, v in sorted(p.errors.items())) or "none"
        rate = f"{p.achieved_rate():.2f} req/s"
        if p.target_rate is not None:
            rate += f" (target {p.target_rate:g})"
        table = Table.grid(padding=(0, 2))
        table.add_row("level", escape(p.label))
        table.add_row("done", f"{p.done + p.failed}{total}  in flight {p.in_flight}")
        table.add_row("output", f"{p.output_tokens / elapsed:,.0f} tok/s  ({p.chunks[0]:,} chunks)")
        table.add_row("rate", rate)
        table.add_row("errors", escape(errors))
        seen = live_readings(p.watching)
        if seen:
            table.add_row("server", escape(seen))
        return Group(*ended, table)


def live_readings(observers: Sequence[object]) -> str:
    """The newest readings of a level's observers as one line for the live view: running and
    waiting requests, KV usage, GPU utilization and power. An observer offers them through an
    optional ``latest()`` returning ``{reading: value}`` (``running``, ``waiting`` in
    requests; ``kv_usage`` a fraction; ``gpu_util_pct`` in percent, ``power_w`` in watts) or
    ``{"unreadable": reason}``; one without ``latest()`` shows nothing. Empty when no reading
    is known yet."""
    values: dict[str, float] = {}
    reasons: list[str] = []
    for observer in observers:
        latest = getattr(observer, "latest", None)
        if not callable(latest):
            continue
        try:
            got = latest()
        except Exception:  # a reading is a courtesy: never the live view's end
            continue
        if not isinstance(got, Mapping):
            continue
        for name, value in got.items():
            if name == "unreadable" and isinstance(value, str):
                reasons.append(value)
            elif isinstance(value, int | float) and math.isfinite(value):
                values[str(name)] = float(value)
    parts: list[str] = []
    if "running" in values or "waiting" in values:
        parts.append(f"running {_fmt(values.get('running'), '.0f')}  "
                     f"waiting {_fmt(values.get('waiting'), '.0f')}")
    if "kv_usage" in values:
        parts.append(f"KV {values['kv_usage']:.0%}")
    if "gpu_util_pct" in values or "power_w" in values:
        parts.append(f"GPU {_fmt(values.get('gpu_util_pct'), '.0f')} % / "
                     f"{_fmt(values.get('power_w'), ',.0f')} W")
    if not parts and reasons:
        parts.append(f"unreadable: {printable(reasons[0], 80)}")
    return "  ".join(parts)


def observed_kinds(levels: Sequence[LevelResult | None]) -> tuple[bool, bool]:
    """Whether some level has readable engine metrics, and some GPU a reading: which of the
    observers' columns a table of ``levels`` shows."""
    known = [lv for lv in levels if lv is not None]
    metrics = any(lv.server_metrics is not None and lv.server_metrics.unreadable is None
                  and lv.server_metrics.note is None for lv in known)
    return metrics, any(gpu_totals(lv) != (None, None) for lv in known)


def observed_headers(metrics: bool, gpu: bool) -> list[str]:
    """The headers of :func:`observed_cells`."""
    return [*(["running", "waiting", "KV %"] if metrics else []), *(["GPU % / W"] if gpu else [])]


def observed_cells(lv: LevelResult, metrics: bool = True, gpu: bool = True) -> list[str]:
    """The observers' cells of one level's row (see :func:`summary_table`): ``running``,
    ``waiting``, ``KV %`` with ``metrics``, ``GPU % / W`` with ``gpu``."""
    cells: list[str] = []
    sm = lv.server_metrics
    if metrics:
        ok = sm is not None and sm.unreadable is None and sm.note is None
        for gauge in (sm.running if sm and ok else None, sm.waiting if sm and ok else None):
            cells.append("-" if gauge is None else f"{gauge.mean:,.0f}/{gauge.max:,.0f}")
        kv = sm.kv_usage if sm is not None and ok else None
        cells.append("-" if kv is None else f"{kv.mean:.0%}/{kv.max:.0%}")
    if gpu:
        util, power = gpu_totals(lv)
        cells.append("-" if util is None and power is None else
                     f"{_fmt(util, '.0f')} / {_fmt(power, ',.0f')}")
    return cells


def gpu_totals(lv: LevelResult) -> tuple[float | None, float | None]:
    """A level's GPUs in two figures: the mean utilization over its readable GPUs (percent)
    and the sum of their mean power (watts); ``None`` where no GPU gave the reading."""
    readable = [g for g in lv.gpu or () if g.unreadable is None]
    utils = [g.utilization_pct.mean for g in readable if g.utilization_pct is not None]
    powers = [g.power_w.mean for g in readable if g.power_w is not None]
    return (sum(utils) / len(utils) if utils else None,
            sum(powers) if powers else None)


def observation_notes(result: BenchResult | Sequence[LevelResult]) -> list[str]:
    """What the observers could not give, each said once: ``no engine metrics`` (an engine
    without an endpoint: a note, not a failure), the reason engine metrics or a GPU were
    unreadable, with the levels it held for (a bench result's levels, or a search's probe
    levels)."""
    levels = result.levels if isinstance(result, BenchResult) else tuple(result)
    notes: dict[str, list[str]] = {}
    for lv in levels:
        sm = lv.server_metrics
        if sm is not None and sm.note is not None:
            notes.setdefault(f"engine metrics: {sm.note}", []).append(lv.label)
        elif sm is not None and sm.unreadable is not None:
            notes.setdefault(f"engine metrics unreadable: {sm.unreadable}", []).append(lv.label)
        for g in lv.gpu or ():
            if g.unreadable is not None:
                notes.setdefault(f"GPU {g.index} unreadable: {g.unreadable}",
                                 []).append(lv.label)
            elif g.note is not None:
                notes.setdefault(f"GPU {g.index}: {g.note}", []).append(lv.label)
    out = []
    for text, labels in notes.items():
        where = ("every level" if len(labels) == len(levels) and len(labels) > 1
                 else ", ".join(labels))
        out.append(f"{text} ({where})")
    return out


def summary_table(result: BenchResult) -> Table:
    """One row per level: the figures a user reads first. A level of several repeats shows
    ``mean ± half-width`` of the 95 % interval (the ``n`` column says how many repeats); a
    level that is not a throughput result says ``(invalid)``, one whose steady window was
    short ``(not steady)``.

    What the observers saw, in columns only when some level has it: ``running`` and
    ``waiting`` (requests, ``mean/max`` over the steady window), ``KV %`` (``mean/max``) from
    ``LevelResult.server_metrics``; ``GPU % / W`` (mean utilization over the GPUs / their
    summed mean power) from ``LevelResult.gpu``. A level without them shows ``-``; why is in
    :func:`observation_notes`, said once. ``bound by``: the level's bottleneck verdict
    (``running_cap`` clear, ``compute?`` likely, ``unknown``; :func:`~cleanslate.bench.
    bound_by`), when some level was diagnosed; its evidence and advice are the lines
    :func:`~cleanslate.bench.bound_lines` gives, printed under the table."""
    table = Table(title=escape(f"{result.model} @ {result.url} ({result.endpoint})"))
    with_slo = not result.slo.is_empty()
    repeated = any(lv.n_repeats > 1 for lv in result.levels)
    cols = ["level", *(["n"] if repeated else []), "ok", "err", "s", "req/s", "out tok/s",
            "TTFT ms p50/p99", "TPOT ms p50/p99"]
    cols += ["ITL ms p50", *(["goodput/s"] if with_slo else []), "steady", "cpu"]
    metrics, gpu = observed_kinds(result.levels)
    cols += observed_headers(metrics, gpu)
    diagnosed = any(lv.bottleneck is not None for lv in result.levels)
    cols += ["bound by"] if diagnosed else []
    for col in cols:
        table.add_column(col, justify="left" if col in ("level", "bound by") else "right")
    for lv in result.levels:
        flags = ""
        if lv.partial:
            flags += " [red](partial)[/]"
        elif not lv.valid:
            flags += " [red](invalid)[/]"
        if lv.steady_ok is False:
            flags += " [yellow](not steady)[/]"
        cells = [
            escape(lv.label) + flags,
            *([str(lv.n_repeats)] if repeated else []),
            str(lv.completed),
            str(lv.failed),
            f"{lv.duration:.1f}",
            _pm(lv, "request_throughput", lv.request_throughput, ".2f"),
            _pm(lv, "output_throughput", lv.output_throughput, ",.0f"),
            _pair(lv, "ttft"),
            _pair(lv, "tpot"),
            _pm(lv, "median_itl_ms", lv.itl_ms.median, ".1f"),
        ]
        if with_slo:
            cells.append(_pm(lv, "request_goodput", lv.request_goodput, ".2f"))
        cells.append("-" if lv.steady_share is None else f"{lv.steady_share:.0%}")
        cells.append(f"{lv.client_cpu_util:.0%}")
        cells += observed_cells(lv, metrics, gpu)
        if diagnosed:
            cells.append(escape(bound_by(lv.bottleneck)))
        table.add_row(*cells)
    return table


def detail_tables(result: BenchResult) -> list[Table]:
    """What a level holds beyond its row: a trace's column mapping and selection, the schedule
    lag of open loops and replays, a conversation's turns, a ramp's windows."""
    out: list[Table] = []
    trace = result.trace
    if trace is not None:
        table = Table(title=escape(f"trace {trace.path} ({trace.format}): {trace.rows_used:,} "
                                   f"of {trace.rows_read:,} requests"))
        table.add_column("column")
        table.add_column("read as")
        for column, meaning in trace.columns.items():
            table.add_row(escape(column), escape(meaning))
        share = trace.expected_cached_share
        table.add_row("selection", escape(
            f"start {trace.start:g} s, duration {_fmt(trace.duration, 'g')} s, sample "
            f"{trace.sample:g}, speedup {trace.speedup:g}: {_fmt(trace.rate, '.2f')} req/s"
            f"{'' if share is None else f', cache share predicted {share:.1%}'}"))
        if trace.fit is not None:  # the server's words (a source) are text, never markup
            table.add_row(f"fit={trace.fit.mode}", escape(trace.fit.line()))
        out.append(table)
    lagged = [lv for lv in result.levels if lv.schedule_lag_ms is not None]
    if lagged:
        table = Table(title="send lag against the schedule (ms)")
        for col in ("level", "p50", "p99", "max", "cached / predicted tokens"):
            table.add_column(col, justify="right" if col != "level" else "left")
        for lv in lagged:
            lag = lv.schedule_lag_ms
            assert lag is not None
            table.add_row(escape(lv.label), _fmt(lag.median, ".2f"), _fmt(lag.p99, ".2f"),
                          _fmt(lag.max, ".2f"),
                          f"{_fmt(lv.cached_prompt_tokens, ',')} / "
                          f"{_fmt(lv.expected_cached_prompt_tokens, ',')}")
        out.append(table)
    for lv in result.levels:
        if lv.turns:
            table = Table(title=escape(f"{lv.label}: per turn"))
            for col in ("turn", "ok", "err", "input tok", "TTFT ms p50/p99", "E2E ms p50",
                        "cached tok", "cached"):
                table.add_column(col, justify="right")
            for t in lv.turns:
                table.add_row(str(t.turn), str(t.requests), str(t.failed),
                              _fmt(t.mean_input_tokens, ",.0f"),
                              f"{_fmt(t.median_ttft_ms)}/{_fmt(t.p99_ttft_ms)}",
                              _fmt(t.median_e2el_ms), _fmt(t.cached_prompt_tokens, ","),
                              "-" if t.cached_share is None else f"{t.cached_share:.0%}")
            out.append(table)
        if lv.windows:
            table = Table(title=escape(f"{lv.label}: per window"))
            for col in ("s", "target", "sent", "in flight", "req/s", "out tok/s",
                        "TTFT ms p50/p99", "TPOT ms p50/p99"):
                table.add_column(col, justify="right")
            for w in lv.windows:
                table.add_row(f"{w.start_s:g}-{w.end_s:g}", f"{w.target:.3g}", str(w.sent),
                              f"{w.in_flight:.1f}", f"{w.request_throughput:.2f}",
                              f"{w.output_throughput:,.0f}",
                              f"{_fmt(w.median_ttft_ms)}/{_fmt(w.p99_ttft_ms)}",
                              f"{_fmt(w.median_tpot_ms)}/{_fmt(w.p99_tpot_ms)}")
            out.append(table)
    return out


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _pm(lv: LevelResult, key: str, value: float | None, spec: str) -> str:
    """``value`` and, for a repeated level, ``± half-width`` of its interval (the JSON has
    the interval's own ends: a percentile's bootstrap interval need not be symmetric)."""
    low, high = lv.interval(key)
    if value is None or low is None or high is None:
        return _fmt(value, spec)
    return f"{format(value, spec)} ± {format((high - low) / 2, spec)}"


def _pair(lv: LevelResult, metric: str) -> str:
    stats = getattr(lv, f"{metric}_ms")
    return (f"{_pm(lv, f'median_{metric}_ms', stats.median, '.1f')}/"
            f"{_pm(lv, f'p99_{metric}_ms', stats.p99, '.1f')}")
