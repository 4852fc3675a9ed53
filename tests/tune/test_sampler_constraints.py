"""The TPE sampler learns which configurations were infeasible from the trial itself
(``Trial.set_constraint``, Optuna 5), not from the deprecated ``constraints_func``."""

from __future__ import annotations

import warnings

import optuna
import pytest

from cleanslate.tune.space import CONSTRAINT_ATTR, make_sampler, mark_feasible
from cleanslate.tune.study import StudySpec

SPEC = {"name": "constraints", "engine": "sim", "model": "sim", "strategy": "tpe", "seed": 1,
        "space": {"mem-fraction-static": [0.85, 0.9], "max-running-requests": [64, 128]},
        "workload": {"kind": "random", "input_len": 16, "output_len": 16},
        "concurrency": [1], "duration_s_per_level": 1,
        "objective": {"maximize": "output_throughput"}}


def test_the_sampler_takes_no_deprecated_argument() -> None:
    spec = StudySpec.model_validate(SPEC)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        sampler = make_sampler(spec)
    assert isinstance(sampler, optuna.samplers.TPESampler)


@pytest.mark.parametrize("feasible", [True, False])
def test_a_trial_carries_its_own_constraint(feasible: bool) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler(StudySpec.model_validate(SPEC)))
    trial = study.ask()
    mark_feasible(trial, feasible)
    study.tell(trial, 100.0)
    frozen = study.trials[0]
    expected = 0.0 if feasible else 1.0
    assert frozen.user_attrs[CONSTRAINT_ATTR] == expected
    if hasattr(optuna.trial.Trial, "set_constraint"):
        assert frozen.constraints == {"feasible": expected}


def test_an_infeasible_trial_is_never_the_best_feasible_one() -> None:
    """Optuna's own view: the best trial among those whose constraints hold."""
    if not hasattr(optuna.trial.Trial, "set_constraint"):
        pytest.skip("Optuna < 5 has no per-trial constraints")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler(StudySpec.model_validate(SPEC)))
    for value, feasible in ((50.0, True), (900.0, False), (70.0, True)):
        trial = study.ask()
        mark_feasible(trial, feasible)
        study.tell(trial, value)
    feasible_best = max((t for t in study.trials if all(v <= 0 for v in t.constraints.values())),
                        key=lambda t: t.value or 0.0)
    assert feasible_best.value == 70.0
