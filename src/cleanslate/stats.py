"""Statistics of repeated measurements: intervals, shares, and paired comparisons.

Every benchmark figure is a sample. This module holds the few estimators cleanslate uses to
say how sure it is of one (``docs/statistics.md``):

- :func:`t_interval`: the mean of independent repeats and its Student-t interval (the repeats'
  means are taken as approximately normal; with one repeat there is no interval);
- :func:`bootstrap_interval`: a percentile bootstrap for statistics that are not means (a p99
  over pooled requests), seeded so that a report computes the same interval twice;
- :func:`wilson`: the Wilson score interval of a share (requests that met an SLO);
- :func:`compare_paired`: two configurations measured in pairs (the same seed and slot for
  both members of a pair), their difference as a ratio with its interval, and the decision a
  sequential race takes after each pair: a **win** or **loss** (the interval excludes no
  difference), a **tie** (two one-sided tests: the interval lies inside ``tie_margin``), or,
  once the pairs run out, **undecided**.

Differences are taken on the log scale (``ln(b / a)`` per pair) and reported as ratios minus
one: a throughput 6 % higher is ``+0.06``, whatever the configurations' absolute speed. Every
look of a sequential race spends part of the error rate (a Bonferroni split over the looks the
race may take), so that looking after every pair does not inflate the false-difference rate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


def _scipy() -> Any:
    """``scipy.stats``, imported when first needed (it takes seconds to import: a report or a
    check that computes no interval does not pay for it)."""
    from scipy import stats

    return stats


def preload() -> None:
    """Import what the intervals need now. A tuning process calls it before its first trial:
    imported on first use, between two trials of one slot, the 1.2 s import held the event loop
    while another slot's level was being measured."""
    _scipy()


#: Repeats below this cannot give a Student-t interval (one repeat has no spread).
MIN_REPEATS = 2

#: Degrees of freedom of the spread before a race may stop for futility.
FUTILITY_MIN_DF = 2


@dataclass(frozen=True)
class Interval:
    """A statistic and its interval; ``low``/``high`` are ``None`` when it has none (one
    sample). ``sd`` is the samples' standard deviation (``None`` below two samples)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    sd: float | None = None
    confidence: float = 0.95

    @property
    def half_width(self) -> float | None:
        """Half the interval's width (``None`` without an interval)."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / 2

    @property
    def cv(self) -> float | None:
        """The samples' coefficient of variation, ``sd / |mean|`` (``None`` without a spread or
        for a zero mean)."""
        if self.sd is None or self.mean == 0:
            return None
        return self.sd / abs(self.mean)

    def relative_half_width(self) -> float | None:
        """The half-width as a share of the mean (``0.02`` is "± 2 %")."""
        hw = self.half_width
        return None if hw is None or self.mean == 0 else hw / abs(self.mean)

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval (never, without one)."""
        return self.low is not None and self.high is not None and self.low <= value <= self.high

    def text(self, digits: int = 1) -> str:
        """``mean ± half-width`` (``mean`` alone with one sample)."""
        hw = self.half_width
        if hw is None:
            return f"{self.mean:,.{digits}f}"
        return f"{self.mean:,.{digits}f} ± {hw:,.{digits}f}"


def _check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence {confidence} is not in [0.5, 1)")


def t_quantile(confidence: float, df: int | float) -> float:
    """The two-sided Student-t critical value for ``confidence`` at ``df`` degrees of freedom
    (the normal one for infinite ``df``)."""
    _check_confidence(confidence)
    if math.isinf(df):
        return float(_scipy().norm.ppf(0.5 + confidence / 2))
    return float(_scipy().t.ppf(0.5 + confidence / 2, df))


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The mean of ``values`` (independent repeats) and its two-sided Student-t interval.
    Raises ``ValueError`` for no values or a non-finite one."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("no values")
    if not all(math.isfinite(v) for v in data):
        raise ValueError("a value is not finite")
    n = len(data)
    mean = math.fsum(data) / n
    if n < MIN_REPEATS:
        return Interval(mean=mean, low=None, high=None, n=n, confidence=confidence)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / (n - 1))
    hw = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return Interval(mean=mean, low=mean - hw, high=mean + hw, n=n, sd=sd, confidence=confidence)


def bootstrap_interval(samples: Sequence[float], statistic: Callable[[Sequence[float]], float],
                       confidence: float = 0.95, *, resamples: int = 1000,
                       seed: int = 0) -> Interval:
    """``statistic`` of ``samples`` with a percentile-bootstrap interval (``resamples``
    resamples with replacement, drawn from ``seed``: the same samples give the same interval).
    ``mean`` is the statistic of the samples themselves; below two samples there is no
    interval."""
    _check_confidence(confidence)
    data = [float(v) for v in samples]
    if not data:
        raise ValueError("no samples")
    point = float(statistic(data))
    if len(data) < MIN_REPEATS:
        return Interval(mean=point, low=None, high=None, n=len(data), confidence=confidence)
    rng = random.Random(seed)
    n = len(data)
    draws = sorted(float(statistic([data[rng.randrange(n)] for _ in range(n)]))
                   for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = draws[max(0, math.floor(tail * resamples))]
    high = draws[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return Interval(mean=point, low=min(low, point), high=max(high, point), n=n,
                    confidence=confidence)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation (numpy's default, as the benchmark
    client's)."""
    data = sorted(values)
    if not data:
        raise ValueError("no values")
    pos = (len(data) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of the share ``successes / n``; ``(0, 1)`` for ``n == 0``."""
    _check_confidence(confidence)
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes of {n}")
    z = float(_scipy().norm.ppf(0.5 + confidence / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - spread), min(1.0, centre + spread)


class Outcome(StrEnum):
    """How a challenger compares with the configuration it was raced against, and how any
    configuration stands against the study's best: the one vocabulary of ``tune``, ``report``
    and their JSON (:data:`OUTCOME_MEANING` says what each word means)."""

    WIN = "win"
    LOSS = "loss"
    TIE = "tie"
    UNDECIDED = "undecided"

    @property
    def meaning(self) -> str:
        """What the word means, for legends and prose (:data:`OUTCOME_MEANING`)."""
        return OUTCOME_MEANING[self]


#: The one table of what each outcome means; ``tune``, the report's console, HTML, CSV and
#: JSON print the outcome's value and, where a reader needs it, this meaning.
OUTCOME_MEANING: dict[Outcome, str] = {
    Outcome.WIN: "shown better (the interval excludes no difference)",
    Outcome.LOSS: "shown worse (the interval excludes no difference)",
    Outcome.TIE: "shown inside the tie margin (two one-sided tests)",
    Outcome.UNDECIDED: "not told apart: neither a difference nor a tie is shown",
}

#: Words earlier versions printed or exported for these outcomes, read as the outcome they
#: meant (:func:`outcome_of`).
LEGACY_OUTCOMES: dict[str, Outcome] = {
    "better": Outcome.WIN, "worse": Outcome.LOSS, "beaten": Outcome.LOSS,
    "tied": Outcome.TIE, "no significant difference": Outcome.UNDECIDED,
    "not told apart": Outcome.UNDECIDED,
}


#: What an interval of two measurements wider than its difference is marked (:func:`too_few`).
TOO_FEW = "too few measurements"


def too_few(diff: float | None, low: float | None, high: float | None, n: int) -> bool:
    """Whether a difference ``diff`` with the interval ``low``..``high`` from ``n``
    measurements (pairs, or the smaller side's) says nothing yet: ``n`` at most 2 and a
    half-width above ``|diff|`` (two pairs of 2-4 % noise give intervals of ±35-75 %)."""
    if diff is None or low is None or high is None:
        return False
    return n <= 2 and (high - low) / 2 > abs(diff)


def outcome_of(text: str) -> Outcome:
    """The outcome ``text`` names: a value of :class:`Outcome` or a word an earlier version
    wrote for one (:data:`LEGACY_OUTCOMES`); ``ValueError`` for anything else."""
    try:
        return Outcome(text)
    except ValueError:
        if text in LEGACY_OUTCOMES:
            return LEGACY_OUTCOMES[text]
        raise


@dataclass(frozen=True)
class Comparison:
    """Two configurations measured in pairs: ``diff`` is ``other / base - 1`` (the geometric
    mean of the pairs' ratios) with its interval ``low``..``high`` at the race's confidence
    (``None`` below two pairs); ``outcome`` is ``None`` while the race should go on."""

    outcome: Outcome | None
    diff: float
    low: float | None
    high: float | None
    pairs: int
    sd: float | None = None

    def text(self) -> str:
        """``+2.1 % [-0.8, +5.0]`` (the interval left out below two pairs)."""
        head = f"{self.diff * 100:+.1f} %"
        if self.low is None or self.high is None:
            return head
        return f"{head} [{self.low * 100:+.1f}, {self.high * 100:+.1f}]"


def log_ratios(base: Sequence[float], other: Sequence[float]) -> list[float]:
    """``ln(other[i] / base[i])`` for each pair; raises ``ValueError`` for a value that is
    not positive and finite, or lists of different lengths."""
    if len(base) != len(other):
        raise ValueError(f"{len(base)} base values against {len(other)} others")
    out = []
    for a, b in zip(base, other, strict=True):
        if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
            raise ValueError(f"a paired value is not positive and finite: {a}, {b}")
        out.append(math.log(b / a))
    return out


def compare_paired(base: Sequence[float], other: Sequence[float], *, tie_margin: float = 0.03,
                   confidence: float = 0.95, max_pairs: int = 5,
                   pooled: tuple[float, int] | None = None,
                   prior: tuple[float, int] | None = None,
                   higher_is_better: bool = True, futility: bool = True) -> Comparison:
    """Compare ``other`` with ``base``, measured in pairs (``base[i]`` with ``other[i]``).

    The decision after ``len(base)`` pairs, each look of a race of up to ``max_pairs`` pairs
    spending ``(1 - confidence) / (max_pairs - 1)`` of the error rate:

    - **win** / **loss**: the two-sided interval of the mean log ratio excludes 0 (``win``
      when ``other`` is better in the objective's direction);
    - **tie**: both one-sided tests reject a difference beyond ``tie_margin`` (the interval
      at twice the per-look error lies inside ``±ln(1 + tie_margin)``);
    - **undecided**: ``max_pairs`` pairs and neither; otherwise ``None`` (measure another pair).

    ``pooled``, ``(sum of squares, degrees of freedom)`` of paired log ratios around their own
    means from other races of the same study, sharpens the spread estimate (the same slot, the
    same engine: the noise of one pair is taken to be that of another). ``prior``, an assumed
    spread in the same form, is added to them (a moderated t: ``tune.race.noise_prior``).

    With ``futility``, a race is also **undecided** before its last pair when the pairs left
    cannot decide it: a tie is out of reach (the interval at ``max_pairs``, with the spread as
    estimated now, is wider than the margin leaves around the mean) and so is a difference (the
    mean, moved one standard error further from 0, would still lie inside the interval at
    ``max_pairs``). That stop decides nothing either way; it only saves the pairs.
    """
    _check_confidence(confidence)
    if not 0 < tie_margin < 1:
        raise ValueError(f"tie_margin {tie_margin} is not in (0, 1)")
    d = log_ratios(base, other)
    n = len(d)
    if n == 0:
        raise ValueError("no pairs")
    mean = math.fsum(d) / n
    diff = math.expm1(mean)
    ss = math.fsum((x - mean) ** 2 for x in d)
    df = n - 1
    if pooled is not None and pooled[1] > 0:
        ss += pooled[0]
        df += pooled[1]
    if prior is not None and prior[1] > 0:
        ss += prior[0]
        df += prior[1]
    if n < MIN_REPEATS or df < 1:
        return Comparison(outcome=None, diff=diff, low=None, high=None, pairs=n)
    sd = math.sqrt(ss / df)
    se = sd / math.sqrt(n)
    looks = max(1, max_pairs - 1)
    alpha = (1 - confidence) / looks
    crit = t_quantile(1 - alpha, df)
    low, high = mean - crit * se, mean + crit * se
    tost = t_quantile(1 - 2 * alpha, df)
    margin = math.log1p(tie_margin)
    outcome: Outcome | None = None
    if low > 0 or high < 0:
        better = (low > 0) == higher_is_better
        outcome = Outcome.WIN if better else Outcome.LOSS
    elif -margin < mean - tost * se and mean + tost * se < margin:
        outcome = Outcome.TIE
    elif n >= max_pairs or (futility and _futile(mean, sd, n, df, max_pairs, alpha, margin)):
        outcome = Outcome.UNDECIDED
    return Comparison(outcome=outcome, diff=diff, low=math.expm1(low), high=math.expm1(high),
                      pairs=n, sd=sd)


def _futile(mean: float, sd: float, n: int, df: int, max_pairs: int, alpha: float,
            margin: float) -> bool:
    """Whether the pairs left to a race (up to ``max_pairs``) can no longer decide it, the
    spread ``sd`` as estimated now (see :func:`compare_paired`); never on a spread of fewer
    than :data:`FUTILITY_MIN_DF` degrees of freedom (two pairs say little of it)."""
    if df < FUTILITY_MIN_DF:
        return False
    df_end = df + (max_pairs - n)
    se_end = sd / math.sqrt(max_pairs)
    tie_reach = t_quantile(1 - 2 * alpha, df_end) * se_end
    if abs(mean) + tie_reach < margin:
        return False
    boundary = t_quantile(1 - alpha, df_end) * se_end
    return abs(mean) + sd / math.sqrt(n) < boundary


def pooled_squares(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """``(sum of squares around each group's mean, degrees of freedom)`` over groups of paired
    log ratios (a group below two values adds nothing)."""
    ss = 0.0
    df = 0
    for group in groups:
        if len(group) < MIN_REPEATS:
            continue
        mean = math.fsum(group) / len(group)
        ss += math.fsum((x - mean) ** 2 for x in group)
        df += len(group) - 1
    return ss, df


__all__ = ["LEGACY_OUTCOMES", "MIN_REPEATS", "OUTCOME_MEANING", "TOO_FEW", "Comparison", "Interval",
           "Outcome", "bootstrap_interval", "compare_paired", "log_ratios", "outcome_of",
           "percentile", "pooled_squares", "preload", "t_interval", "t_quantile", "too_few",
           "wilson"]
