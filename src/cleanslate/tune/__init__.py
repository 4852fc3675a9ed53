"""Studies: ``cleanslate tune`` runs the whole cycle over a search space and resumes.

:mod:`~cleanslate.tune.study` (the study file), :mod:`~cleanslate.tune.space` (strategies as
Optuna samplers), :mod:`~cleanslate.tune.trial` (one verified cycle),
:mod:`~cleanslate.tune.controller` (ask/tell, budget, resume).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cleanslate.tune.controller import StudyOutcome, run_study, validate_study_flags
    from cleanslate.tune.study import StudySpec, load_study
    from cleanslate.tune.trial import HostQuarantined, run_trial
    from cleanslate.tune.view import TuneView

_WHERE = {
    "StudyOutcome": "controller", "TuneView": "view", "run_study": "controller",
    "validate_study_flags": "controller", "StudySpec": "study", "load_study": "study",
    "HostQuarantined": "trial", "run_trial": "trial",
}


def __getattr__(name: str) -> Any:
    # Optuna is a heavy import: load the parts of this package when they are used.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"cleanslate.tune.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cleanslate.tune' has no attribute {name!r}")


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
