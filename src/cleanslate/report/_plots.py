"""PNG plots of studies, drawn with matplotlib's Agg canvas (no display, no pyplot state).

- ``throughput``: output tokens/s against concurrency, one line per trial.
- ``pareto``: p99 TTFT against output tokens/s for every measured level, the Pareto front of
  the levels that met the SLOs marked (more tokens/s, less TTFT).
- ``ablation`` (ablation studies): each one-flag change's effect on the objective, in percent
  of the baseline's value; an infeasible change is shown with its cause instead of a bar.
- ``capacity-N`` (capacity studies, one per trial with a search): the probe sequence, each
  probe's attainment (its worst check's share) with its Wilson interval against the load, the
  target as a line, the bracket shaded (:func:`capacity_figure`).

Error bars: where a trial was measured more than once, each level is drawn at its mean over the
measurements with its Student-t interval (``throughput``: vertical; ``pareto``: both ways), and
an ablation bar carries the interval of its change (the race, the pairs by seed, or Welch's);
an interval of two measurements wider than its change (``too few measurements``) is cut at the
range the other bars need, with an arrow (:func:`ablation_clip`).

Every plot is :data:`WIDTH` x :data:`HEIGHT` pixels. matplotlib is imported inside the functions:
it is a heavy import that only the plotting commands need. Text from the store (study names,
flag values, causes) is drawn as it is: math text (``$...$``) is off, so a ``$`` in a value can
neither change the rendering nor make matplotlib raise.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from cleanslate._output_files import SHARED_MODE, make_output_folder, write_output
from cleanslate.bench import LevelResult
from cleanslate.report._bench import (
    BenchReport,
    Timeline,
    running_cap,
    timelines,
    trial_sample_files,
)
from cleanslate.report._capacity import bracket_text, crash_probe, findings_text, probes_phrase
from cleanslate.report._data import StudyReport, TrialView, format_value, level_concurrency
from cleanslate.stats import TOO_FEW
from cleanslate.store import TrialStatus, level_metric

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH = 1100
HEIGHT = 620
DPI = 100

#: Marker of a level by its verdict: (marker, filled).
_MARKERS: dict[str, tuple[str, bool]] = {
    "ok": ("o", True), "slo_miss": ("o", False), "crashed": ("X", True),
    "errors": ("s", False), "interrupted": ("d", False), "unresolved": ("D", False),
    "bad_output": ("s", False),
}
_LINESTYLES = ("-", "--", ":", "-.")
_GOOD = "#2e7d32"
_BAD = "#c62828"
_NOISE = "#90a4ae"


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


def _figure(width: int = WIDTH, height: int = HEIGHT) -> Figure:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")


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


@dataclass(frozen=True)
class ThroughputLine:
    """One trial's line in the throughput plot (:func:`throughput_line`): ``points`` the levels
    that served, ``(concurrency, output tokens/s, level)`` by concurrency; ``crashes`` where its
    server crashed, ``(concurrency, y)``: ``y`` the last served level's throughput before it
    (the X sits level with where the line stops), ``None`` when no level below it served."""

    points: list[tuple[float, float, LevelResult]]
    crashes: list[tuple[float, float | None]]


def throughput_line(trial: TrialView) -> ThroughputLine:
    """A trial's levels as the throughput plot draws them: a level where the server crashed
    is no point of the line (its partial throughput, near 0 tok/s, would draw a fall to 0
    that no load produced), but an X at its concurrency; the line stops at the last level
    that served."""
    points: list[tuple[float, float, LevelResult]] = []
    crashed: list[float] = []
    for lv in trial.record.levels:
        xv = level_concurrency(lv)
        if xv is None:
            continue
        if trial.level_verdict(lv) == "crashed":
            crashed.append(xv)
            continue
        yv = level_metric(lv, "output_throughput")
        if yv is not None:
            points.append((xv, yv, lv))
    points.sort(key=lambda p: p[0])  # a capacity search probes out of order
    crashes = []
    for xc in sorted(crashed):
        below = [p for p in points if p[0] < xc]
        crashes.append((xc, below[-1][1] if below else None))
    return ThroughputLine(points=points, crashes=crashes)


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
    crash_x: list[float] = []
    for si, report in enumerate(reports):
        style = _LINESTYLES[si % len(_LINESTYLES)]
        for trial in sorted(report.trials, key=lambda t: t.number):
            line = throughput_line(trial)
            points = line.points
            color = colors[(report.name, trial.number)]
            crash_x += [xc for xc, _ in line.crashes]
            xs += [xc for xc, _ in line.crashes]
            if not points:
                for xc, _ in line.crashes:  # nothing served below it: the X on the axis
                    ax.plot([xc], [0.015], marker="X", markersize=10, color=color,
                            transform=ax.get_xaxis_transform(), clip_on=False)
                if trial.status.finished and not line.crashes:
                    unplotted.append(f"#{trial.number} {trial.record.cause or trial.status}")
                continue
            x = [p[0] for p in points]
            y = [p[1] for p in points]
            errors: list[tuple[float, float]] = []
            for i, (_, _, level) in enumerate(points):
                found = report.level_interval(trial, level, "output_throughput")
                if found is not None and found.n > 1:
                    y[i] = found.mean
                    if found.low is not None and found.high is not None:
                        errors.append((found.mean - found.low, found.high - found.mean))
                        continue
                errors.append((0.0, 0.0))
            xs += x
            width = 2.6 if report.best is trial else 1.4
            ax.plot(x, y, linestyle=style, color=color, linewidth=width,
                    label=_label(report, trial, multi)
                    if (report.name, trial.number) in named else None)
            if any(e != (0.0, 0.0) for e in errors):
                ax.errorbar(x, y, yerr=[[e[0] for e in errors], [e[1] for e in errors]],
                            fmt="none", ecolor=color, elinewidth=1.2, capsize=4)
            for xi, yi, (_, _, level) in zip(x, y, points, strict=True):
                marker, filled = _MARKERS.get(trial.level_verdict(level), ("o", True))
                ax.plot([xi], [yi], marker=marker, markersize=7, color=color,
                        markerfacecolor=color if filled else "white", markeredgewidth=1.5)
            for xc, _ in line.crashes:  # level with the line's last point below it, unjoined
                below = [yi for xi, yi in zip(x, y, strict=True) if xi < xc]
                if below:
                    ax.plot([xc], [below[-1]], marker="X", markersize=10, color=color,
                            linestyle="none")
                else:
                    ax.plot([xc], [0.015], marker="X", markersize=10, color=color,
                            transform=ax.get_xaxis_transform(), clip_on=False)
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
    note = "filled: met the SLOs   hollow: missed an SLO"
    if crash_x:
        note += ("   X: the server crashed at that concurrency (level with the last level that "
                 "served; the line stops there)")
    if any(r.capacity for r in reports):
        note += "   hollow diamond: unresolved (a capacity probe)"
    if any(r.replicated for r in reports):
        note += (f"\nbars: {reports[0].confidence * 100:g} % Student-t interval of the mean over "
                 "a trial's measurements")
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
            xi = report.level_interval(trial, level, "output_throughput")
            yi = report.level_interval(trial, level, "p99_ttft_ms")
            if (xi is not None and yi is not None and xi.half_width is not None
                    and yi.half_width is not None):
                ax.errorbar([x], [y], xerr=[[x - (xi.low or x)], [(xi.high or x) - x]],
                            yerr=[[y - (yi.low or y)], [(yi.high or y) - y]], fmt="none",
                            ecolor=color, elinewidth=1.0, capsize=3, alpha=0.8)
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
    note = ("each point is one concurrency level; ringed: the Pareto front of the levels "
            "that met the SLOs (more tokens/s, less TTFT)   filled: met the SLOs   hollow: "
            "missed an SLO")
    if any(r.replicated for r in reports):
        note += (f"\nbars: {reports[0].confidence * 100:g} % Student-t intervals of the means "
                 "over a trial's measurements")
    _note(fig, note)
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
        values: list[float] = []
        lows: list[float] = []
        highs: list[float] = []
        for e in effects:
            d = e.difference
            if e.change_pct is None:
                values.append(0.0)
            elif d is not None and d.diff is not None and d.low is not None:
                values.append(d.diff * 100)
            else:
                values.append(e.change_pct)
            if d is not None and d.low is not None and d.high is not None:
                lows.append(max(0.0, values[-1] - d.low * 100))
                highs.append(max(0.0, d.high * 100 - values[-1]))
            else:
                lows.append(0.0)
                highs.append(0.0)
        colors = ["#9e9e9e" if e.change_pct is None else _NOISE if e.in_noise else
                  _GOOD if e.better else _BAD for e in effects]
        few = [e.difference is not None and e.difference.too_few for e in effects]
        clip = ablation_clip(values, lows, highs, few)
        # An interval of two measurements (+-35-75 %) is clipped at the range the others
        # need, an arrow at the cut, instead of stretching every bar to its width.
        shown = [min(max(v, -clip), clip) for v in values]
        ax.barh(positions, shown, color=colors, height=0.6)
        with_bars = [i for i, e in enumerate(effects)
                     if e.difference is not None and e.difference.low is not None]
        cut_left = [(-clip, positions[i]) for i in range(len(effects))
                    if values[i] - lows[i] < -clip]
        cut_right = [(clip, positions[i]) for i in range(len(effects))
                     if values[i] + highs[i] > clip]
        if with_bars:
            ax.errorbar([shown[i] for i in with_bars], [positions[i] for i in with_bars],
                        xerr=[[max(0.0, shown[i] - max(values[i] - lows[i], -clip))
                               for i in with_bars],
                              [max(0.0, min(values[i] + highs[i], clip) - shown[i])
                               for i in with_bars]],
                        fmt="none", ecolor="black", elinewidth=1.2, capsize=5)
        for marker, cuts in (("<", cut_left), (">", cut_right)):
            if cuts:
                ax.plot([x for x, _ in cuts], [y for _, y in cuts], linestyle="none",
                        marker=marker, markersize=9, color="black", clip_on=False)
        # The range the bars need, cut at the clip: no wider than before when nothing is cut.
        span = min(clip, max([abs(v) + max(lo, hi)
                              for v, lo, hi in zip(values, lows, highs, strict=True)] + [1.0]))
        for pos, effect, value, lo, hi in zip(positions, effects, values, lows, highs,
                                              strict=True):
            if effect.change_pct is None:
                ax.text(0, pos, f"  infeasible: {effect.cause}", va="center", ha="left",
                        color=_BAD, fontsize=9, fontweight="bold")
            else:
                # Right of the bar (or of its interval) when it grows right or straddles 0.
                right = value >= 0 or effect.in_noise
                edge = min(value + hi, clip) if right else max(value - lo, -clip)
                ax.text(edge + (0.02 * span if right else -0.02 * span), pos,
                        f"{effect.effect_text} ({format_value(effect.trial.record.value)})",
                        va="center", ha="left" if right else "right", fontsize=9)
        ax.set_yticks(positions, labels, fontsize=9)
        ax.axvline(0, color="black", linewidth=1)
        ax.set_xlim(-span * 1.45, span * 1.45)
        ax.grid(True, axis="x", alpha=0.3)
        if cut_left or cut_right:
            _note(fig, f"Bars and intervals beyond ±{clip:,.0f} % are cut there (arrows): "
                  f"{TOO_FEW} (an interval of two wider than its change) does not set the "
                  "scale; the figures are in each bar's label.")
    ax.set_xlabel(f"change of {report.metric} against the baseline (%)")
    reference = (f"baseline #{base.number}: {format_value(base.record.value)} {unit}".rstrip()
                 if base is not None and base.feasible else "no baseline value")
    ax.set_title(f"Effect of each change ({report.direction} {report.metric}; {reference})"
                 + (f": {report.name}" if report.name else ""))
    return fig


#: The least range (percent) an ablation chart shows either side of 0 (:func:`ablation_clip`).
MIN_CLIP_PCT = 10.0


def ablation_clip(values: list[float], lows: list[float], highs: list[float],
                  too_few: list[bool]) -> float:
    """How far (percent) either side of 0 an ablation chart draws: 1.5 times the largest
    reach (``|value|`` plus its longer whisker) of the bars whose interval is not
    :data:`~cleanslate.stats.TOO_FEW`, at least :data:`MIN_CLIP_PCT`; with only such bars,
    1.5 times their largest ``|value|``. A bar or whisker beyond it is cut at it."""
    kept = [abs(v) + max(lo, hi) for v, lo, hi, few in zip(values, lows, highs, too_few,
                                                              strict=True) if not few]
    if not kept:
        kept = [abs(v) for v in values]
    return max(MIN_CLIP_PCT, 1.5 * max(kept, default=0.0))


#: A capacity plot's size (pixels): smaller than the others, one per trial.
CAPACITY_WIDTH = 760
CAPACITY_HEIGHT = 420
#: At most this many capacity plots per study (the table's first: the best first).
MAX_CAPACITY_PLOTS = 24

#: A probe by its verdict: (marker, filled, color, legend word).
_PROBE_STYLE: dict[str, tuple[str, bool, str, str]] = {
    "pass": ("o", True, _GOOD, "pass"),
    "fail": ("o", False, _BAD, "fail (SLO missed)"),
    "unresolved": ("D", False, "#ef6c00", "unresolved (interval holds the target)"),
    "crashed": ("X", True, _BAD, "crashed"),
    "errors": ("s", False, "#6d4c41", "request errors"),
    "bad_output": ("s", False, "#6a1b9a", "bad output"),
    "interrupted": ("d", False, "#757575", "interrupted"),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _spaced_labels(loads: list[float], log: bool, gap: float = 0.045) -> list[str]:
    """Tick labels for sorted loads, a label left blank where it would overlap the one before
    (closer than ``gap`` of the axis; the probe numbers still tell the probes apart)."""
    import math

    pos = [math.log2(max(v, 1e-9)) if log else v for v in loads]
    span = (pos[-1] - pos[0]) or 1.0
    out: list[str] = []
    last: float | None = None
    for value, x in zip(loads, pos, strict=True):
        if last is None or (x - last) / span >= gap:
            out.append(_num(value))
            last = x
        else:
            out.append("")
    return out


@_plain_text
def capacity_figure(report: StudyReport, trial: TrialView) -> Figure:
    """One trial's capacity search: each probe's attainment (the share of samples that met its
    worst check's limit, in %) against its load, with the Wilson interval the verdict was taken
    on as an error bar; the target share as a dashed line; passes, fails, unresolved probes,
    errors and the crash marked apart; the bracket ``[capacity, upper)`` shaded, the crash's
    load as a dotted line; each probe numbered in the order it was measured."""
    result = trial.capacity
    fig = _figure(CAPACITY_WIDTH, CAPACITY_HEIGHT)
    ax = fig.add_subplot()
    multi_name = f"{report.name}: " if report.name else ""
    if result is None or not result.probes:
        _empty(ax, "no probe was measured")
        ax.set_title(f"Capacity search: {multi_name}#{trial.number}", fontsize=10)
        return fig
    shares = [p for p in result.probes if p.attainment is not None]
    lows = [100 * (p.attainment_low if p.attainment_low is not None else p.attainment or 0.0)
            for p in shares]
    targets = sorted({p.target for p in result.probes if p.target is not None})
    bottom = min([*lows, *(100 * t for t in targets), 100.0])
    span = max(100.0 - bottom, 1.0)
    floor = max(0.0, bottom - 0.12 * span)
    top = 100.0 + 0.06 * span
    for verdict, (marker, filled, color, word) in _PROBE_STYLE.items():
        group = [p for p in result.probes if p.verdict.value == verdict]
        if not group:
            continue
        x = [p.load for p in group]
        y = [100 * p.attainment if p.attainment is not None else floor + 0.03 * span
             for p in group]
        # Clamped at 0: a Wilson end of n of n can be 1 - 1e-16, a hair under the share.
        below = [max(0.0, 100 * (p.attainment - p.attainment_low))
                 if p.attainment is not None and p.attainment_low is not None else 0.0
                 for p in group]
        above = [max(0.0, 100 * (p.attainment_high - p.attainment))
                 if p.attainment is not None and p.attainment_high is not None else 0.0
                 for p in group]
        ax.errorbar(x, y, yerr=[below, above], fmt=marker, markersize=8, color=color,
                    markerfacecolor=color if filled else "white", markeredgewidth=1.6,
                    ecolor=color, elinewidth=1.3, capsize=4, linestyle="none",
                    label=f"{word} ({len(group)})")
    for p in result.probes:
        at = 100 * p.attainment if p.attainment is not None else floor + 0.03 * span
        ax.annotate(str(p.index + 1), (p.load, at), textcoords="offset points", xytext=(6, 5),
                    fontsize=8, color="#333333")
    for t in targets:
        ax.axhline(100 * t, color="black", linestyle="--", linewidth=1.1,
                   label=f"target {100 * t:g} %")
    if result.capacity is not None and result.upper is not None:
        ax.axvspan(result.capacity, result.upper, color=_GOOD, alpha=0.15, linewidth=0,
                   label=f"bracket [{_num(result.capacity)}, {_num(result.upper)})")
    elif result.capacity is not None:
        ax.axvline(result.capacity, color=_GOOD, linewidth=1.2,
                   label=f"capacity {_num(result.capacity)} (every probe passed)")
    crashed = crash_probe(result)
    if crashed is not None:
        ax.axvline(crashed.load, color=_BAD, linestyle=":", linewidth=1.4,
                   label=f"crashed at {crashed.label}")
    loads = sorted({p.load for p in result.probes})
    log = loads[-1] / max(loads[0], 1e-9) >= 8
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(loads, _spaced_labels(loads, log), fontsize=8)
    ax.minorticks_off()
    ax.margins(x=0.06)
    ax.set_ylim(floor, top)
    ax.set_xlabel("concurrency (requests in flight)" if result.dimension == "concurrency"
                  else "request rate (requests/s)")
    ax.set_ylabel("attainment (%)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Capacity search: {multi_name}#{trial.number} {report.short_params(trial)}"
                 f"\n{bracket_text(result)} · {probes_phrase(result)}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    found = findings_text(result)
    _note(fig, (f"{found}\n" if found else "")
          + f"point: the probe's worst check (share of samples within the limit); bar: its "
          f"{result.slo.confidence * 100:g} % Wilson interval; number: the probe's order")
    return fig


def capacity_plot_name(study: str, number: int, multi: bool) -> str:
    """The file stem of a trial's capacity plot: ``capacity-N``, ``capacity-STUDY-N`` in a
    report of several studies."""
    return f"capacity-{_slug(study)}-{number}" if multi else f"capacity-{number}"


def capacity_plots(reports: list[StudyReport]) -> list[Plot]:
    """One :func:`capacity_figure` per trial with a capacity search (at most
    :data:`MAX_CAPACITY_PLOTS` a study, the best first), named ``capacity-N`` (with several
    studies ``capacity-STUDY-N``)."""
    out = []
    for report in reports:
        for trial in report.capacity_trials[:MAX_CAPACITY_PLOTS]:
            result = trial.capacity
            assert result is not None
            name = capacity_plot_name(report.name, trial.number, len(reports) > 1)
            out.append(Plot(name, f"Capacity search of trial #{trial.number}"
                            + (f" ({report.name})" if len(reports) > 1 else ""),
                            f"{bracket_text(result)}: {len(result.probes)} probes, each "
                            "probe's attainment with its Wilson interval against the load; "
                            "dashed: the target; shaded: the bracket the boundary lies in.",
                            _png(capacity_figure(report, trial))))
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "study"


#: Panels of a bench run drawn at most (a find-max run with many probes and extensions); the
#: rest are named on the page.
MAX_PANELS = 32
PANEL_WIDTH, PANEL_HEIGHT = 1000, 760


# --- a level over time (bench --json samples, a trial's run folder) -------------------------------

def _say(ax: Axes, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            fontsize=10, color="#555555")


def level_figure(line: Timeline, cap: tuple[float, str] | None,
                 level: LevelResult | None = None) -> Figure:
    """The four-part panel of one measured level (see the module docstring)."""
    fig = _figure(PANEL_WIDTH, PANEL_HEIGHT)
    axes = fig.subplots(4, 1, sharex=True)
    title = line.label
    if level is not None:
        title += f": {level.output_throughput:,.0f} output tok/s over the level"
    fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    ax = axes[0]
    if line.throughput:
        ax.plot([t for t, _ in line.throughput], [v for _, v in line.throughput],
                color="#1f4e9a", lw=1.4)
        ax.set_ylim(bottom=0)
    else:
        _say(ax, "no engine token counter in the samples")
    ax.set_ylabel("output tok/s\n(engine)")
    ax = axes[1]
    if line.has_metrics:
        ax.step(line.metrics_t, [math.nan if v is None else v for v in line.running],
                where="post", color="#2e7d32", lw=1.4, label="running")
        ax.step(line.metrics_t, [math.nan if v is None else v for v in line.waiting],
                where="post", color="#c62828", lw=1.4, label="waiting")
        if cap is not None:
            ax.axhline(cap[0], color="#333333", ls="--", lw=1.0,
                       label=f"cap {cap[0]:g} ({cap[1]}, in effect)")
        top = max([v for v in (*line.running, *line.waiting) if v is not None]
                  + [cap[0] if cap else 0.0, 1.0])
        ax.set_ylim(0, top * 1.3)  # room for the legend above the lines
        ax.legend(loc="upper right", fontsize=8, ncol=3, framealpha=0.9)
    else:
        _say(ax, "no engine metrics in the samples"
             + (f" ({line.failed_scrapes} failed scrapes)" if line.failed_scrapes else ""))
    ax.set_ylabel("requests")
    ax = axes[2]
    if any(v is not None for v in line.kv_pct):
        ax.plot(line.metrics_t, [math.nan if v is None else v for v in line.kv_pct],
                color="#6a1b9a", lw=1.4)
        ax.set_ylim(0, 105)
    else:
        _say(ax, "no KV-cache usage in the samples")
    ax.set_ylabel("KV cache %")
    ax = axes[3]
    if line.has_gpu:
        ax.plot(line.gpu_t, [math.nan if v is None else v for v in line.gpu_util],
                color="#ef6c00", lw=1.4, label="utilization %")
        ax.set_ylim(0, 130)
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.set_ylabel("GPU %")
        power = ax.twinx()
        power.plot(line.gpu_t, [math.nan if v is None else v for v in line.gpu_power],
                   color="#455a64", lw=1.2, ls="--", label="power W")
        power.set_ylabel("W")
        watts = [v for v in line.gpu_power if v is not None]
        power.set_ylim(0, 1.3 * max(watts) if watts and max(watts) > 0 else 1.0)
        ax.legend(handles=[*ax.get_lines(), *power.get_lines()], loc="upper right",
                  fontsize=8, ncol=2, framealpha=0.9)
    else:
        _say(ax, "no GPU telemetry in the samples")
        ax.set_ylabel("GPU")
    axes[3].set_xlabel("seconds since the level's first sample")
    for a in axes:
        a.grid(alpha=0.3)
    if line.problems:
        fig.supxlabel("; ".join(line.problems)[:200], x=0.01, ha="left", fontsize=8,
                      color="#b71c1c")
    return fig


@_plain_text
def level_plots(report: BenchReport) -> list[Plot]:
    """One :class:`Plot` per measured level of a bench run (at most :data:`MAX_PANELS`),
    named ``level-<label>``."""
    levels = {lv.label: lv for lv in report.result.levels}
    return [_level_plot(line, report.cap, levels.get(line.label), f"level-{_slug(line.label)}",
                        f"Level {line.label}")
            for line in report.timelines()[:MAX_PANELS]]


def _level_plot(line: Timeline, cap: tuple[float, str] | None, level: LevelResult | None,
                name: str, title: str) -> Plot:
    caption = ("Over the level: output tokens/s from the engine's generation counter "
               "(over a trailing window, at least 10 % of the level); running and waiting "
               "requests"
               + (f", the dashed line the cap in effect ({cap[1]} {cap[0]:g})" if cap
                  else " (no cap recorded)")
               + "; KV-cache usage; GPU utilization and power.")
    return Plot(name, title, caption, _png(level_figure(line, cap, level)))


#: Panels of a study's best trial drawn at most (its levels, a level measured again).
MAX_TRIAL_PANELS = 8


@_plain_text
def study_level_plots(reports: list[StudyReport]) -> list[Plot]:
    """A panel per measured level of each study's best trial, from the raw samples its run
    kept (``<artifacts>/<run id>/observed/``, read with :func:`cleanslate.hosts.files.
    read_under`: below the store's artifacts folder, no link followed, regular files of this
    user or root only, as a run's log is read). None for a run whose samples are not there (a
    remote run, a trial from before samples were kept) or a study without a trusted artifacts
    folder. Named ``level-<trial>-<label>`` (``level-<study>-<trial>-<label>`` with several
    studies)."""
    out: list[Plot] = []
    for report in reports:
        best = report.best
        run = best.run if best is not None else None
        if best is None or run is None or report.artifacts is None:
            continue
        files = trial_sample_files(report.artifacts, run.id)
        if not files:
            continue
        document = {"server_config": run.server_config.model_dump(mode="json")
                    if run.server_config is not None else None}
        cap = running_cap(document)
        levels = {lv.label: lv for lv in best.record.levels}
        prefix = (f"level-{_slug(report.name)}-{best.number}" if len(reports) > 1
                  else f"level-{best.number}")
        for line in timelines(files)[:MAX_TRIAL_PANELS]:
            out.append(_level_plot(line, cap, levels.get(line.label),
                                   f"{prefix}-{_slug(line.label)}",
                                   f"{report.name}: best trial #{best.number}, level "
                                   f"{line.label}"))
    return out


@_plain_text
def render_plots(reports: list[StudyReport]) -> list[Plot]:
    """Every plot of the report: the throughput and Pareto plots (studies overlaid), one
    ablation plot per ablation study, and one capacity plot per trial with a capacity search
    (:func:`capacity_plots`)."""
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
                        f"way (win), red the wrong way (loss), grey-blue is a tie or "
                        f"undecided (its interval, the error bar, holds 0); an interval of "
                        f"two measurements wider than its change ({TOO_FEW}) is cut at the "
                        f"range the other bars need, with an arrow; "
                        f"infeasible changes show their cause.",
                        _png(ablation_figure(report))))
    return out + capacity_plots(reports) + study_level_plots(reports)


def write_pngs(reports: list[StudyReport], folder: Path) -> list[Path]:
    """Write every plot as ``<folder>/<name>.png`` (mode 0644 less the umask; the folder made
    if missing), never through a link (:func:`cleanslate._output_files.write_output`);
    returns the paths."""
    make_output_folder(folder, where=str(folder))
    return [write_output(folder / f"{plot.name}.png", plot.png, where=str(folder),
                         mode=SHARED_MODE) for plot in render_plots(reports)]
