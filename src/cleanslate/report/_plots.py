"""PNG plots of studies, drawn with matplotlib's Agg canvas (no display, no pyplot state).

- ``throughput``: output tokens/s against concurrency, one line per trial.
- ``pareto``: p99 TTFT against output tokens/s for every measured level, the Pareto front of
  the levels that met the SLOs marked (more tokens/s, less TTFT).
- ``ablation`` (ablation studies): each one-flag change's effect on the objective, in percent
  of the baseline's value; an infeasible change is shown with its cause instead of a bar.

Every plot is :data:`WIDTH` x :data:`HEIGHT` pixels. matplotlib is imported inside the functions:
it is a heavy import that only the plotting commands need. Text from the store (study names,
flag values, causes) is drawn as it is: math text (``$...$``) is off, so a ``$`` in a value can
neither change the rendering nor make matplotlib raise.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from cleanslate.bench import LevelResult
from cleanslate.report._data import StudyReport, TrialView, format_value, level_concurrency
from cleanslate.store._trials import TrialStatus, level_metric

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH = 1100
HEIGHT = 620
DPI = 100

#: Marker of a level by its verdict: (marker, filled).
_MARKERS: dict[str, tuple[str, bool]] = {
    "ok": ("o", True), "slo_miss": ("o", False), "crashed": ("X", True),
    "errors": ("s", False), "interrupted": ("d", False),
}
_LINESTYLES = ("-", "--", ":", "-.")
_GOOD = "#2e7d32"
_BAD = "#c62828"


@dataclass(frozen=True)
class Plot:
    """One rendered plot: ``name`` is its file stem, ``png`` its bytes."""

    name: str
    title: str
    caption: str
    png: bytes


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _plain_text(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a drawing function with math text off (``text.parse_math``): every text it makes is
    drawn verbatim."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return fn(*args, **kwargs)

    return wrapper


def _figure() -> Figure:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, layout="constrained")


def _png(fig: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def _colors(reports: list[StudyReport]) -> dict[tuple[str, int], Any]:
    """One color per trial, the same in every plot."""
    from matplotlib import colormaps

    keys = [(r.name, t.number) for r in reports for t in sorted(r.trials, key=lambda t: t.number)]
    cmap = colormaps["tab10" if len(keys) <= 10 else "tab20"]
    return {key: cmap(i % cmap.N) for i, key in enumerate(keys)}


#: At most this many trials are named in a legend (the best ones); the rest are drawn unnamed.
MAX_LEGEND = 16


def _named(reports: list[StudyReport]) -> set[tuple[str, int]]:
    """The trials a legend names: all of them, or each study's best when there are many."""
    drawn = [(r, t) for r in reports for t in r.trials if t.record.levels]
    if len(drawn) <= MAX_LEGEND:
        return {(r.name, t.number) for r, t in drawn}
    per_study = max(1, MAX_LEGEND // len(reports))
    return {(r.name, t.number) for r in reports
            for t in [t for t in r.sorted_trials() if t.record.levels][:per_study]}


def _label(report: StudyReport, trial: TrialView, multi: bool, width: int = 48) -> str:
    text = f"#{trial.number} {report.short_params(trial)}"
    if trial.status != TrialStatus.FEASIBLE:
        text += f" ({trial.record.cause or trial.status})"
    if len(text) > width:
        text = text[: width - 1] + "…"
    return f"{report.name}: {text}" if multi else text


def _empty(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            fontsize=12, color="#555555")


def _note(fig: Figure, text: str) -> None:
    """A small explanation under the plot (laid out by the constrained layout)."""
    fig.supxlabel(text, x=0.01, ha="left", fontsize=8, color="#444444")


@_plain_text
def throughput_figure(reports: list[StudyReport]) -> Figure:
    """Output tokens/s against concurrency, one line per trial (one line style per study)."""
    fig = _figure()
    ax = fig.add_subplot()
    colors = _colors(reports)
    multi = len(reports) > 1
    named = _named(reports)
    unplotted: list[str] = []
    xs: list[float] = []
    for si, report in enumerate(reports):
        style = _LINESTYLES[si % len(_LINESTYLES)]
        for trial in sorted(report.trials, key=lambda t: t.number):
            points: list[tuple[float, float, LevelResult]] = []
            for lv in trial.record.levels:
                xv, yv = level_concurrency(lv), level_metric(lv, "output_throughput")
                if xv is not None and yv is not None:
                    points.append((xv, yv, lv))
            if not points:
                if trial.status.finished:
                    unplotted.append(f"#{trial.number} {trial.record.cause or trial.status}")
                continue
            color = colors[(report.name, trial.number)]
            x = [p[0] for p in points]
            y = [p[1] for p in points]
            xs += x
            width = 2.6 if report.best is trial else 1.4
            ax.plot(x, y, linestyle=style, color=color, linewidth=width,
                    label=_label(report, trial, multi)
                    if (report.name, trial.number) in named else None)
            for xi, yi, (_, _, level) in zip(x, y, points, strict=True):
                marker, filled = _MARKERS.get(trial.level_verdict(level), ("o", True))
                ax.plot([xi], [yi], marker=marker, markersize=7, color=color,
                        markerfacecolor=color if filled else "white", markeredgewidth=1.5)
    title = "Output throughput against concurrency"
    ax.set_title(title + (f": {reports[0].name}" if not multi else ""))
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.grid(True, alpha=0.3)
    if xs:
        if max(xs) / max(min(xs), 1e-9) >= 8:
            ax.set_xscale("log", base=2)
        ticks = sorted(set(xs))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        _empty(ax, "no level was measured")
    note = "filled: met the SLOs   hollow: missed an SLO   X: crashed"
    total = sum(1 for r in reports for t in r.trials if t.record.levels)
    if len(named) < total:
        note += f"   |   legend: the {len(named)} best of {total} trials"
    if unplotted:
        shown = unplotted[:6] + ([f"{len(unplotted) - 6} more"] if len(unplotted) > 6 else [])
        note += "   |   no level measured: " + ", ".join(shown)
    _note(fig, note)
    return fig


@_plain_text
def pareto_figure(reports: list[StudyReport]) -> Figure:
    """p99 TTFT against output tokens/s for every measured level; the Pareto front of the
    levels that met the SLOs drawn as a black step line and ringed."""
    fig = _figure()
    ax = fig.add_subplot()
    colors = _colors(reports)
    multi = len(reports) > 1
    named = _named(reports)
    ys: list[float] = []
    seen: set[tuple[str, int]] = set()
    for si, report in enumerate(reports):
        for trial, level, x, y in report.level_points():
            color = colors[(report.name, trial.number)]
            marker, filled = _MARKERS.get(trial.level_verdict(level), ("o", True))
            key = (report.name, trial.number)
            ax.plot([x], [y], linestyle="none", marker=marker, markersize=7, color=color,
                    markerfacecolor=color if filled else "white", markeredgewidth=1.5,
                    label=None if key in seen or key not in named
                    else _label(report, trial, multi))
            seen.add(key)
            ys.append(y)
        front = report.pareto_front()
        if front:
            fx = [p[2] for p in front]
            fy = [p[3] for p in front]
            style = _LINESTYLES[si % len(_LINESTYLES)]
            ax.step(fx, fy, where="post", color="black", linestyle=style, linewidth=1.2,
                    label=f"Pareto front{': ' + report.name if multi else ''}")
            ax.plot(fx, fy, linestyle="none", marker="o", markersize=14,
                    markerfacecolor="none", markeredgecolor="black", markeredgewidth=1.2)
            for trial, level, x, y in front:
                ax.annotate(f"#{trial.number} {level.label}", (x, y),
                            textcoords="offset points", xytext=(8, 6), fontsize=8)
        limit = report.slo.get("ttft_p99_ms")
        if limit:
            ax.axhline(limit, color=_BAD, linestyle="--", linewidth=1,
                       label=f"SLO p99 TTFT {limit:g} ms{': ' + report.name if multi else ''}")
            ys.append(limit)
    ax.margins(x=0.08)
    ax.set_title("p99 TTFT against output throughput"
                 + (f": {reports[0].name}" if not multi else ""))
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel("p99 time to first token (ms)")
    ax.grid(True, alpha=0.3)
    if ys:
        if max(ys) / max(min(ys), 1e-9) >= 20:
            from matplotlib.ticker import FuncFormatter

            ax.set_yscale("log")
            plain = FuncFormatter(lambda v, _pos: f"{v:,.0f}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    else:
        _empty(ax, "no level was measured")
    _note(fig, "each point is one concurrency level; ringed: the Pareto front of the levels "
          "that met the SLOs (more tokens/s, less TTFT)   filled: met the SLOs   hollow: "
          "missed an SLO")
    return fig


@_plain_text
def ablation_figure(report: StudyReport) -> Figure:
    """Each change's effect on the objective in percent of the baseline; infeasible changes are
    listed at their place with their cause."""
    fig = _figure()
    ax = fig.add_subplot()
    effects = report.ablation_effects()
    base = report.baseline_trial()
    unit = "tok/s" if "throughput" in report.metric else ""
    if base is None:
        _empty(ax, "no finished baseline trial")
    elif not base.feasible:
        _empty(ax, f"the baseline (#{base.number}) is infeasible "
                   f"({base.record.cause or base.status}): no reference to compare with")
    elif not effects:
        _empty(ax, "no one-flag change was run")
    else:
        labels = [f"{e.label}  (#{e.trial.number})" for e in effects]
        positions = list(range(len(effects)))[::-1]
        values = [e.change_pct if e.change_pct is not None else 0.0 for e in effects]
        colors = [(_GOOD if e.better else _BAD) if e.change_pct is not None else "#9e9e9e"
                  for e in effects]
        ax.barh(positions, values, color=colors, height=0.6)
        span = max([abs(v) for v in values] + [1.0])
        for pos, effect, value in zip(positions, effects, values, strict=True):
            if effect.change_pct is None:
                ax.text(0, pos, f"  infeasible: {effect.cause}", va="center", ha="left",
                        color=_BAD, fontsize=9, fontweight="bold")
            else:
                ax.text(value + (0.02 * span if value >= 0 else -0.02 * span), pos,
                        f"{value:+.1f}% ({format_value(effect.trial.record.value)})",
                        va="center", ha="left" if value >= 0 else "right", fontsize=9)
        ax.set_yticks(positions, labels, fontsize=9)
        ax.axvline(0, color="black", linewidth=1)
        ax.set_xlim(-span * 1.45, span * 1.45)
        ax.grid(True, axis="x", alpha=0.3)
    ax.set_xlabel(f"change of {report.metric} against the baseline (%)")
    reference = (f"baseline #{base.number}: {format_value(base.record.value)} {unit}".rstrip()
                 if base is not None and base.feasible else "no baseline value")
    ax.set_title(f"Effect of each change ({report.direction} {report.metric}; {reference})"
                 + (f": {report.name}" if report.name else ""))
    return fig


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "study"


@_plain_text
def render_plots(reports: list[StudyReport]) -> list[Plot]:
    """Every plot of the report: the throughput and Pareto plots (studies overlaid), and one
    ablation plot per ablation study."""
    out = [
        Plot("throughput", "Throughput against concurrency",
             "Output tokens/s at each concurrency level, one line per trial. Filled markers met "
             "the SLOs, hollow ones missed one, X marks the level where the server crashed.",
             _png(throughput_figure(reports))),
        Plot("pareto", "Latency against throughput",
             "p99 TTFT against output tokens/s for every measured level; the ringed points "
             "are the Pareto front of the levels that met the SLOs.",
             _png(pareto_figure(reports))),
    ]
    for report in reports:
        if report.strategy != "ablation":
            continue
        name = "ablation" if len(reports) == 1 else f"ablation-{_slug(report.name)}"
        out.append(Plot(name, f"Effect of each change: {report.name}",
                        f"Each one-flag change against the baseline, in percent of the "
                        f"baseline's {report.metric}. Green moved the objective the right "
                        f"way, red the wrong way; infeasible changes show their cause.",
                        _png(ablation_figure(report))))
    return out


def write_pngs(reports: list[StudyReport], folder: Path) -> list[Path]:
    """Write every plot as ``<folder>/<name>.png``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for plot in render_plots(reports):
        path = folder / f"{plot.name}.png"
        path.write_bytes(plot.png)
        paths.append(path)
    return paths
