"""What a replicate runs: the ladder up to the highest level that could be the configuration's
best (within 10 % of its first measurement's best, and meeting the SLOs there), so that a
replicate is the same procedure as the first measurement (a replicate locked to the first
measurement's best level compared c=128 with another configuration's c=256 in a quick-start run,
-6 %; one that ran its best level alone after a warm-up ran below the first measurement in 4 of
4 cases on an H200)."""

from __future__ import annotations

from cleanslate.bench import LevelResult
from cleanslate.store._trials import LevelVerdict, TrialRecord, TrialStatus
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import replicate_levels
from tests.store.documents import level


def _trial(values: dict[str, float], verdicts: dict[str, LevelVerdict], best: str,
           ) -> TrialRecord:
    levels = tuple(LevelResult.model_validate(level(label, output_throughput=v))
                   for label, v in values.items())
    return TrialRecord(study="s", number=0, params={}, status=TrialStatus.FEASIBLE,
                       value=values[best], best_level=best, levels=levels,
                       level_verdicts=verdicts)


def _spec(objective: dict[str, str]) -> StudySpec:
    return StudySpec.model_validate({"name": "s", "engine": "sim", "model": "m",
                                     "concurrency": [32, 128, 256], "space": {"x": [1, 2]},
                                     "objective": objective})


def test_the_levels_near_the_best_that_met_the_slos() -> None:
    ok = LevelVerdict.OK
    spec = _spec({"maximize": "output_throughput"})
    trial = _trial({"c=32": 3462.0, "c=128": 6571.0, "c=256": 6531.0},
                   {"c=32": ok, "c=128": ok, "c=256": ok}, "c=128")
    assert replicate_levels(trial, spec) == ("c=32", "c=128", "c=256")
    missed = _trial({"c=32": 3462.0, "c=128": 6571.0, "c=256": 6531.0},
                    {"c=32": ok, "c=128": ok, "c=256": LevelVerdict.SLO_MISS}, "c=128")
    assert replicate_levels(missed, spec) == ("c=32", "c=128")
    far = _trial({"c=32": 3462.0, "c=128": 6571.0, "c=256": 5000.0},
                 {"c=32": ok, "c=128": ok, "c=256": ok}, "c=128")
    assert replicate_levels(far, spec) == ("c=32", "c=128")
    no_best = TrialRecord(study="s", number=0, params={}, status=TrialStatus.INFEASIBLE)
    assert replicate_levels(no_best, spec) is None
