"""How sure a report is of its numbers: intervals of trials and levels, the best configuration's
tie set, differences between two configurations, and what the statistics cost.

Plain data over trial records (no rich, no matplotlib). The estimators are those of
:mod:`cleanslate.stats`; the tie set is :func:`cleanslate.tune.race.tie_set`'s, the one the
study decided with. What this module adds is what only a report needs:

- :func:`level_interval`: one metric of one level over a trial's counted measurements (mean and
  Student-t interval), the measurement-0 levels being the trial's own;
- :func:`difference`: configuration ``b`` against ``a`` (two studies' trials, or an ablation's
  change against its baseline): paired by seed when they share at least two seeds
  (:func:`cleanslate.stats.compare_paired`, one look: the whole error rate on one test), else
  Welch's interval on the log means when both have two measurements or more, else the ratio of
  single values with no interval. A difference whose interval holds 0 is never a win: it is a
  ``tie`` (inside the tie margin by two one-sided tests) or ``undecided``.

Outcomes are named in :class:`cleanslate.stats.Outcome`'s words (``win``, ``loss``, ``tie``,
``undecided``), as ``tune`` names them; :data:`cleanslate.stats.OUTCOME_MEANING` says what each
means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from cleanslate.bench import LevelResult
from cleanslate.report._documents import DifferenceDocument
from cleanslate.stats import (
    TOO_FEW,
    Interval,
    Outcome,
    compare_paired,
    outcome_of,
    t_interval,
    t_quantile,
    too_few,
)
from cleanslate.store import TrialRecord, TrialStatus, level_metric
from cleanslate.tune.study import Objective, Statistics, StudySpec

#: What a difference is called, by the comparison's outcome (from ``b``'s side): the
#: outcome's own word (:class:`cleanslate.stats.Outcome`), as ``tune`` prints it.
BETTER = Outcome.WIN.value
WORSE = Outcome.LOSS.value
TIE = Outcome.TIE.value
NO_DIFFERENCE = Outcome.UNDECIDED.value
ONE_RUN = "one run each: no interval"


def statistics_of(spec: dict[str, Any]) -> Statistics:
    """A stored spec's ``statistics:`` (the defaults for a study recorded before it, or one whose
    block this cleanslate cannot read)."""
    try:
        return Statistics.model_validate(spec.get("statistics") or {})
    except ValidationError:
        return Statistics()


def study_spec(spec: dict[str, Any]) -> StudySpec:
    """A stored spec as a :class:`StudySpec`; one that no longer validates (a study recorded by
    another version) keeps what the statistics need: its objective and ``statistics:``."""
    try:
        return StudySpec.model_validate(spec)
    except (ValidationError, ValueError):
        return StudySpec.model_construct(objective=Objective.of(spec),
                                         statistics=statistics_of(spec))


def counted_values(record: TrialRecord) -> list[float]:
    """The objective values that count toward a trial's value: its counted replicates, or its
    one value for a trial without replicates (none for a trial that was not feasible)."""
    if record.status != TrialStatus.FEASIBLE or record.value is None:
        return []
    if record.replicates:
        return [r.value for r in record.counted() if r.value is not None]
    return [record.value]


def by_seed(record: TrialRecord) -> dict[int, float]:
    """A trial's counted values by the seed of their prompts (the first one of a seed measured
    twice); empty for a trial without replicates (its seed is not recorded)."""
    out: dict[int, float] = {}
    if record.status != TrialStatus.FEASIBLE:
        return out
    for r in record.counted():
        if r.value is not None and r.seed not in out:
            out[r.seed] = r.value
    return out


def trial_interval(record: TrialRecord, confidence: float = 0.95) -> Interval | None:
    """A trial's value with its interval: the recorded ``ci_low``..``ci_high`` when there is one,
    else the Student-t interval of its counted values (no interval for one value); ``None`` for
    a trial without a value."""
    if record.status != TrialStatus.FEASIBLE or record.value is None:
        return None
    if record.ci_low is not None and record.ci_high is not None:
        return Interval(mean=record.value, low=record.ci_low, high=record.ci_high,
                        n=max(record.n_replicates, 2), confidence=confidence)
    values = counted_values(record)
    if len(values) >= 2:
        return t_interval(values, confidence)
    return Interval(mean=record.value, low=None, high=None, n=1, confidence=confidence)


def replicate_levels(record: TrialRecord) -> list[tuple[LevelResult, ...]]:
    """The levels of each counted measurement (measurement 0's are the trial's own); the trial's
    levels alone for a trial without replicates."""
    if not record.replicates:
        return [record.levels] if record.levels else []
    out = []
    for r in record.counted():
        levels = r.levels or (record.levels if r.index == 0 else ())
        if levels:
            out.append(levels)
    return out


def level_values(record: TrialRecord, label: str, key: str) -> list[float]:
    """``key`` of the level labelled ``label`` in each counted measurement that has it."""
    out = []
    for levels in replicate_levels(record):
        level = next((lv for lv in levels if lv.label == label), None)
        value = level_metric(level, key) if level is not None else None
        if value is not None:
            out.append(value)
    return out


def level_interval(record: TrialRecord, label: str | None, key: str,
                   confidence: float = 0.95) -> Interval | None:
    """``key`` of a level over the trial's counted measurements: the mean with its Student-t
    interval (none below two measurements); ``None`` when no measurement has it."""
    if label is None:
        return None
    values = level_values(record, label, key)
    return t_interval(values, confidence) if values else None


def half_width_text(mean_text: str, hw: float) -> str:
    """A half-width to go beside a mean shown as ``mean_text``: with the mean's decimals, or
    more (two at most) until it shows two significant digits."""
    decimals = len(mean_text.rsplit(".", 1)[1]) if "." in mean_text else 0
    for extra in range(3):
        text = f"{hw:,.{decimals + extra}f}"
        if hw == 0 or abs(hw) >= 10 ** (1 - decimals - extra):
            return text
    return text


def pm_text(interval: Interval | None, fmt: Any = None) -> str:
    """``mean ± half-width`` with ``fmt`` (a function of a number to text) for the mean and the
    half-width at the mean's precision (:func:`half_width_text`); the mean alone without an
    interval, ``-`` without a value."""
    if interval is None:
        return "-"
    show = fmt if fmt is not None else (lambda v: f"{v:,.1f}")
    hw = interval.half_width
    mean = show(interval.mean)
    return mean if hw is None else f"{mean} ± {half_width_text(mean, hw)}"


@dataclass(frozen=True)
class Difference:
    """Configuration ``b`` against ``a``: ``diff`` is ``b / a - 1`` (``None`` when a side has
    no value), ``low``..``high`` its interval (``None`` without one); ``method`` ``paired``
    (by seed), ``welch`` (unpaired means), ``race`` (the study's own race), ``single`` (one
    value on a side) or ``none``; ``verdict`` what it means, from ``b``'s side, in the
    objective's direction: ``win``, ``loss``, ``tie``, ``undecided`` (the outcome's word),
    ``one run each: no interval``, or why there is nothing to compare."""

    diff: float | None
    low: float | None
    high: float | None
    method: str
    verdict: str
    n_a: int = 0
    n_b: int = 0
    pairs: int = 0

    @property
    def significant(self) -> bool:
        """Whether the interval excludes no difference (a win or a loss)."""
        return self.verdict in (BETTER, WORSE)

    @property
    def measurements(self) -> int:
        """How many measurements the interval rests on: the pairs of a paired comparison or a
        race, else the smaller side's."""
        return self.pairs if self.method in ("paired", "race") else min(self.n_a, self.n_b)

    @property
    def too_few(self) -> bool:
        """An interval from two measurements or fewer that is wider than the difference
        itself: ``too few measurements`` to say anything of the effect
        (:func:`cleanslate.stats.too_few`)."""
        return too_few(self.diff, self.low, self.high, self.measurements)

    @property
    def verdict_text(self) -> str:
        """The verdict, with ``: too few measurements`` when :attr:`too_few`."""
        return self.verdict + (f": {TOO_FEW}" if self.too_few else "")

    def text(self) -> str:
        """``+2.1 % [-0.8, +5.0] tie (paired, 3 pairs)``."""
        if self.diff is None:
            return self.verdict
        head = f"{self.diff * 100:+.1f} %"
        if self.low is not None and self.high is not None:
            head += f" [{self.low * 100:+.1f}, {self.high * 100:+.1f}]"
        how = {"paired": f"paired, {self.pairs} pairs",
               "race": f"race, {self.pairs} pairs" if self.low is not None else
               "first measurement beyond the noise: no race",
               "welch": f"unpaired, {self.n_a} and {self.n_b} runs"}.get(self.method)
        return f"{head} {self.verdict_text}" + (f" ({how})" if how else "")

    def inverted(self) -> Difference:
        """``a`` against ``b``: the ratio and its interval inverted, better and worse
        swapped."""
        def inv(x: float | None) -> float | None:
            return None if x is None or x <= -1 else 1 / (1 + x) - 1

        verdict = {BETTER: WORSE, WORSE: BETTER}.get(self.verdict, self.verdict)
        return Difference(diff=inv(self.diff), low=inv(self.high), high=inv(self.low),
                          method=self.method, verdict=verdict, n_a=self.n_b, n_b=self.n_a,
                          pairs=self.pairs)

    def document(self) -> DifferenceDocument:
        return {"diff": self.diff, "ci_low": self.low, "ci_high": self.high,
                "method": self.method, "verdict": self.verdict,
                "significant": self.significant, "n_a": self.n_a, "n_b": self.n_b,
                "pairs": self.pairs, "too_few_measurements": self.too_few}


def _verdict(outcome: Outcome | None) -> str:
    return str(outcome) if outcome is not None else NO_DIFFERENCE


def welch(a: Sequence[float], b: Sequence[float], *, tie_margin: float, confidence: float,
          higher_is_better: bool = True) -> tuple[float, float, float, Outcome]:
    """``b`` against ``a`` measured apart (no pairing): Welch's interval of the difference of
    the log means, as ratios minus one ``(diff, low, high)``, and the outcome: win or loss when
    the interval excludes 0, tie when both one-sided tests put it inside ``tie_margin``, else
    undecided. Needs two values a side, each positive and finite."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's interval needs two values on each side")
    if not all(math.isfinite(v) and v > 0 for v in (*a, *b)):
        raise ValueError("a value is not positive and finite")
    la = t_interval([math.log(v) for v in a], confidence)
    lb = t_interval([math.log(v) for v in b], confidence)
    assert la.sd is not None and lb.sd is not None
    va, vb = la.sd ** 2 / la.n, lb.sd ** 2 / lb.n
    mean = lb.mean - la.mean
    se = math.sqrt(va + vb)
    if se == 0:
        df: float = math.inf
    else:
        df = (va + vb) ** 2 / (va ** 2 / (la.n - 1) + vb ** 2 / (lb.n - 1))
    crit = t_quantile(confidence, df)
    low, high = mean - crit * se, mean + crit * se
    tost = t_quantile(max(0.5, 1 - 2 * (1 - confidence)), df)
    margin = math.log1p(tie_margin)
    if low > 0 or high < 0:
        outcome = Outcome.WIN if (low > 0) == higher_is_better else Outcome.LOSS
    elif -margin < mean - tost * se and mean + tost * se < margin:
        outcome = Outcome.TIE
    else:
        outcome = Outcome.UNDECIDED
    return math.expm1(mean), math.expm1(low), math.expm1(high), outcome


def difference(a: TrialRecord, b: TrialRecord, stats: Statistics, *,
               higher_is_better: bool = True) -> Difference:
    """``b`` against ``a`` (see the module doc for which test)."""
    va, vb = counted_values(a), counted_values(b)
    if not va or not vb:
        missing = [f"#{t.number} {t.cause or t.status}" for t, v in ((a, va), (b, vb))
                   if not v]
        return Difference(diff=None, low=None, high=None, method="none",
                          verdict="no value: " + ", ".join(missing), n_a=len(va),
                          n_b=len(vb))
    sa, sb = by_seed(a), by_seed(b)
    seeds = sorted(set(sa) & set(sb))
    if len(seeds) >= 2:
        found = compare_paired([sa[s] for s in seeds], [sb[s] for s in seeds],
                               tie_margin=stats.tie_margin, confidence=stats.confidence,
                               max_pairs=2, higher_is_better=higher_is_better)
        return Difference(diff=found.diff, low=found.low, high=found.high, method="paired",
                          verdict=_verdict(found.outcome), n_a=len(va), n_b=len(vb),
                          pairs=found.pairs)
    if len(va) >= 2 and len(vb) >= 2:
        diff, low, high, outcome = welch(va, vb, tie_margin=stats.tie_margin,
                                         confidence=stats.confidence,
                                         higher_is_better=higher_is_better)
        return Difference(diff=diff, low=low, high=high, method="welch",
                          verdict=_verdict(outcome), n_a=len(va), n_b=len(vb))
    mean_a, mean_b = math.fsum(va) / len(va), math.fsum(vb) / len(vb)
    diff_single = mean_b / mean_a - 1 if mean_a else None
    return Difference(diff=diff_single, low=None, high=None, method="single",
                      verdict=ONE_RUN if len(va) == len(vb) == 1 else
                      "one run on a side: no interval", n_a=len(va), n_b=len(vb))


def race_difference(challenger: TrialRecord, against: int) -> Difference | None:
    """The last race ``challenger`` ran against trial ``against``, as a :class:`Difference`
    (``None`` without one)."""
    races = [r for r in challenger.races if r.against == against]
    if not races:
        return None
    race = races[-1]
    try:
        outcome: Outcome | None = outcome_of(race.outcome)
    except ValueError:
        outcome = None
    return Difference(diff=race.diff, low=race.low, high=race.high, method="race",
                      verdict=_verdict(outcome), pairs=race.pairs)


#: How a trial stands against the study's best: ``best``, else the outcome's word
#: (:meth:`cleanslate.tune.race.TieSet.against_best`).
BEST = "best"
TIED = Outcome.TIE.value
UNDECIDED = Outcome.UNDECIDED.value
BEATEN = Outcome.LOSS.value


@dataclass(frozen=True)
class Standing:
    """The study's best trial (``None`` without a feasible one) with its interval, the trials
    tied with it and those not told apart from it (``undecided``), the trials it beat, the
    comparison of each with it (by trial number), and the GPU-seconds of the measurements beyond
    each configuration's first (``statistics_gpu_s``) of all of them (``total_gpu_s``)."""

    best: int | None
    interval: Interval | None = None
    tied: tuple[int, ...] = ()
    undecided: tuple[int, ...] = ()
    beaten: tuple[int, ...] = ()
    comparisons: dict[int, Difference] = field(default_factory=dict)
    statistics_gpu_s: float = 0.0
    total_gpu_s: float = 0.0
    replicates: int = 0
    note: str | None = None

    def of(self, number: int) -> str:
        """``best``, ``tie``, ``undecided``, ``loss`` (a race or the paired measurements
        put it behind) or empty (not compared with the best) for trial ``number``."""
        if number == self.best:
            return BEST
        if number in self.tied:
            return TIED
        if number in self.undecided:
            return UNDECIDED
        if number in self.beaten:
            return BEATEN
        return ""

    @property
    def share(self) -> float | None:
        """The statistics' share of the study's GPU-seconds (``None`` when none were
        recorded)."""
        return self.statistics_gpu_s / self.total_gpu_s if self.total_gpu_s > 0 else None

    def cost_text(self) -> str:
        """``statistics: 6 more measurements, 840 GPU-s of 2,100 GPU-s (40 %)``."""
        head = f"statistics: {self.replicates} more measurement" + (
            "s" if self.replicates != 1 else "")
        if self.total_gpu_s <= 0:
            return head + " (no GPU-seconds recorded)"
        share = self.share or 0.0
        return (f"{head}, {self.statistics_gpu_s:,.0f} GPU-s of {self.total_gpu_s:,.0f} GPU-s "
                f"({share * 100:.0f} %)")


def standing(trials: Sequence[TrialRecord], spec: dict[str, Any]) -> Standing:
    """The study's best and its tie set as the study decided them
    (:func:`cleanslate.tune.race.tie_set`), with each comparison as a :class:`Difference`."""
    from cleanslate.tune.race import tie_set

    study = study_spec(spec)
    try:
        found = tie_set(list(trials), study)
    except ValueError as exc:  # a record this cleanslate cannot read (a race's outcome)
        spent = sum(t.statistics_gpu_s() for t in trials)
        return Standing(best=None, statistics_gpu_s=spent,
                        total_gpu_s=spent + sum(t.gpu_s for t in trials),
                        note=f"no tie set: a recorded race or measurement is not readable "
                             f"({exc})")
    best = found.best
    by_number = {t.number: t for t in trials}
    comparisons: dict[int, Difference] = {}
    for number, comp in found.comparisons.items():
        other = by_number.get(number)
        raced = best is not None and other is not None and (
            any(r.against == best.number for r in other.races)
            or any(r.against == number for r in best.races))
        comparisons[number] = Difference(
            diff=comp.diff, low=comp.low, high=comp.high,
            method="race" if raced else "paired", verdict=_verdict(comp.outcome),
            pairs=comp.pairs)
    return Standing(
        best=best.number if best is not None else None, interval=found.interval,
        tied=tuple(found.tied), undecided=tuple(found.undecided), beaten=tuple(found.beaten),
        comparisons=comparisons, statistics_gpu_s=found.statistics_gpu_s,
        total_gpu_s=found.total_gpu_s,
        replicates=sum(1 for t in trials for r in t.replicates if r.index > 0))


__all__ = ["BEATEN", "BEST", "BETTER", "NO_DIFFERENCE", "ONE_RUN", "TIE", "TIED", "UNDECIDED",
           "WORSE", "Difference", "Standing", "by_seed", "counted_values", "difference",
           "half_width_text", "level_interval", "level_values", "pm_text", "race_difference",
           "replicate_levels", "standing", "statistics_of", "study_spec", "trial_interval",
           "welch"]
