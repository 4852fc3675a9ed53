"""Studies with replicates and races, built in code and saved to a real SQLite store: what the
racing code of ``tune`` records (``docs/statistics.md``), with values chosen so that each
outcome occurs (a tie, an undecided race, a single-shot trial, an infeasible one).

``race-a`` (``replicates: auto``, an ablation, baseline ``max-running-requests: 64``):

- #0, the baseline and incumbent, the best mean: 5 measurements, seeds 11-15;
- #1 (128): 5 measurements with #0's seeds, raced against #0: a tie;
- #2 (256): one measurement, far below: a loss without a race;
- #3 (32): 5 measurements with #0's seeds, raced against #0: undecided;
- #4 (512): infeasible (oom).

``race-b`` (``replicates: 3``): the same configurations again: 64 about 6 % faster on seeds
11-13, 128 the same speed on seeds 11-13, 256 three times, 32 on seeds 21-23 (none shared
with ``race-a``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cleanslate.bench import LevelResult
from cleanslate.stats import compare_paired
from cleanslate.store import Store, TrialRecord
from cleanslate.store._trials import LevelVerdict, Race, Replicate, StudyStatus, TrialStatus
from cleanslate.tune.race import summarize

DATA = Path(__file__).parent / "data" / "stores.json"

#: The first measurement of each configuration of race-a, then its replicates (same seeds).
A_VALUES: dict[int, list[float]] = {
    0: [1000.0, 1010.0, 990.0, 1005.0, 998.0],
    1: [1004.0, 1004.0, 992.0, 1000.0, 995.0],
    2: [900.0],
    3: [1020.0, 985.0, 1010.0, 960.0, 1005.0],
}
A_SEEDS = [11, 12, 13, 14, 15]
A_PARAMS = {0: 64, 1: 128, 2: 256, 3: 32, 4: 512}

B_VALUES: dict[int, list[float]] = {
    0: [1061.0, 1069.0, 1051.0],
    1: [1003.0, 1012.0, 992.0],
    2: [905.0, 912.0, 899.0],
    3: [1010.0, 990.0, 1004.0],
}
B_SEEDS: dict[int, list[int]] = {0: [11, 12, 13], 1: [11, 12, 13], 2: [11, 12, 13],
                                 3: [21, 22, 23]}

GPU_S = 100.0
TTFT = [40.0, 44.0, 38.0, 42.0, 41.0]


def _base_level() -> dict[str, Any]:
    data = json.loads(DATA.read_text())
    trial = data["studies"][0]["trials"][0]
    return dict(trial["levels"][1])


def levels(value: float, ttft: float) -> tuple[LevelResult, ...]:
    """Two levels, c=8 at half ``value`` and c=32 at ``value`` tokens/s, p99 TTFT ``ttft``."""
    base = _base_level()
    out = []
    for label, conc, share in (("c=8", 8, 0.5), ("c=32", 32, 1.0)):
        level = LevelResult.model_validate(base)
        level = LevelResult.model_validate({
            **level.model_dump(), "label": label, "output_throughput": value * share,
            "p99_ttft_ms": ttft * share})
        level = level.model_copy(update={"load": level.load.model_copy(
            update={"concurrency": conc})})
        out.append(level)
    return tuple(out)


def spec_of(name: str, statistics: dict[str, Any]) -> dict[str, Any]:
    data = json.loads(DATA.read_text())
    spec = dict(data["studies"][1]["study"]["spec"])
    spec.update({"name": name, "strategy": "ablation",
                 "space": {"max-running-requests": [64, 128, 256, 32, 512]},
                 "baseline": {"max-running-requests": 64}, "statistics": statistics})
    return spec


def trial(study: str, number: int, mrr: int, values: list[float], seeds: list[int],
          races: tuple[Race, ...] = (), *, slot: str = "local/gpus=0/port=30000",
          discarded: dict[int, str] | None = None) -> TrialRecord:
    """A feasible trial measured ``len(values)`` times (replicate 0 its own first cycle)."""
    reps = []
    for i, (value, seed) in enumerate(zip(values, seeds, strict=True)):
        reps.append(Replicate(
            index=i, seed=seed, status=TrialStatus.FEASIBLE, value=value, best_level="c=32",
            levels=() if i == 0 else levels(value, TTFT[i % len(TTFT)]),
            level_verdicts={"c=8": LevelVerdict.OK, "c=32": LevelVerdict.OK}, slot=slot,
            pair=i if races and len(values) > 1 else None,
            against=races[0].against if races and i else None,
            discarded=(discarded or {}).get(i), gpu_s=GPU_S))
    record = TrialRecord(
        study=study, number=number, params={"max-running-requests": mrr},
        status=TrialStatus.FEASIBLE, value=values[0], best_level="c=32",
        levels=levels(values[0], TTFT[0]),
        level_verdicts={"c=8": LevelVerdict.OK, "c=32": LevelVerdict.OK},
        replicates=tuple(reps) if len(values) > 1 else (), races=races, gpu_s=GPU_S,
        slot=slot, argv=("sim-server", "--max-running-requests", str(mrr)),
        finished_at=1.0)
    return summarize(record, 0.95) if len(values) > 1 else record


def race(against: int, base: list[float], other: list[float], expect: str) -> Race:
    """The race ``other`` ran against ``base`` as the racing code records it
    (:func:`cleanslate.stats.compare_paired`, the study's tie margin 0.03, 5 pairs at most);
    ``expect`` is the outcome the values were chosen for."""
    found = compare_paired(base, other, tie_margin=0.03, confidence=0.95, max_pairs=5)
    assert found.outcome is not None and found.outcome.value == expect, found
    return Race(against=against, outcome=found.outcome.value, diff=found.diff, low=found.low,
                high=found.high, pairs=found.pairs, slot="local/gpus=0/port=30000")


def race_a() -> list[TrialRecord]:
    a = A_VALUES
    return [
        trial("race-a", 0, A_PARAMS[0], a[0], A_SEEDS),
        trial("race-a", 1, A_PARAMS[1], a[1], A_SEEDS, (race(0, a[0], a[1], "tie"),)),
        trial("race-a", 2, A_PARAMS[2], a[2], A_SEEDS[:1],
              (Race(against=0, outcome="loss", diff=a[2][0] / a[0][0] - 1, pairs=1),)),
        trial("race-a", 3, A_PARAMS[3], a[3], A_SEEDS, (race(0, a[0], a[3], "undecided"),)),
        TrialRecord(study="race-a", number=4, params={"max-running-requests": 512},
                    status=TrialStatus.INFEASIBLE, cause="oom", gpu_s=GPU_S / 4,
                    finished_at=1.0),
    ]


def race_b() -> list[TrialRecord]:
    return [trial("race-b", n, A_PARAMS[n], B_VALUES[n], B_SEEDS[n]) for n in B_VALUES]


def save(url: str) -> None:
    """Write ``race-a`` and ``race-b`` into the store at ``url``."""
    store = Store(url)
    try:
        for name, stats, trials in (("race-a", {"replicates": "auto", "tie_margin": 0.03},
                                     race_a()),
                                    ("race-b", {"replicates": 3, "tie_margin": 0.03},
                                     race_b())):
            store.save_study(name, spec_of(name, stats), StudyStatus.FINISHED)
            for record in trials:
                store.save_trial(record)
    finally:
        store.close()
