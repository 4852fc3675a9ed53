"""Several benches side by side (``cleanslate report ID1 ID2``, ``report ID --compare ID2``):
throughput against latency with one line per bench, the per-level table of each, and their
exports (CSV: one row per bench and level; JSON: each bench's export in a list).

One bench is :func:`cleanslate.report._html.render_bench_html`'s page; the figure here is
drawn for it too (``throughput-latency.png``). Text from the store (ids, URLs, labels) is
drawn as it is (math text off) and HTML-escaped on the page.
"""

from __future__ import annotations

import datetime as _dt
import json
import math

from rich.table import Table
from rich.text import Text

from cleanslate import __version__
from cleanslate.bench import LevelResult, bound_by
from cleanslate.report._bench import LEVEL_HEAD, BenchReport, bench_json, level_row
from cleanslate.report._data import safe_url
from cleanslate.report._export import rows_csv
from cleanslate.report._html import _CSS, _e, _fmt_or_dash, _plots_html, _table, _when
from cleanslate.report._plots import Plot, _figure, _note, _plain_text, _png

#: The name of the figure's PNG file (``--png DIR``).
FIGURE_NAME = "throughput-latency"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _points(levels: tuple[LevelResult, ...], latency: str) -> list[tuple[float, float, str]]:
    """``(output tok/s, latency ms, label)`` of the levels that completed a request, in the
    order measured; ``latency`` is ``ttft`` (p99) or ``tpot`` (median)."""
    out = []
    for lv in levels:
        y = _finite(lv.ttft_ms.p99 if latency == "ttft" else lv.tpot_ms.median)
        x = _finite(lv.output_throughput)
        if lv.completed and x is not None and y is not None:
            out.append((x, y, lv.label))
    return out


@_plain_text
def throughput_latency_plot(reports: list[BenchReport]) -> Plot:
    """p99 TTFT and median TPOT against output tokens/s, one line per bench through its
    levels in the order they were measured, each point named by its level."""
    fig = _figure()
    axes = fig.subplots(1, 2)
    for ax, latency, label in ((axes[0], "ttft", "p99 TTFT (ms)"),
                               (axes[1], "tpot", "median TPOT (ms)")):
        right = 0.0
        for report in reports:
            points = _points(report.result.levels, latency)
            if not points:
                continue
            right = max(right, *(p[0] for p in points))
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                            lw=1.6, label=report.name)
            for x, y, name in points:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=line.get_color())
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if right > 0:
            ax.set_xlim(0, right * 1.12)  # room for the last level's label
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no level completed a request", ha="center", va="center",
                    transform=ax.transAxes, color="#555555")
    fig.suptitle("Latency against throughput, one line per bench", x=0.01, ha="left")
    _note(fig, "each point is a level (its label beside it); a level that completed no "
               "request is not drawn")
    return Plot(FIGURE_NAME, "Latency against throughput",
                "p99 TTFT (left) and median TPOT (right) against output tokens/s; one line "
                "per bench through its levels in the order measured.", _png(fig))


def benches_table(reports: list[BenchReport]) -> Table:
    """One row per bench and level: the headline figures (text from the store as text)."""
    table = Table(title="Benches, level by level", title_justify="left")
    for column in ("bench", "level", "ok", "err", "out tok/s", "TTFT ms p50/p99",
                   "TPOT ms p50/p99", "bound by"):
        table.add_column(column, justify="left" if column in ("bench", "level", "bound by")
                         else "right")
    for report in reports:
        for lv in report.result.levels:
            table.add_row(Text(report.name), Text(lv.label), str(lv.completed), str(lv.failed),
                          f"{lv.output_throughput:,.0f}",
                          f"{_fmt_or_dash(lv.ttft_ms.median, '.1f')}/"
                          f"{_fmt_or_dash(lv.ttft_ms.p99, '.1f')}",
                          f"{_fmt_or_dash(lv.tpot_ms.median, '.1f')}/"
                          f"{_fmt_or_dash(lv.tpot_ms.p99, '.1f')}",
                          Text(bound_by(lv.bottleneck)))
    return table


def benches_csv(reports: list[BenchReport]) -> str:
    """One row per bench and level: ``bench`` (its id or file), then
    :func:`~cleanslate.report._bench.level_row`'s columns (the union over the levels)."""
    return rows_csv([{"bench": r.name, **level_row(lv)} for r in reports
                     for lv in r.result.levels], ["bench", *LEVEL_HEAD])


def benches_json(reports: list[BenchReport]) -> str:
    """``{"benches": [each bench's export (bench_json)]}``."""
    return json.dumps({"benches": [json.loads(bench_json(r)) for r in reports]},
                      indent=2) + "\n"


def render_benches_html(reports: list[BenchReport], *, plots: list[Plot] | None = None,
                        generated_at: float | None = None) -> str:
    """One self-contained page for several benches: the figure, and each bench's levels (the
    page rules of a study's: inline CSS and PNGs, every text escaped)."""
    plots = [throughput_latency_plot(reports)] if plots is None else plots
    now = generated_at if generated_at is not None else _dt.datetime.now(_dt.UTC).timestamp()
    names = " vs ".join(r.name for r in reports)
    headers = ["level", "ok", "err", "out tok/s", "TTFT ms p50/p99", "TPOT ms p50/p99",
               "bound by"]
    sections = []
    for report in reports:
        r = report.result
        rows = [[_e(lv.label), str(lv.completed), str(lv.failed),
                 f"{lv.output_throughput:,.0f}",
                 f"{_fmt_or_dash(lv.ttft_ms.median, '.1f')}/"
                 f"{_fmt_or_dash(lv.ttft_ms.p99, '.1f')}",
                 f"{_fmt_or_dash(lv.tpot_ms.median, '.1f')}/"
                 f"{_fmt_or_dash(lv.tpot_ms.p99, '.1f')}",
                 _e(bound_by(lv.bottleneck))] for lv in r.levels]
        sections.append(
            f"<h2>{_e(report.name)}</h2>"
            f'<p class="meta"><b>{_e(r.model)}</b> at <code>{_e(safe_url(r.url))}</code> '
            f"({_e(r.endpoint)}), {_e(r.started_at)} to {_e(r.finished_at)}, cleanslate "
            f"{_e(r.version)}</p>"
            + _table(headers, rows, numeric=set(range(1, len(headers) - 1))))
    ids = " ".join(_e(r.bench_id or f"--bench {r.path.name}") for r in reports)
    body = (f"<h1>cleanslate bench report: {_e(names)}</h1>"
            f"<h2>Latency against throughput</h2>{_plots_html(plots)}" + "".join(sections))
    footer = (f"<footer>Generated by cleanslate {_e(__version__)} on {_e(_when(now))}. "
              f"Reproduce: <code>cleanslate report {ids} --html FILE</code></footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,">'
            f"<title>cleanslate bench report: {_e(names)}</title>"
            f"<style>{_CSS}</style></head><body>{body}{footer}</body></html>\n")


__all__ = ["FIGURE_NAME", "benches_csv", "benches_json", "benches_table",
           "render_benches_html", "throughput_latency_plot"]
