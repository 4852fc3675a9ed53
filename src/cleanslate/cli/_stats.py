"""How sure a study is of its best: the lines ``cleanslate tune`` prints after its table
(``docs/statistics.md``; ``tune --json``'s ``statistics`` document is
:class:`cleanslate.cli._documents.StatisticsDoc`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cleanslate.stats import TOO_FEW, Outcome, too_few

if TYPE_CHECKING:
    from cleanslate.store import TrialRecord
    from cleanslate.tune.race import TieSet
    from cleanslate.tune.study import StudySpec


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x * 100:+.1f}"


def value_text(trial: TrialRecord) -> str:
    """A trial's value as the table and the progress lines show it: ``mean 6,778.4 ± 840.7
    (3 runs)`` with several measurements (each a run on a new server), the value alone with
    one."""
    if trial.value is None:
        return "-"
    if trial.ci_low is None or trial.ci_high is None:
        return f"{trial.value:,.1f}"
    hw = (trial.ci_high - trial.ci_low) / 2
    return f"mean {trial.value:,.1f} ± {hw:,.1f} ({runs_text(trial.n_replicates)})"


def runs_text(n: int) -> str:
    """``3 runs``, ``1 run``: how many measurements a mean is over."""
    return f"{n} run" + ("" if n == 1 else "s")


def marks(found: TieSet) -> dict[int, str]:
    """A word per trial for the table: ``best``, or against it the outcome's word
    (:class:`cleanslate.stats.Outcome`: ``tie``, ``undecided``, ``loss``), as the report
    prints it."""
    out: dict[int, str] = {}
    for n in (*found.tied, *found.undecided, *found.beaten):
        outcome = found.against_best(n)
        if outcome is not None:
            out[n] = str(outcome)
    if found.best is not None:
        out[found.best.number] = "best"
    return out


def statistics_lines(spec: StudySpec, trials: list[TrialRecord],
                     params: Any) -> list[str]:
    """What the study's measurements say of its best, as lines of text (``params`` renders a
    trial's parameters)."""
    from cleanslate.tune.race import host_effects, tie_set

    stats = spec.statistics
    found = tie_set(trials, spec)
    best = found.best
    if best is None:
        return []
    by_number = {t.number: t for t in trials}
    metric = spec.objective.metric
    lines: list[str] = []
    interval = found.interval
    if interval is None or interval.low is None or interval.high is None:
        lines.append(f"  {metric} = {best.value:,.1f} at {best.best_level}: one run, "
                     "no interval (a difference smaller than the run-to-run noise, 2-4 % on an "
                     "H200, cannot be told; statistics: {replicates: auto} measures it)")
        return lines
    hw = interval.half_width or 0.0
    lines.append(f"  {metric} = mean {interval.mean:,.1f} ± {hw:,.1f} at {best.best_level} "
                 f"({runs_text(interval.n)}, each a new server; {stats.confidence:.0%} "
                 "interval)")
    for outcome, numbers in ((Outcome.TIE, found.tied), (Outcome.UNDECIDED, found.undecided)):
        label = (f"tie with it (within ±{stats.tie_margin:.0%})" if outcome is Outcome.TIE
                 else f"undecided against it ({outcome.meaning})")
        for i, n in enumerate(numbers):
            if i == 1:  # the word's meaning once, on its first line
                label = label.split(" (")[0]
            t = by_number.get(n)
            c = found.comparisons.get(n)
            if t is None:
                continue
            versus = (f"{_pct(c.diff)} % [{_pct(c.low)}, {_pct(c.high)}] after {c.pairs} "
                      "pairs" if c is not None and c.low is not None else "not compared in pairs")
            if c is not None and too_few(c.diff, c.low, c.high, c.pairs):
                versus += f": {TOO_FEW}"
            lines.append(f"  {label}: trial {n} ({params(t.params)}) {value_text(t)}, "
                         f"{versus}")
    if not found.tied and not found.undecided:
        lines.append("  no other configuration is a tie with it or undecided against it")
    share = found.statistics_gpu_s / found.total_gpu_s if found.total_gpu_s else 0.0
    lines.append(f"  statistics: {sum(max(0, len(t.replicates) - 1) for t in trials)} more "
                 f"measurements, {found.statistics_gpu_s:,.0f} GPU-s ({share:.0%} of the "
                 f"study's {found.total_gpu_s:,.0f})")
    for slot, effect in sorted(host_effects(trials, stats.confidence).items()):
        span = (f" [{_pct(effect.low)}, {_pct(effect.high)}]"
                if effect.low is not None else "")
        lines.append(f"  host effect of {slot}: {_pct(effect.mean)} %{span} (the same "
                     "configurations on the other slots)")
    return lines


def capacity_cell(trial: TrialRecord) -> str:
    """A capacity trial's cell in ``tune``'s table: ``c=96 [96, 104), 8 probes`` and what the
    search found besides (the crash, unresolved probes, cliffs); empty without a search."""
    from cleanslate.report import bracket_text, findings_text

    result = trial.capacity
    if result is None:
        return ""
    found = findings_text(result)
    return f"{bracket_text(result)}, {len(result.probes)} probes" + (f"; {found}" if found
                                                                       else "")


def capacity_lines(best: TrialRecord) -> list[str]:
    """What ``tune`` prints of the best trial's capacity search: the capacity with its bracket,
    the probes and what stopped the search, the crash with its cause, cliffs and unresolved
    probes (the search's own line), and the other measurements' brackets under racing; none
    for a trial without a search."""
    from cleanslate.report import bracket_text

    result = best.capacity
    if result is None:
        return []
    lines = [f"  {result.summary()}"]
    others = [r.capacity for r in best.replicates if r.index > 0 and r.capacity is not None]
    if others:
        lines.append("  its other measurements: " + ", ".join(bracket_text(c) for c in others))
    return lines
