"""Search strategies: the study's space as Optuna distributions and samplers.

- ``grid``: every combination of the factors' discrete values (ranges give ``points`` values).
- ``ablation``: the baseline, then one trial per other value of each factor, each differing
  from the baseline in exactly one flag (the seed's controlled experiment).
- ``tpe`` / ``random``: Optuna's samplers over lists (categorical) and ranges (int/float, log);
  the baseline, when given, is enqueued first. Infeasible trials are told to TPE as violating a
  constraint, so it learns where configurations fail.
- ``guided``: no plan; the next configuration is the notebook's (:mod:`cleanslate.tune.notebook`),
  and TPE is asked only for a verdict ``unknown`` or, with ``then: tpe``, for the flags not
  guided. Its space is categorical, as grid's (the relax rows move to the nearest listed value).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import optuna
from optuna.distributions import BaseDistribution

from cleanslate.tune.factors import SAMPLED_STRATEGIES, Scalar
from cleanslate.tune.factors import distribution as factor_distribution
from cleanslate.tune.study import StudySpec

#: User attribute holding a trial's constraint value (<= 0: feasible), read by TPE.
CONSTRAINT_ATTR = "constraint"


def distribution(spec: StudySpec, name: str) -> BaseDistribution:
    """The Optuna distribution of one factor: categorical for grid/ablation and for lists.
    Raises ``ValueError`` where Optuna refuses the range (checked when the study loads)."""
    return factor_distribution(spec.space[name], spec.factor_values(name),
                               sampled=spec.strategy in SAMPLED_STRATEGIES)


def distributions(spec: StudySpec) -> dict[str, BaseDistribution]:
    """Optuna distributions of the space (see :func:`distribution`)."""
    return {name: distribution(spec, name) for name in spec.space}


def ablation_configs(spec: StudySpec) -> list[dict[str, Scalar]]:
    """The baseline, then for each factor each non-baseline value with the rest at baseline."""
    base = {name: spec.baseline[name] for name in spec.space}
    configs = [dict(base)]
    for name in spec.space:
        for value in spec.factor_values(name):
            if value != base[name]:
                configs.append({**base, name: value})
    return configs


def grid_configs(spec: StudySpec) -> list[dict[str, Scalar]]:
    names = list(spec.space)
    combos = itertools.product(*(spec.factor_values(n) for n in names))
    configs = [dict(zip(names, combo, strict=True)) for combo in combos]
    if spec.baseline:
        base = {n: spec.baseline.get(n, configs[0][n]) for n in names}
        configs.remove(base) if base in configs else None
        configs.insert(0, base)
    return configs


def planned_configs(spec: StudySpec) -> list[dict[str, Scalar]] | None:
    """The fixed trial list of grid and ablation studies (``None`` for samplers)."""
    if spec.strategy == "ablation":
        return ablation_configs(spec)
    if spec.strategy == "grid":
        return grid_configs(spec)
    return None


def _constraints(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
    return (float(trial.user_attrs.get(CONSTRAINT_ATTR, 0.0)),)


#: Optuna 5 reads constraints that a trial sets on itself (``Trial.set_constraint``) and
#: deprecates the sampler's ``constraints_func``; Optuna 4 has only the latter.
_TRIAL_CONSTRAINTS = hasattr(optuna.trial.Trial, "set_constraint")


def mark_feasible(trial: optuna.trial.Trial, feasible: bool) -> None:
    """Tell the sampler whether the trial's configuration was feasible (before ``tell``): an
    infeasible one (did not start, crashed, missed the SLO) is ranked below every feasible one,
    whatever value it was given. Also kept as a user attribute, for the record."""
    value = 0.0 if feasible else 1.0
    trial.set_user_attr(CONSTRAINT_ATTR, value)
    if _TRIAL_CONSTRAINTS:
        trial.set_constraint("feasible", value)


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    """The study's sampler. TPE runs with ``constant_liar``: a trial still running (on another
    slot, in another worker) counts as a bad result, so parallel ``ask()`` calls do not all
    propose the same region (``docs/fleet.md``)."""
    if spec.strategy in ("tpe", "guided"):
        # guided asks the sampler only for a step whose verdict is unknown, and with
        # ``then: tpe`` for the flags no rule maps once the rules have no step left.
        return optuna.samplers.TPESampler(
            seed=spec.seed, constraints_func=None if _TRIAL_CONSTRAINTS else _constraints,
            n_startup_trials=min(10, max(3, len(spec.space) + 1)), constant_liar=True)
    # grid and ablation run an enqueued list; random is random.
    return optuna.samplers.RandomSampler(seed=spec.seed)


def trial_budget(spec: StudySpec) -> int:
    """How many trials the study runs: its plan's length, capped by ``budget.trials``."""
    planned = planned_configs(spec)
    cap = spec.budget.trials
    if planned is not None:
        return min(len(planned), cap) if cap else len(planned)
    return cap or 20
