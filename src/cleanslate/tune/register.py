"""Recording a study in the store without running it, for workers started elsewhere
(``cleanslate tune --register``, ``cleanslate slurm submit``, a Kubernetes Job)."""

from __future__ import annotations

from cleanslate.errors import InputError
from cleanslate.store import Store, StudyStatus
from cleanslate.tune.controller import open_optuna, same_definition
from cleanslate.tune.study import StudySpec


def register_study(store: Store, spec: StudySpec) -> bool:
    """Record the study as ``tune`` does before its first trial, so that workers find it;
    ``True`` when it is new. The same name with another definition is an :class:`InputError`
    (nothing is written)."""
    existing = store.study(spec.name)
    if existing is not None and existing.spec and not same_definition(
            store, existing.spec, spec):
        raise InputError(
            f"a study named {spec.name!r} with a different definition is already in "
            f"{store.display_url}", where="name",
            hint="give the study a new name, or restore the file")
    if existing is None:
        store.save_study(spec.name, spec.model_dump(mode="json"), StudyStatus.RUNNING)
    open_optuna(store, spec)
    return existing is None


__all__ = ["register_study"]
