"""``cleanslate tune --register``: the study is validated and recorded for workers started
elsewhere, no trial runs; a worker then finds it. Bad input writes nothing."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

STUDY = """\
name: registered
engine: sim
model: sim
gpus: [0]
fixed: {tp-size: 1}
space: {max-running-requests: [16, 32]}
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
concurrency: [2]
"""


def test_register_records_the_study_and_runs_nothing(tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    store = f"sqlite:///{tmp_path}/cs.db"
    done = run_cli("tune", str(study), "--store", store, "--register")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded" in done.stdout
    again = run_cli("tune", str(study), "--store", store, "--register")
    assert again.returncode == 0 and "already" in again.stdout
    from cleanslate.store import Store

    reader = Store(store, create=False)
    try:
        record = reader.study("registered")
        assert record is not None and reader.trials("registered") == []
        assert reader.runs() == []
    finally:
        reader.close()
    study.write_text(STUDY.replace("[16, 32]", "[16, 64]"))  # another definition, same name
    changed = run_cli("tune", str(study), "--store", store, "--register")
    assert changed.returncode == 2 and "different definition" in changed.stderr
