"""A study row in the store is what every ``cleanslate worker`` launches (its engine, ``fixed``
and ``space`` become the argv): a worker logs the digest of the definition it read, the same
``sha256`` that ``tune --register`` prints, before it runs anything; a row changed by a store
writer shows another digest."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from sqlalchemy import update

import cleanslate.cli as cli_mod
from cleanslate.store import Store, StudyStatus
from cleanslate.store._store import study_digest
from cleanslate.store._tables import StudyRow
from cleanslate.tune import load_study
from cleanslate.tune.controller import load_stored_study  # noqa: F401  (imported once, here)

STUDY = """\
name: digest
engine: sim
model: sim
gpus: [0]
fixed: {tp-size: 1}
space: {max-running-requests: [16, 32]}
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
concurrency: [2]
"""
DIGEST = re.compile(r"definition (sha256:[0-9a-f]{64})")


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["cleanslate", *args])
    with pytest.raises(SystemExit) as info:
        cli_mod.main()
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out + out.err


def test_the_worker_logs_the_digest_of_the_study_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CLEANSLATE_ARTIFACTS", raising=False)
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    url = f"sqlite:///{tmp_path / 'cs.db'}"
    store = Store(url)  # the row `tune --register` writes (without its flag validation and
    spec = load_study(study)[0]  # Optuna's tables: 3 s on a loaded 2-core machine)
    store.save_study(spec.name, spec.model_dump(mode="json"), StudyStatus.RUNNING)
    record = store.study("digest")
    assert record is not None
    registered = study_digest(record.spec)
    # A worker whose --host does not resolve stops before it claims anything: it has said
    # what it would run by then.
    worker = ("worker", "--study", "digest", "--store", url, "--host", "nowhere.invalid")
    code, out = _main(monkeypatch, capsys, *worker)
    assert code == 2 and "--host" in out, out
    logged = DIGEST.search(out)
    assert logged is not None and logged.group(1) == registered, out
    with store.engine.begin() as conn:  # a store writer changes what every worker launches
        conn.execute(update(StudyRow).where(StudyRow.name == "digest").values(
            spec={**record.spec, "fixed": {"tp-size": 1, "port-offset": 7}}))
    store.close()
    code, out = _main(monkeypatch, capsys, *worker)
    changed = DIGEST.search(out)
    assert changed is not None and changed.group(1) != registered, out


def test_the_digest_is_of_canonical_json() -> None:
    assert study_digest({"b": 1, "a": [1, "é"]}) == study_digest({"a": [1, "é"], "b": 1})
    assert study_digest({"a": 1}) != study_digest({"a": 2})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", study_digest({}))


def test_a_worker_refuses_a_guided_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A guided study's path is one trial at a time in the process that runs it: a worker
    joining it is exit 2 before it claims anything, naming how to run it."""
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.replace("strategy: grid", "strategy: guided\n"
                                   "baseline: {max-running-requests: 16}"))
    url = f"sqlite:///{tmp_path / 'cs.db'}"
    store = Store(url)
    spec = load_study(study)[0]
    store.save_study(spec.name, spec.model_dump(mode="json"), StudyStatus.RUNNING)
    store.close()
    code, text = _main(monkeypatch, capsys, "worker", "--study", "digest", "--store", url)
    assert code == 2, text
    assert "is guided (strategy: guided)" in text and "cleanslate tune" in text
    assert store.__class__(url).trials("digest") == []
