"""The rich live view of a running benchmark and the summary table printed after it."""

from __future__ import annotations

from time import perf_counter
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from cleanslate.bench._models import BenchResult, LevelResult
from cleanslate.bench._runner import LevelProgress


class LiveView:
    """Shows the current level: requests done, in flight, output tokens/s, errors, achieved vs
    target rate. Use as a context manager and pass :meth:`on_progress` to ``run_benchmark``."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.current: LevelProgress | None = None
        self._live = Live(console=console, refresh_per_second=4, get_renderable=self.render)

    def on_progress(self, progress: LevelProgress) -> None:
        self.current = progress

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
        if p is None:
            return "starting..."
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
        return Group(table)


def summary_table(result: BenchResult) -> Table:
    """One row per level: the figures a user reads first. A level of several repeats shows
    ``mean ± half-width`` of the 95 % interval (the ``n`` column says how many repeats); a
    level that is not a throughput result says ``(invalid)``, one whose steady window was
    short ``(not steady)``."""
    table = Table(title=escape(f"{result.model} @ {result.url} ({result.endpoint})"))
    with_slo = not result.slo.is_empty()
    repeated = any(lv.n_repeats > 1 for lv in result.levels)
    cols = ["level", *(["n"] if repeated else []), "ok", "err", "s", "req/s", "out tok/s",
            "TTFT ms p50/p99", "TPOT ms p50/p99"]
    cols += ["ITL ms p50", *(["goodput/s"] if with_slo else []), "steady", "cpu"]
    for col in cols:
        table.add_column(col, justify="right" if col != "level" else "left")
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
