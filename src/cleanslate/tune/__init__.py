"""Studies: ``cleanslate tune`` runs the whole cycle over a search space and resumes.

:mod:`~cleanslate.tune.study` (the study file), :mod:`~cleanslate.tune.factors` (a factor of
the space and its distribution), :mod:`~cleanslate.tune.space` (strategies as Optuna samplers),
:mod:`~cleanslate.tune.trial` (one verified cycle), :mod:`~cleanslate.tune.controller`
(ask/tell, budget, resume), :mod:`~cleanslate.tune.view` (what a study shows as it runs),
:mod:`~cleanslate.tune.estimate` (its launches and wall time before it runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.tune.controller import StudyOutcome, run_study, validate_study_flags
    from cleanslate.tune.estimate import StudyEstimate, estimate_study, launch_seconds
    from cleanslate.tune.factors import Range
    from cleanslate.tune.study import Objective, StudySpec, load_study
    from cleanslate.tune.trial import HostQuarantined, run_trial
    from cleanslate.tune.view import TuneView

# Optuna is a heavy import: the parts of this package load when they are used.
__getattr__, __dir__ = lazy_exports(__name__, {
    "StudyOutcome": "cleanslate.tune.controller",
    "run_study": "cleanslate.tune.controller",
    "validate_study_flags": "cleanslate.tune.controller",
    "StudyEstimate": "cleanslate.tune.estimate",
    "estimate_study": "cleanslate.tune.estimate",
    "launch_seconds": "cleanslate.tune.estimate",
    "Objective": "cleanslate.tune.study",
    "StudySpec": "cleanslate.tune.study",
    "load_study": "cleanslate.tune.study",
    "Range": "cleanslate.tune.factors",
    "HostQuarantined": "cleanslate.tune.trial",
    "run_trial": "cleanslate.tune.trial",
    "TuneView": "cleanslate.tune.view",
})

__all__ = [
    "HostQuarantined",
    "Objective",
    "Range",
    "StudyEstimate",
    "StudyOutcome",
    "StudySpec",
    "TuneView",
    "estimate_study",
    "launch_seconds",
    "load_study",
    "run_study",
    "run_trial",
    "validate_study_flags",
]
