"""A study's name is its identity in the store, a folder of the artifacts, the Slurm job's name
and every worker's ``--study``: letters, digits, ``.``, ``_``, ``-``, 1-100 characters, refused
otherwise when the file is loaded (exit 2 at file:line); a store that already holds a study of
a bad name (written before the rule) is reported and refused without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cleanslate.errors import InputError
from cleanslate.store import Store, StudyStatus
from cleanslate.tune.study import load_study
from tests.cli.inproc import run_main

STUDY = """\
engine: sim
model: sim
gpus: [0]
fixed: {tp-size: 1}
space:
  fault: [null, nan]
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
concurrency: [2]
requests_per_level: 4
name: NAME
"""

BAD = [
    ('"x\\ntouch /tmp/injected"', "'\\n'"),
    ('"x\\r#SBATCH --gres=gpu:8"', "'\\r'"),
    ("../../outside", "'/'"),
    ("a b", "' '"),
    ("'$(id)'", "'$'"),
    ("-x", "starts with '-'"),
    ("..", "starts with '.'"),
    ('""', "empty"),
    ("n" * 101, "101 characters"),
    ("café", "'é'"),
]


def _file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.replace("NAME", name))
    return path


@pytest.mark.parametrize(("name", "needle"), BAD)
def test_a_bad_name_is_refused_at_its_line(tmp_path: Path, name: str, needle: str) -> None:
    path = _file(tmp_path, name)
    with pytest.raises(InputError) as info:
        load_study(path)
    assert info.value.where == f"{path}:11" and needle in info.value.message


@pytest.mark.parametrize("name", ["glm5-nvfp4", "a", "v1.2_b-3", "n" * 100, "0a"])
def test_good_names_load(tmp_path: Path, name: str) -> None:
    assert load_study(_file(tmp_path, name))[0].name == name


@pytest.mark.parametrize("command", [("tune", "--check"), ("slurm", "submit", "--workers", "2",
                                                           "--dry-run")])
def test_tune_check_and_slurm_dry_run_refuse_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch,
                                                command: tuple[str, ...]) -> None:
    path = _file(tmp_path, '"x\\necho injected"')
    monkeypatch.chdir(tmp_path)
    res = run_main(capsys, monkeypatch, *command[:1], *(command[1:2] if command[0] == "slurm"
                                                       else ()), str(path),
                   *(command[2:] if command[0] == "slurm" else command[1:]))
    assert res.code == 2, res.out + res.err
    assert f"{path}:11" in res.err and "study's name" in res.err
    assert "#SBATCH" not in res.out and "Traceback" not in res.err
    assert not (tmp_path / "cleanslate.db").exists() and not (tmp_path / "artifacts").exists()


def test_a_stored_study_of_a_bad_name_is_refused_sanely(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # As an older cleanslate (or another writer) left it: the name is not one the loader takes.
    bad = "old\nname/../x"
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    spec = {"name": bad, "engine": "sim", "model": "sim", "space": {"fault": [None]},
            "strategy": "grid", "concurrency": [2], "requests_per_level": 4}
    store = Store(url)
    try:
        store.save_study(bad, spec, StudyStatus.RUNNING)
    finally:
        store.close()
    worker = run_main(capsys, monkeypatch, "worker", "--study", bad, "--store", url)
    assert worker.code == 2 and "Traceback" not in worker.err
    assert "not valid" in worker.err and "study's name" in worker.err
    report = run_main(capsys, monkeypatch, "report", bad, "--store", url, "--format", "json")
    assert report.code == 0, report.err
    assert [s["study"] for s in json.loads(report.out)["studies"]] == [bad]
    table = run_main(capsys, monkeypatch, "report", bad, "--store", url)
    assert table.code == 0 and "Traceback" not in table.err
