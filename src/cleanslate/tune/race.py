"""Noise-aware selection: which configuration races the incumbent, how, and what a study's
measurements say about its best (``docs/statistics.md``).

A study with ``statistics: {replicates: auto}`` measures each configuration once. A
configuration whose first measurement comes within the noise of the *incumbent* (the best
configuration so far) is raced against it on the same slot: pairs of measurements, each a whole
cycle on a new server, the two members of a pair with the same seeded prompts (common random
numbers) and in alternating order (incumbent then challenger, then challenger then incumbent:
a drift in time falls on both alike), until :func:`cleanslate.stats.compare_paired` says win,
loss or tie, or the study's ``max_replicates`` pairs are used (undecided). A winner becomes the
incumbent. With ``replicates: N`` every configuration is measured ``N`` times with the same
seeds, and the comparisons are made at the end, paired by seed.

The pure parts (:func:`needs_race`, :func:`pair_order`, :func:`tie_set`, :func:`pooled_noise`,
:func:`host_effects`) take records and return decisions; :class:`Racer` runs a race through a
``measure`` callback (the fleet passes one that runs a verified cycle).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from cleanslate.stats import (
    Comparison,
    Interval,
    Outcome,
    compare_paired,
    outcome_of,
    pooled_squares,
    t_interval,
)
from cleanslate.store import Race, Replicate, TrialRecord, TrialStatus
from cleanslate.tune.study import Statistics, StudySpec

#: The restart-to-restart coefficient of variation taken for a study's first race, before it
#: has measured its own: the H200 measurements (``docs/sim-model.md``) gave 2.4 % between the
#: means of three restarts and 2.0-4.3 % inside one server.
PRIOR_CV = 0.03

#: How many standard deviations of a pair's log ratio "within the noise" spans, beyond the tie
#: margin: a challenger below the incumbent by more than that is a loss without a race.
BAND_SDS = 2.0

#: Whether the screening pair (the two first measurements, which decided that a race is run and
#: which made the incumbent the incumbent) counts in the race's decision. Left out, it cannot
#: bias the race; benchmarks/selection.py (100 seeds, the quick start's statistics) measured the
#: trade: false difference 1 % -> 5 % on the quick-start ablation and 7.9 % -> 4.9 % on the
#: 120-configuration space, GPU-seconds 2.35x -> 3.24x and 1.43x -> 1.73x single-shot's. Kept.
SCREEN_PAIR_COUNTS = True

#: Degrees of freedom of the study's pooled noise before it replaces :data:`PRIOR_CV`.
MIN_POOLED_DF = 3

#: The restart-to-restart coefficient of variation that every comparison's spread starts from
#: (:func:`noise_prior`): the H200's 2.4 % between restarts, as measured. :data:`PRIOR_CV` is
#: wider on purpose: a band too narrow loses a better configuration without a race, while a
#: spread too wide hides ties (at 3 %, 30 worlds of 2 % noise gave 10 ties of equal
#: configurations instead of 16; ``tests/tune/test_race.py``).
SPREAD_PRIOR_CV = 0.024

#: Degrees of freedom that :data:`SPREAD_PRIOR_CV` counts for in every comparison's spread.
PRIOR_DF = 2


def _sign(spec: StudySpec) -> float:
    return 1.0 if spec.objective.direction == "maximize" else -1.0


def measurements(trial: TrialRecord) -> list[Replicate]:
    """A trial's counted measurements; for a trial recorded before replicates existed, its own
    value as measurement 0."""
    counted = trial.counted()
    if counted or trial.replicates:
        return counted
    if trial.status == TrialStatus.FEASIBLE and trial.value is not None:
        return [Replicate(index=0, seed=0, status=TrialStatus.FEASIBLE, value=trial.value,
                          best_level=trial.best_level, run_id=trial.run_id, host=trial.host,
                          slot=trial.slot)]
    return []


def values(trial: TrialRecord) -> list[float]:
    return [r.value for r in measurements(trial) if r.value is not None]


def interval(trial: TrialRecord, confidence: float = 0.95) -> Interval | None:
    """The trial's mean and Student-t interval over its counted measurements (``None`` for a
    trial without a value)."""
    vals = values(trial)
    return t_interval(vals, confidence) if vals else None


def summarize(trial: TrialRecord, confidence: float) -> TrialRecord:
    """``trial`` with ``value``, ``ci_low``, ``ci_high`` and ``n_replicates`` recomputed from its
    counted measurements (its first value kept in ``first_value``)."""
    found = interval(trial, confidence)
    if found is None:
        return trial
    first = next((r.value for r in trial.replicates if r.index == 0), trial.first_value)
    low, high = found.low, found.high
    uppers = [r.capacity.upper for r in trial.counted()
              if r.capacity is not None and r.capacity.upper is not None]
    if low is not None and high is not None and uppers:
        # A capacity is the low end of its search's bracket: the boundaries measured lie up to
        # the brackets' upper ends, so the interval of their mean reaches at least the mean of
        # those (three equal answers of 136 in [136, 144) are not "136 +- 0").
        low, high = min(low, found.mean), max(high, sum(uppers) / len(uppers))
    return trial.model_copy(update={
        "value": found.mean, "ci_low": low, "ci_high": high, "n_replicates": found.n,
        "first_value": first if first is not None else trial.value})


def _pairs(a: TrialRecord, b: TrialRecord, slot: str | None = None,
           blocked: bool = False, skip: int | None = None) -> tuple[list[float], list[float]]:
    """The values of ``a`` and ``b`` measured with the same seed (on ``slot`` when given; on
    the same slot, whichever, when ``blocked``), matched pair by pair in seed order (the first
    of each seed when one was measured twice)."""
    def by_seed(t: TrialRecord) -> dict[tuple[str | None, int], float]:
        out: dict[tuple[str | None, int], float] = {}
        for r in measurements(t):
            key = (r.slot if blocked else None, r.seed)
            if r.seed == skip:
                continue
            if r.value is not None and (slot is None or r.slot == slot) and key not in out:
                out[key] = r.value
        return out

    sa, sb = by_seed(a), by_seed(b)
    keys = sorted(set(sa) & set(sb), key=lambda k: (k[1], k[0] or ""))
    return [sa[k] for k in keys], [sb[k] for k in keys]


def _has(trial: TrialRecord, seed: int, slot: str | None) -> bool:
    """Whether ``trial`` has a measurement with ``seed`` on ``slot`` (counted or not: a seed
    that failed is not tried again)."""
    return any(r.seed == seed and r.slot == slot for r in trial.replicates)


def pooled_noise(trials: Sequence[TrialRecord]) -> tuple[float, int]:
    """The study's own noise: sums of squares and degrees of freedom of the paired log ratios
    of every race it ran (:func:`cleanslate.stats.pooled_squares`)."""
    by_number = {t.number: t for t in trials}
    groups = []
    for t in trials:
        for race in t.races:
            other = by_number.get(race.against)
            if other is None:
                continue
            a, b = _pairs(other, t, race.slot)
            if len(a) >= 2:
                groups.append([math.log(y / x) for x, y in zip(a, b, strict=True)
                               if x > 0 and y > 0])
    return pooled_squares(groups)


def pair_sd(trials: Sequence[TrialRecord]) -> float:
    """The standard deviation of one pair's log ratio: the study's pooled one once it has
    :data:`MIN_POOLED_DF` degrees of freedom, else :data:`PRIOR_CV` times the square root of
    two (two independent restarts)."""
    ss, df = pooled_noise(trials)
    if df >= MIN_POOLED_DF:
        return math.sqrt(ss / df)
    return PRIOR_CV * math.sqrt(2)


def noise_prior() -> tuple[float, int]:
    """``(sum of squares, degrees of freedom)`` that every comparison adds to its spread: a
    pair's log ratio at :data:`SPREAD_PRIOR_CV` per measurement, counted as :data:`PRIOR_DF`
    degrees of freedom (a moderated t: the spread is that of the race's own pairs, the study's
    other races and this prior together). Without it, a first race of three pairs judges its
    spread on two degrees of freedom, whose t quantile at each look's error is 6.2: a lead of
    +27 % measured +32, +16 and +34 % stayed undecided (``benchmarks/search_efficiency.py``,
    the large space's seed 27). Its weight falls as the study measures its own spread. What
    it costs where the true spread is above it: ``benchmarks/race_prior.py``
    (``docs/statistics.md``). Setting it aside when a race's own spread is above it beyond
    chance was tried and dropped: at a true 7 % the races whose spread happened to look small
    (the ones that err) kept it all the same, and seed 27's race lost it."""
    sd = SPREAD_PRIOR_CV * math.sqrt(2)
    return (PRIOR_DF * sd * sd, PRIOR_DF)


def band(stats: Statistics, sd: float) -> float:
    """How far below the incumbent (on the log scale) a first measurement is still "within
    the noise": the tie margin plus :data:`BAND_SDS` pair deviations."""
    return math.log1p(stats.tie_margin) + BAND_SDS * sd


def needs_race(first: float, incumbent: float, spec: StudySpec, sd: float) -> bool:
    """Whether a challenger whose first measurement is ``first`` races an incumbent valued
    ``incumbent``: it is better, or worse by less than :func:`band`. A challenger further
    behind is a loss without a race."""
    if first <= 0 or incumbent <= 0:
        return False
    lead = _sign(spec) * math.log(first / incumbent)
    return lead > -band(spec.statistics, sd)


def decided_by_crash(trial: TrialRecord) -> str | None:
    """The race log's line for a trial decided by its crash: its server crashed at a level of
    the ladder the objective needs (``infeasible``, the value of the levels below kept:
    ``docs/study.md``, "Crashes"), so it is neither raced nor measured again:
    ``trial 4 crashed at c=256 (python_exception): decided by its crash, not raced``.
    ``None`` for any other trial (a capacity search's crash bounds its answer, which is raced
    as any)."""
    crash = trial.crash_text
    if trial.status != TrialStatus.INFEASIBLE or crash is None:
        return None
    return f"trial {trial.number} {crash}: decided by its crash, not raced"


def pair_order(pair: int) -> tuple[str, str]:
    """Who is measured first in race pair ``pair`` (0 is the two first measurements):
    incumbent then challenger, then challenger then incumbent, alternating."""
    return ("challenger", "incumbent") if pair % 2 == 1 else ("incumbent", "challenger")


def grid_noise(spec: StudySpec) -> tuple[float, int] | None:
    """For a capacity objective, the spread that the search's grid alone gives a pair's log
    ratio, as one degree of freedom of pooled noise (``None`` for other objectives). A
    capacity is the lower end of a bracket up to ``capacity.tolerance`` wide with the true
    boundary anywhere in it, so two measurements that agree exactly still each miss the truth
    by up to one step: taken as uniform over ``log(1 + tolerance)``, a value's variance is
    ``step^2 / 12`` and a pair's twice that (4.1 % as a standard deviation at the default 10 %).
    Without it, pairs that agree exactly (common: capacities move in steps) have no spread, and
    two pairs of 60 against 64 made a win with an interval of zero width."""
    if not spec.objective.capacity:
        return None
    step = math.log1p(spec.capacity.tolerance)
    return (2 * step * step / 12, 1)


def compare(incumbent: TrialRecord, challenger: TrialRecord, spec: StudySpec,
            pooled: tuple[float, int] | None = None, slot: str | None = None,
            max_pairs: int | None = None, blocked: bool = False,
            comparisons: int = 1, skip: int | None = None) -> Comparison | None:
    """The challenger against the incumbent over their pairs (matched by seed, on ``slot``
    when given, on a common slot when ``blocked``); ``None`` without a pair. One of
    ``comparisons`` made together: each gets that share of the error (Bonferroni)."""
    a, b = _pairs(incumbent, challenger, slot, blocked, skip)
    if not a:
        return None
    stats = spec.statistics
    confidence = 1 - (1 - stats.confidence) / max(1, comparisons)
    grid = grid_noise(spec)
    if grid is not None:
        pooled = (grid[0] + (pooled[0] if pooled else 0.0), grid[1] + (pooled[1] if pooled
                                                                       else 0))
    return compare_paired(a, b, tie_margin=stats.tie_margin, confidence=confidence,
                          max_pairs=max_pairs or stats.max_replicates, pooled=pooled,
                          prior=noise_prior(),
                          higher_is_better=spec.objective.direction == "maximize")


@dataclass(frozen=True)
class TieSet:
    """What a study's measurements say about its best: the best trial (``None`` without a
    feasible one) with its interval, the trials tied with it (``tied``, outcome ``tie``),
    those not told apart from it (``undecided``), and those it beat (``beaten``, outcome
    ``loss``); ``comparisons`` by trial number (each against the best, or the race that decided
    it). :meth:`against_best` names each in :class:`~cleanslate.stats.Outcome`'s words."""

    best: TrialRecord | None
    interval: Interval | None = None
    tied: tuple[int, ...] = ()
    undecided: tuple[int, ...] = ()
    beaten: tuple[int, ...] = ()
    comparisons: dict[int, Comparison] = field(default_factory=dict)
    statistics_gpu_s: float = 0.0
    total_gpu_s: float = 0.0

    @property
    def contenders(self) -> tuple[int, ...]:
        """The trials not shown worse than the best: the best, those tied with it and those
        not told apart from it (the set two runs of a study should overlap in)."""
        if self.best is None:
            return ()
        return (self.best.number, *self.tied, *self.undecided)

    def against_best(self, number: int) -> Outcome | None:
        """Trial ``number`` against the best: ``tie``, ``undecided`` or ``loss``; ``None`` for
        the best itself and a trial not compared (not feasible)."""
        if number in self.tied:
            return Outcome.TIE
        if number in self.undecided:
            return Outcome.UNDECIDED
        if number in self.beaten:
            return Outcome.LOSS
        return None


def _feasible(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    return [t for t in trials if t.status == TrialStatus.FEASIBLE and t.value is not None]


def _beaten(trials: Sequence[TrialRecord]) -> set[int]:
    """Trials a race says are worse: a challenger that lost, an incumbent a challenger beat."""
    out: set[int] = set()
    for t in trials:
        for race in t.races:
            if race.outcome == Outcome.LOSS:
                out.add(t.number)
            elif race.outcome == Outcome.WIN:
                out.add(race.against)
    return out


def tie_set(trials: Sequence[TrialRecord], spec: StudySpec) -> TieSet:
    """The best configuration of a study and the configurations tied with it.

    The best is the feasible trial with the best mean among those no race beat (a challenger
    that lost, an incumbent a challenger beat). Each other feasible trial is compared with it
    by the race they ran (either way round), else, after the fact, by the pairs they share (the
    same seed on the same slot; one look, with the study's pooled noise, the error rate shared
    among all such comparisons), else it is beaten when
    a race beat it and undecided when not. Tied are those the comparison calls ``tie``,
    undecided those it could not tell apart. With ``replicates: N`` (no races) the comparisons
    are by pairs alone. Single-shot studies have no intervals: the best alone (by value).
    (``benchmarks/selection.py`` measured the alternative, the incumbent after every race as the
    best: a true best that came out undecided against an early incumbent was then reported
    worse, 7 and 12 wrong winners in 30 on the two larger surfaces against 0 and 0.)
    """
    feasible = _feasible(trials)
    stats = spec.statistics
    spent = sum(t.statistics_gpu_s() for t in trials)
    total = spent + sum(t.gpu_s for t in trials)
    if not feasible:
        return TieSet(best=None, statistics_gpu_s=spent, total_gpu_s=total)
    sign = _sign(spec)
    beaten = _beaten(trials) if stats.racing else set()
    candidates = [t for t in feasible if t.number not in beaten] or feasible
    best = max(candidates, key=lambda t: sign * (t.value or 0.0))
    if not stats.racing and stats.fixed_count() <= 1:
        return TieSet(best=best, interval=interval(best, stats.confidence),
                      statistics_gpu_s=spent, total_gpu_s=total)
    pooled = pooled_noise(trials)
    tied: list[int] = []
    undecided: list[int] = []
    lost: list[int] = []
    comparisons: dict[int, Comparison] = {}
    def raced(t: TrialRecord) -> bool:
        return any(r.against == best.number for r in t.races) or any(
            r.against == t.number for r in best.races)

    # The comparisons made after the fact are many at once (every configuration the best never
    # raced): they share the error rate, so that a study of a hundred equal configurations
    # does not call five of them different by chance.
    after = max(1, sum(1 for t in feasible if t.number != best.number and not raced(t)))
    for t in feasible:
        if t.number == best.number:
            continue
        races = [r for r in t.races if r.against == best.number]
        races += [r for r in best.races if r.against == t.number]
        found: Comparison | None = None
        if races:
            race = races[-1]
            found = Comparison(outcome=outcome_of(race.outcome), diff=race.diff, low=race.low,
                               high=race.high, pairs=race.pairs)
            if race.against == t.number:  # the best was the challenger: turn it round
                found = _turned(found)
        else:
            found = compare(best, t, spec, pooled, max_pairs=2, blocked=True,
                            comparisons=after)
            if found is not None and found.outcome is None:
                found = None
        if found is not None:
            comparisons[t.number] = found
        outcome = found.outcome if found is not None else None
        if outcome == Outcome.TIE:
            tied.append(t.number)
        elif outcome == Outcome.LOSS or (outcome is None and t.number in beaten):
            lost.append(t.number)
        else:  # undecided, not compared, or better than the best after the fact
            undecided.append(t.number)
    return TieSet(best=best, interval=interval(best, stats.confidence), tied=tuple(tied),
                  undecided=tuple(undecided), beaten=tuple(lost), comparisons=comparisons,
                  statistics_gpu_s=spent, total_gpu_s=total)


def _turned(found: Comparison) -> Comparison:
    """A comparison of the best (as challenger) against ``t``, as ``t`` against the best."""
    flip = {Outcome.WIN: Outcome.LOSS, Outcome.LOSS: Outcome.WIN}
    outcome = flip.get(found.outcome, found.outcome) if found.outcome is not None else None

    def inv(x: float | None) -> float | None:
        return None if x is None else 1 / (1 + x) - 1

    return Comparison(outcome=outcome, diff=inv(found.diff) or 0.0, low=inv(found.high),
                      high=inv(found.low), pairs=found.pairs, sd=found.sd)


def host_effects(trials: Sequence[TrialRecord],
                 confidence: float = 0.95) -> dict[str, Interval]:
    """Each slot's effect on the objective, as a ratio minus one: for every configuration
    measured on more than one slot, the log ratio of each slot's mean to the configuration's
    mean over its slots, averaged per slot with its interval. A slot with no configuration
    measured elsewhere too has no estimate (left out)."""
    per_slot: dict[str, list[float]] = {}
    for t in trials:
        by_slot: dict[str, list[float]] = {}
        for r in measurements(t):
            if r.slot is not None and r.value is not None and r.value > 0:
                by_slot.setdefault(r.slot, []).append(math.log(r.value))
        if len(by_slot) < 2:
            continue
        means = {s: math.fsum(v) / len(v) for s, v in by_slot.items()}
        centre = math.fsum(means.values()) / len(means)
        for s, m in means.items():
            per_slot.setdefault(s, []).append(m - centre)
    out = {}
    for s, effects in per_slot.items():
        found = t_interval(effects, confidence)
        out[s] = Interval(mean=math.expm1(found.mean),
                          low=math.expm1(found.low) if found.low is not None else None,
                          high=math.expm1(found.high) if found.high is not None else None,
                          n=found.n, sd=found.sd, confidence=confidence)
    return out


#: Runs one more measurement of a trial's configuration: ``(trial, seed, pair, against)`` to
#: the :class:`Replicate` (a whole verified cycle). May raise what a trial raises
#: (``Interrupted``, ``HostQuarantined``).
Measure = Callable[[TrialRecord, int, int, int | None], Awaitable[Replicate]]
#: Reads a trial's latest record (another slot may have added to it) and saves one.
Load = Callable[[int], TrialRecord | None]
Save = Callable[[TrialRecord], TrialRecord]


@dataclass
class RaceResult:
    """How a race ended: the two records as saved, the comparison (``None`` without a race),
    and the exception that stopped it early (re-raised by the caller once the challenger's
    result is in)."""

    challenger: TrialRecord
    incumbent: TrialRecord | None
    comparison: Comparison | None = None
    stopped: BaseException | None = None


class Racer:
    """Races a challenger against the incumbent of a study (see the module doc)."""

    def __init__(self, spec: StudySpec, load: Load, save: Save, measure: Measure,
                 trials: Callable[[], list[TrialRecord]],
                 say: Callable[[str], None] = lambda _m: None) -> None:
        self.spec = spec
        self.load = load
        self.save = save
        self.measure = measure
        self.trials = trials
        self.say = say

    def _add(self, trial: TrialRecord, rep: Replicate) -> TrialRecord:
        latest = self.load(trial.number) or trial
        updated = latest.model_copy(update={"replicates": (*latest.replicates, rep)})
        return self.save(summarize(updated, self.spec.statistics.confidence))

    def first(self, trial: TrialRecord, seed: int) -> TrialRecord:
        """Record a trial's first measurement as replicate 0 (its own levels stay the
        trial's)."""
        if trial.replicates or trial.status != TrialStatus.FEASIBLE or trial.value is None:
            return trial
        rep = Replicate(index=0, seed=seed, status=trial.status, value=trial.value,
                        best_level=trial.best_level, run_id=trial.run_id, host=trial.host,
                        slot=trial.slot, gpu_s=trial.gpu_s, started_at=trial.started_at,
                        finished_at=trial.finished_at, capacity=trial.capacity)
        return self.save(summarize(trial.model_copy(update={"replicates": (rep,),
                                                            "first_value": trial.value}),
                                   self.spec.statistics.confidence))

    async def repeat(self, trial: TrialRecord) -> RaceResult:
        """``replicates: N``: measure the trial until it has ``N`` measurements, seeds
        ``seed + 1 ...``."""
        want = self.spec.statistics.fixed_count()
        seed0 = self.spec.seed
        trial = self.first(trial, seed0)
        index = len(trial.replicates)
        while trial.status == TrialStatus.FEASIBLE and index < want:
            try:
                rep = await self.measure(trial, seed0 + index, index, None)
            except BaseException as exc:  # the caller re-raises it
                return RaceResult(challenger=trial, incumbent=None, stopped=exc)
            trial = self._add(trial, rep.model_copy(update={"index": index}))
            index += 1
        return RaceResult(challenger=trial, incumbent=None)

    async def race(self, challenger: TrialRecord, slot: str | None,
                   against: int | None = None, max_pairs: int | None = None) -> RaceResult:
        """``replicates: auto``: race the challenger against the incumbent when its first
        measurement is within the noise (:func:`needs_race`); record the race on the
        challenger and the pairs' measurements on both. The incumbent is the study's best
        (:func:`tie_set`), or trial ``against`` when given (a guided study's incumbent, the
        configuration its step changed)."""
        spec = self.spec
        stats = spec.statistics
        seed0 = spec.seed
        challenger = self.first(challenger, seed0)
        if challenger.status != TrialStatus.FEASIBLE or challenger.value is None:
            why = decided_by_crash(challenger)
            if why is not None:
                self.say(why)
            return RaceResult(challenger=challenger, incumbent=None)
        others = [t for t in self.trials() if t.number != challenger.number]
        incumbent = tie_set(others, spec).best if against is None else next(
            (t for t in reversed(others) if t.number == against), None)
        if incumbent is None or incumbent.value is None:
            return RaceResult(challenger=challenger, incumbent=None)
        sd = pair_sd(others)
        first = challenger.first_value or challenger.value
        if slot is not None and not _has(incumbent, seed0, slot):
            # Hosts are blocks: a challenger is compared with the incumbent as measured on its
            # own slot. A slot that has not measured the incumbent measures it now (once per
            # incumbent and slot), so that a host effect is not taken for the flags'.
            self.say(f"trial {incumbent.number} (the incumbent) has no measurement on {slot}: "
                     "measuring it here")
            try:
                rep = await self.measure(incumbent, seed0, 0, challenger.number)
            except BaseException as exc:  # the caller re-raises it
                return RaceResult(challenger=challenger, incumbent=incumbent, stopped=exc)
            incumbent = self._add(incumbent, rep.model_copy(update={
                "index": len(incumbent.replicates)}))
        here, _ = _pairs(incumbent, challenger, slot)
        reference = here[0] if here else (incumbent.value or 0.0)
        if reference <= 0:
            return RaceResult(challenger=challenger, incumbent=incumbent)
        if not needs_race(first, reference, spec, sd):
            # Behind by more than the noise: a loss without a race, recorded as one pair.
            lead = first / reference - 1
            self.say(f"trial {challenger.number}: {lead * 100:+.1f} % against trial "
                     f"{incumbent.number}, beyond the noise "
                     f"({-math.expm1(-band(stats, sd)) * -100:.1f} %): "
                     "a loss without a race")
            race = Race(against=incumbent.number, outcome=Outcome.LOSS, diff=lead, pairs=1,
                        slot=slot)
            challenger = self.save(challenger.model_copy(update={
                "races": (*challenger.races, race)}))
            return RaceResult(challenger=challenger, incumbent=incumbent)
        pooled = pooled_noise(others)
        self.say(f"trial {challenger.number} is within the noise of trial {incumbent.number} "
                 f"({(first / reference - 1) * 100:+.1f} %): racing them on {slot}")
        found: Comparison | None = None
        stopped: BaseException | None = None
        screen = None if SCREEN_PAIR_COUNTS else seed0
        limit = max_pairs or stats.max_replicates
        seed = seed0
        tried = 0
        while stopped is None:
            a, _ = _pairs(incumbent, challenger, slot, skip=screen)
            found = compare(incumbent, challenger, spec, pooled, slot, max_pairs=limit,
                            skip=screen) if a else None
            if found is not None and found.outcome is not None:
                break
            if len(a) >= limit or tried >= 2 * limit:
                break
            # The next pair: the first seed that the two do not both have on this slot; each
            # member is measured unless it has that seed on this slot already.
            while _has(incumbent, seed, slot) and _has(challenger, seed, slot):
                seed += 1
            tried += 1
            for who in pair_order(len(a)):
                target = incumbent if who == "incumbent" else challenger
                other = challenger if who == "incumbent" else incumbent
                if _has(target, seed, slot):
                    continue
                try:
                    rep = await self.measure(target, seed, len(a), other.number)
                except BaseException as exc:  # the caller re-raises it
                    stopped = exc
                    break
                target = self._add(target, rep.model_copy(update={
                    "index": len(target.replicates)}))
                if who == "incumbent":
                    incumbent = target
                else:
                    challenger = target
                if rep.status != TrialStatus.FEASIBLE:
                    self.say(f"trial {target.number} was not feasible in its measurement "
                             f"with seed {seed}: {rep.cause}")
                    break
            seed += 1
        if found is None or found.outcome is None:
            a, _ = _pairs(incumbent, challenger, slot, skip=screen)
            found = compare(incumbent, challenger, spec, pooled, slot, max_pairs=limit,
                            skip=screen) if len(a) else None
            if found is not None:
                found = Comparison(outcome=Outcome.UNDECIDED, diff=found.diff, low=found.low,
                                   high=found.high, pairs=found.pairs, sd=found.sd)
        if found is not None:
            race = Race(against=incumbent.number, outcome=(found.outcome or Outcome.UNDECIDED),
                        diff=found.diff, low=found.low, high=found.high, pairs=found.pairs,
                        slot=slot)
            latest = self.load(challenger.number) or challenger
            challenger = self.save(latest.model_copy(update={"races": (*latest.races, race)}))
            self.say(f"trial {challenger.number} against trial {incumbent.number}: "
                     f"{race.outcome} after {found.pairs} pairs ({found.text()})")
        return RaceResult(challenger=challenger, incumbent=incumbent, comparison=found,
                          stopped=stopped)


__all__ = ["PRIOR_CV", "PRIOR_DF", "SPREAD_PRIOR_CV", "Measure", "RaceResult", "Racer",
           "TieSet", "band", "compare", "decided_by_crash", "grid_noise", "host_effects",
           "interval", "measurements", "needs_race", "noise_prior", "pair_order", "pair_sd",
           "pooled_noise", "summarize", "tie_set", "values"]
