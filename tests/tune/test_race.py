"""The race of a challenger against the incumbent (cleanslate.tune.race), driven with
measurements drawn from a known distribution: log-normal restart noise of 2 % (as measured
between restarts on an H200, docs/statistics.md), so that what the race decides can be checked
against the truth. The race's code is the product's; only ``measure`` is a stand-in for a
verified cycle (tests/tune/test_race_sim.py runs the same race on the sim engine)."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path
from typing import Any

import pytest

from cleanslate.stats import Outcome, compare_paired
from cleanslate.store._trials import Race, Replicate, TrialRecord, TrialStatus
from cleanslate.tune.race import (
    PRIOR_CV,
    Racer,
    band,
    host_effects,
    needs_race,
    noise_prior,
    pair_order,
    tie_set,
)
from cleanslate.tune.study import StudySpec

SLOT = "local/gpus=0/port=30000"


def _spec(**statistics: Any) -> StudySpec:
    return StudySpec.model_validate({
        "name": "race", "engine": "sim", "model": "m", "concurrency": [8],
        "space": {"x": [1, 2, 3]}, "strategy": "grid",
        "statistics": {"replicates": "auto", **statistics}})


class World:
    """An in-memory store of trial records and a noisy engine: configuration ``x`` has the
    true value ``truth[x]``, each measurement that times ``exp(N(0, sigma))``."""

    def __init__(self, truth: dict[int, float], sigma: float = 0.02, seed: int = 0) -> None:
        self.truth = truth
        self.sigma = sigma
        self.rng = random.Random(seed)
        self.rows: dict[int, TrialRecord] = {}
        self.cycles = 0

    def load(self, number: int) -> TrialRecord | None:
        return self.rows.get(number)

    def save(self, trial: TrialRecord) -> TrialRecord:
        self.rows[trial.number] = trial
        return trial

    def draw(self, x: int) -> float:
        self.cycles += 1
        return self.truth[x] * math.exp(self.rng.gauss(0.0, self.sigma))

    async def measure(self, trial: TrialRecord, seed: int, pair: int,
                      against: int | None) -> Replicate:
        return Replicate(index=0, seed=seed, status=TrialStatus.FEASIBLE,
                         value=self.draw(trial.params["x"]), slot=SLOT, pair=pair,
                         against=against, gpu_s=1.0)

    def first(self, number: int, x: int) -> TrialRecord:
        value = self.draw(x)
        return self.save(TrialRecord(study="race", number=number, params={"x": x},
                                     status=TrialStatus.FEASIBLE, value=value, slot=SLOT,
                                     best_level="c=8", gpu_s=1.0))


def _run(world: World, spec: StudySpec, number: int, x: int) -> TrialRecord:
    racer = Racer(spec, load=world.load, save=world.save, measure=world.measure,
                  trials=lambda: list(world.rows.values()))
    result = asyncio.run(racer.race(world.first(number, x), SLOT))
    assert result.stopped is None
    return result.challenger


def test_identical_configurations_tie_and_one_6_percent_faster_wins() -> None:
    """Must show (issue 24): 2 % restart noise, a tie margin of 5 %: a configuration of the
    incumbent's speed is declared tied, one 6 % faster the winner, and the best afterwards is
    the faster one with the other two tied or beaten. Over 40 seeded worlds, every race ends in
    a decision that is not wrong, and the replicates it took are counted."""
    spec = _spec(tie_margin=0.05, max_replicates=8)
    false_difference = faster_lost = 0
    tie_pairs: list[int] = []
    win_pairs: list[int] = []
    for seed in range(30):
        world = World({1: 1000.0, 2: 1000.0, 3: 1060.0}, seed=seed)
        _run(world, spec, 0, 1)
        same = _run(world, spec, 1, 2)
        faster = _run(world, spec, 2, 3)
        assert same.races and faster.races
        if same.races[-1].outcome in (Outcome.WIN, Outcome.LOSS):
            false_difference += 1
        if faster.races[-1].outcome == Outcome.LOSS:
            faster_lost += 1
        if same.races[-1].outcome == Outcome.TIE:
            tie_pairs.append(same.races[-1].pairs)
        if faster.races[-1].outcome == Outcome.WIN:
            win_pairs.append(faster.races[-1].pairs)
    # Seen with these seeds: no false difference in 30; 16 ties (median 5 pairs, 4-6) and 29
    # wins (median 4 pairs, 2-7); the rest undecided (after 8 pairs, or earlier when the
    # pairs left could not decide: stats.compare_paired's futility stop). The faster one is
    # never called slower. (Before the spread's prior, tune.race.noise_prior: 1 false
    # difference, 18 ties in 2-7 pairs, 27 wins.)
    assert faster_lost == 0
    assert false_difference <= 2
    assert len(tie_pairs) >= 14 and len(win_pairs) >= 25, (tie_pairs, win_pairs)
    assert sorted(win_pairs)[len(win_pairs) // 2] <= 5
    assert sorted(tie_pairs)[len(tie_pairs) // 2] <= 6


def test_one_seeded_world_in_detail() -> None:
    """One world, followed race by race: the tie and the win, the pairs each took, the
    interleaved order and the seeds shared by the two members of each pair."""
    spec = _spec(tie_margin=0.05, max_replicates=8)
    world = World({1: 1000.0, 2: 1000.0, 3: 1060.0}, seed=4)
    base = _run(world, spec, 0, 1)
    same = _run(world, spec, 1, 2)
    race = same.races[-1]
    assert race.against == 0 and race.outcome == Outcome.TIE
    assert race.low is not None and race.high is not None
    # A tie is decided at twice each look's error (two one-sided tests); the interval shown is
    # the two-sided one, which may reach a little past the margin.
    assert -0.06 < race.low < 0 < race.high < 0.06
    base = world.rows[0]
    assert [r.seed for r in same.replicates] == [r.seed for r in base.replicates]
    assert [r.pair for r in same.replicates[1:]] == list(range(1, race.pairs))
    faster = _run(world, spec, 2, 3)
    win = faster.races[-1]
    assert win.outcome == Outcome.WIN and win.low is not None and win.low > 0
    result = tie_set(list(world.rows.values()), spec)
    assert result.best is not None and result.best.number == 2
    # 2 raced the incumbent (the better mean of the tied 0 and 1) and beat it; the other of the
    # two was never raced against 2 and is compared with it after the fact, by the seeds they
    # share on the slot.
    other = 1 - win.against
    assert win.against in result.beaten
    assert other in result.comparisons and result.comparisons[other].pairs >= 2
    assert other in result.beaten + result.undecided + result.tied
    assert result.interval is not None and result.interval.n == faster.n_replicates
    # What the race computed is what stats computes from the recorded pairs.
    inc = {r.seed: r.value for r in world.rows[win.against].replicates}
    mine = {r.seed: r.value for r in faster.replicates}
    seeds = sorted(set(inc) & set(mine))
    assert len(seeds) == win.pairs
    again = compare_paired([inc[k] or 0 for k in seeds], [mine[k] or 0 for k in seeds],
                           tie_margin=0.05, max_pairs=8, pooled=None, prior=noise_prior())
    assert math.isclose(again.diff, win.diff, rel_tol=1e-9)


def test_a_challenger_far_behind_is_a_loss_without_a_race() -> None:
    spec = _spec()
    world = World({1: 1000.0, 2: 600.0})
    _run(world, spec, 0, 1)
    slow = _run(world, spec, 1, 2)
    assert len(slow.races) == 1 and slow.n_replicates == 1
    loss = slow.races[0]
    assert loss.outcome == Outcome.LOSS and loss.pairs == 1 and loss.low is None
    assert tie_set(list(world.rows.values()), spec).beaten == (1,)
    assert world.cycles == 2
    assert not needs_race(600.0, 1000.0, spec, PRIOR_CV * math.sqrt(2))
    assert needs_race(990.0, 1000.0, spec, PRIOR_CV * math.sqrt(2))
    assert band(spec.statistics, 0.0) == pytest.approx(math.log1p(0.03))


def test_the_order_alternates_and_a_minimizing_objective_is_honoured() -> None:
    assert [pair_order(i) for i in range(4)] == [
        ("incumbent", "challenger"), ("challenger", "incumbent"),
        ("incumbent", "challenger"), ("challenger", "incumbent")]
    spec = StudySpec.model_validate({
        "name": "race", "engine": "sim", "model": "m", "concurrency": [8],
        "space": {"x": [1, 2]}, "strategy": "grid", "objective": {"minimize": "p99_ttft_ms"},
        "statistics": {"replicates": "auto", "tie_margin": 0.05, "max_replicates": 8}})
    world = World({1: 1000.0, 2: 900.0}, seed=1)  # 2 is 10 % lower latency: better
    _run(world, spec, 0, 1)
    lower = _run(world, spec, 1, 2)
    assert lower.races[-1].outcome == Outcome.WIN
    best = tie_set(list(world.rows.values()), spec).best
    assert best is not None and best.number == 1


def test_undecided_when_the_pairs_run_out() -> None:
    """2 % apart with a 1 % tie margin and three pairs: neither a tie nor a difference can be
    shown; the race says undecided and the tie set lists it so."""
    spec = _spec(tie_margin=0.01, max_replicates=3)
    world = World({1: 1000.0, 2: 1020.0}, seed=5)
    _run(world, spec, 0, 1)
    other = _run(world, spec, 1, 2)
    assert other.races[-1].outcome == Outcome.UNDECIDED and other.races[-1].pairs <= 3
    result = tie_set(list(world.rows.values()), spec)
    assert result.best is not None
    loser = 1 if result.best.number == 0 else 0
    assert loser in result.undecided


def test_a_race_given_more_pairs_runs_past_max_replicates() -> None:
    """``max_pairs`` (a guided step raced again) lets a race go on past the study's
    ``max_replicates``: 6 % apart at 2 % noise with a 5 % tie margin, three pairs leave it
    undecided; five make it a win (the same draws)."""
    spec = _spec(tie_margin=0.05, max_replicates=3)
    short = World({1: 1000.0, 2: 1060.0}, seed=0)
    _run(short, spec, 0, 1)
    assert _run(short, spec, 1, 2).races[-1].outcome == Outcome.UNDECIDED
    world = World({1: 1000.0, 2: 1060.0}, seed=0)
    _run(world, spec, 0, 1)
    racer = Racer(spec, load=world.load, save=world.save, measure=world.measure,
                  trials=lambda: list(world.rows.values()))
    result = asyncio.run(racer.race(world.first(1, 2), SLOT, max_pairs=6))
    race = result.challenger.races[-1]
    assert (race.outcome, race.pairs) == (Outcome.WIN, 5), race


def test_fixed_replicates_compare_by_seed_at_the_end() -> None:
    spec = _spec(replicates=4, tie_margin=0.05)
    world = World({1: 1000.0, 2: 1000.0, 3: 1300.0}, seed=2)
    racer = Racer(spec, load=world.load, save=world.save, measure=world.measure,
                  trials=lambda: list(world.rows.values()))
    for number, x in ((0, 1), (1, 2), (2, 3)):
        done = asyncio.run(racer.repeat(world.first(number, x))).challenger
        assert done.n_replicates == 4 and [r.seed for r in done.replicates] == [0, 1, 2, 3]
        assert done.ci_low is not None and done.ci_high is not None
        assert done.ci_low < (done.value or 0) < done.ci_high
    result = tie_set(list(world.rows.values()), spec)
    assert result.best is not None and result.best.number == 2
    assert set(result.beaten) == {0, 1}
    assert result.statistics_gpu_s == 9.0  # three more measurements of each, 1 GPU-s each


def test_host_effects_are_estimated_from_configurations_measured_on_two_slots() -> None:
    def rep(value: float, slot: str, seed: int) -> Replicate:
        return Replicate(index=seed, seed=seed, status=TrialStatus.FEASIBLE, value=value,
                         slot=slot)

    trials = [TrialRecord(study="s", number=n, params={"x": n}, status=TrialStatus.FEASIBLE,
                          value=1.0, replicates=(rep(v, "a", 0), rep(v * 1.2, "b", 1)),
                          races=(Race(against=0, outcome="tie", diff=0.0),) if n else ())
              for n, v in ((0, 1000.0), (1, 1010.0), (2, 990.0))]
    effects = host_effects(trials)
    assert set(effects) == {"a", "b"}
    assert effects["b"].mean == pytest.approx(math.sqrt(1.2) - 1, rel=1e-6)
    assert effects["a"].mean == pytest.approx(1 / math.sqrt(1.2) - 1, rel=1e-6)


def test_study_files_validate_statistics(tmp_path: Path) -> None:
    from cleanslate.errors import InputError
    from cleanslate.tune.study import load_study

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nengine: sim\nmodel: m\nconcurrency: [8]\nspace: {x: [1, 2]}\n"
                    "statistics: {replicates: sometimes}\n")
    with pytest.raises(InputError) as err:
        load_study(path)
    assert ":6" in str(err.value.where)
    path.write_text("name: s\nengine: sim\nmodel: m\nconcurrency: [8]\nspace: {x: [1, 2]}\n"
                    "statistics: {tie_margin: 0.7}\n")
    with pytest.raises(InputError):
        load_study(path)


def test_hosts_are_blocks_a_slot_20_percent_faster_is_not_a_win() -> None:
    """Slot B runs everything 20 % faster than slot A. A challenger identical to the incumbent,
    first measured on B, is not a winner: B measures the incumbent first, the race is paired
    on B, and the host effect is estimated from the incumbent's two slots."""
    spec = _spec(tie_margin=0.05, max_replicates=8)
    world = World({1: 1000.0, 2: 1000.0}, seed=4)
    factor = {"A": 1.0, "B": 1.2}

    def on(slot: str) -> Racer:
        async def measure(trial: TrialRecord, seed: int, pair: int,
                          against: int | None) -> Replicate:
            return Replicate(index=0, seed=seed, status=TrialStatus.FEASIBLE, slot=slot,
                             value=world.draw(trial.params["x"]) * factor[slot], pair=pair,
                             against=against)
        return Racer(spec, load=world.load, save=world.save, measure=measure,
                     trials=lambda: list(world.rows.values()))

    first = world.first(0, 1).model_copy(update={"slot": "A"})
    world.save(first)
    asyncio.run(on("A").race(first, "A"))
    challenger = world.first(1, 2).model_copy(update={"slot": "B"})
    challenger = world.save(challenger.model_copy(update={
        "value": (challenger.value or 0) * 1.2}))
    result = asyncio.run(on("B").race(challenger, "B"))
    race = result.challenger.races[-1]
    assert race.slot == "B" and race.outcome in (Outcome.TIE, Outcome.UNDECIDED)
    assert abs(race.diff) < 0.05
    incumbent = world.rows[0]
    assert {r.slot for r in incumbent.replicates} == {"A", "B"}
    effects = host_effects(list(world.rows.values()))
    assert effects["B"].mean > 0.05 and effects["A"].mean < -0.05


def test_the_spreads_prior_decides_a_clear_lead_that_two_degrees_of_freedom_cannot() -> None:
    """The large space's seed 27 (``benchmarks/search_efficiency.py``): the first race of a
    study, +32, +16 and +34 % in three pairs. On its own two degrees of freedom (a t quantile
    of 6.2 at each look's error) it is not decided; with the H200's restart noise as two more
    degrees of freedom (``tune.race.noise_prior``) it is a win."""
    base, other = [1300.0, 1390.0, 1268.0], [1714.0, 1616.0, 1699.0]
    alone = compare_paired(base, other, tie_margin=0.05, max_pairs=5)
    assert alone.outcome is None and alone.low is not None and alone.low < 0, alone
    found = compare_paired(base, other, tie_margin=0.05, max_pairs=5, prior=noise_prior())
    assert found.outcome == Outcome.WIN and found.low is not None and found.low > 0.05, found
