"""Studies: ``cleanslate tune`` runs the whole cycle over a search space and resumes.

:mod:`~cleanslate.tune.study` (the study file), :mod:`~cleanslate.tune.space` (strategies as
Optuna samplers), :mod:`~cleanslate.tune.trial` (one verified cycle),
:mod:`~cleanslate.tune.controller` (ask/tell, budget, resume).
"""

from __future__ import annotations

from cleanslate.tune.controller import StudyOutcome, TuneView, run_study, validate_study_flags
from cleanslate.tune.study import StudySpec, load_study
from cleanslate.tune.trial import HostQuarantined, run_trial

__all__ = [
    "HostQuarantined",
    "StudyOutcome",
    "StudySpec",
    "TuneView",
    "load_study",
    "run_study",
    "run_trial",
    "validate_study_flags",
]
