"""What a study will cost before it runs: launches and wall time (``tune --check``).

A launch is one verified cycle on a new server (``docs/study.md``): each configuration's first
measurement, each replicate of ``statistics: {replicates: N}``, and each measurement a race
adds (``docs/statistics.md``). With ``replicates: auto`` the number depends on which
configurations come within the noise of the best, so it is a range: every configuration once
at least; at most, every configuration after the first raced against the incumbent for
``max_replicates`` pairs (the screening pair counts as the first, each further pair is two
launches). The typical figure is the cost ``benchmarks/selection.py`` measured for ``auto``
(100 seeds): 1.43x to 2.35x single-shot's GPU-seconds over its three surfaces.

The wall time of a launch is, when the store holds earlier launches of the study, their mean
(each trial's and replicate's ``started_at`` to ``finished_at``); otherwise it is bounded by
the study's own settings: at least its levels' durations (``duration_s_per_level`` times the
levels; nothing is known of a level of N requests before one has run), at most those plus
``ready_timeout_s``, ``smoke_timeout_s``, ``grace_s`` and ``verify_deadline_s``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cleanslate.models import FrozenStrict

if TYPE_CHECKING:  # Optuna (the space) loads when an estimate is made, not with the model
    from cleanslate.store import TrialRecord
    from cleanslate.tune.study import StudySpec

#: Launches of ``replicates: auto`` per configuration as ``benchmarks/selection.py`` measured
#: them (GPU-seconds against single-shot, 100 seeds: the 120-configuration space, the quick
#: start's ablation; ``docs/statistics.md``, "What it costs").
TYPICAL_RACE_COST = (1.43, 2.35)


class StudyEstimate(FrozenStrict):
    """``tune --check``'s estimate (``estimate`` in its JSON).

    ``configurations``: the trials the study plans (its budget for a sampler);
    ``launches_min``/``launches_max``: the fewest and most verified cycles, races included;
    ``launches_typical``: ``[low, high]`` with ``replicates: auto`` (see the module), else
    ``None``; ``launch_s``: seconds a launch took on average in the store (``None``: none
    measured), over ``measured_launches``; ``launch_s_low``/``launch_s_high``: the bounds a
    launch takes without measurements (``None`` where not known); ``wall_s_low`` and
    ``wall_s_high``: the study's wall time in seconds with one slot (``None``: not known)."""

    configurations: int
    launches_min: int
    launches_max: int
    launches_typical: tuple[int, int] | None
    measured_launches: int = 0
    launch_s: float | None = None
    launch_s_low: float | None = None
    launch_s_high: float | None = None
    wall_s_low: float | None = None
    wall_s_high: float | None = None


def launch_seconds(trials: Iterable[TrialRecord]) -> list[float]:
    """Seconds each launch of these trials took that gave a result, once per run: a trial's
    first measurement and each replicate (the first measurement is also replicate 0, the same
    run), from its start to its end. A trial refused by a host that was not clean launched
    nothing, and is left out."""
    from cleanslate.store import TrialStatus

    results = (TrialStatus.FEASIBLE, TrialStatus.INFEASIBLE)
    by_run: dict[str, float] = {}
    for trial in trials:
        if trial.status in results and trial.run_id and trial.finished_at is not None:
            by_run[trial.run_id] = trial.finished_at - trial.started_at
        for replicate in trial.replicates:
            if replicate.status in results and replicate.run_id and \
                    replicate.finished_at is not None:
                by_run.setdefault(replicate.run_id,
                                  replicate.finished_at - replicate.started_at)
    return [s for s in by_run.values() if s > 0]


def levels_seconds(spec: StudySpec) -> float | None:
    """Seconds a launch spends in its levels when the study fixes their duration, else
    ``None`` (levels of N requests, a replay, a capacity search)."""
    if spec.duration_s_per_level is None or spec.objective.capacity or spec.replay_loads():
        return None
    return spec.duration_s_per_level * len(spec.concurrency)


def estimate_study(spec: StudySpec, measured: list[float] | None = None) -> StudyEstimate:
    """The study's launches and wall time (see the module doc); ``measured``: the seconds of
    earlier launches of this study (:func:`launch_seconds`)."""
    from cleanslate.tune.space import trial_budget

    configs = trial_budget(spec)
    stats = spec.statistics
    if stats.racing:
        low, high = configs, configs + max(0, configs - 1) * 2 * (stats.max_replicates - 1)
        least, most = (min(high, max(low, math.ceil(configs * x))) for x in TYPICAL_RACE_COST)
        typical: tuple[int, int] | None = (least, most)
    else:
        low = high = configs * stats.fixed_count()
        typical = None
    if measured:
        mean = sum(measured) / len(measured)
        return StudyEstimate(configurations=configs, launches_min=low, launches_max=high,
                             launches_typical=typical, measured_launches=len(measured),
                             launch_s=round(mean, 1), wall_s_low=round(low * mean, 1),
                             wall_s_high=round(high * mean, 1))
    levels = levels_seconds(spec)
    short = levels
    long = None if levels is None else levels + spec.ready_timeout_s + (
        spec.smoke_timeout_s if spec.smoke else 0.0) + spec.grace_s + spec.verify_deadline_s
    return StudyEstimate(
        configurations=configs, launches_min=low, launches_max=high, launches_typical=typical,
        launch_s_low=short, launch_s_high=long,
        wall_s_low=None if short is None else round(low * short, 1),
        wall_s_high=None if long is None else round(high * long, 1))
