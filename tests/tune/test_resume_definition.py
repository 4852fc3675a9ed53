"""Rerunning a study resumes it when its definition is the same: compared as the store keeps it
(redacted: an env secret is never stored) and tolerant of keys added to the schema since."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cleanslate.store import Store
from cleanslate.tune.controller import same_definition
from cleanslate.tune.study import StudySpec


def _spec(**changes: Any) -> StudySpec:
    data: dict[str, Any] = {
        "name": "r", "engine": "sim", "model": "sim", "space": {"fault": [None, "nan"]},
        "concurrency": [1, 4], "env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwx", "X": "1"}}
    data.update(changes)
    return StudySpec.model_validate(data)


def test_a_study_with_a_secret_in_env_resumes(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    spec = _spec()
    store.save_study(spec.name, spec.model_dump(mode="json"), "running")
    stored = store.study(spec.name)
    assert stored is not None
    assert "hf_abcdefghijklmnopqrstuvwx" not in str(stored.spec)  # never kept
    assert same_definition(store, stored.spec, spec)
    assert same_definition(store, stored.spec, _spec(budget={"trials": 3}))
    assert not same_definition(store, stored.spec, _spec(concurrency=[1, 8]))
    assert not same_definition(store, stored.spec, _spec(env={"X": "2"}))


def test_keys_added_to_the_schema_later_compare_at_their_default(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    spec = _spec()
    older = spec.model_dump(mode="json")
    for key in ("argv", "warmup", "retries"):  # as if stored by a version without them
        older.pop(key, None)
    assert same_definition(store, older, spec)
    assert not same_definition(store, older, _spec(retries=5))
