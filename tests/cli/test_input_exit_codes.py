"""Bad options exit 2 naming the option, before any work: every ``--gpus`` (one parser,
``cli/_common.parse_gpus``) refuses negative, empty, repeated and absurd indices; ``tune
--check --register`` is refused (the first leaves the store alone, the second writes it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.inproc import run_main

GPUS = [("-1", "GPU -1 is not an index"), ("0,,1", "item 2 of '0,,1' is empty"),
        ("0,", "item 2"), (",0", "item 1"), ("0,0", "GPU 0 is named twice"),
        ("1024", "GPU 1024 is not an index"),
        ("9" * 20, f"GPU {'9' * 20} is not an index"),
        ("x", "'x' is not an integer")]

COMMANDS = {
    "check": ("check", "--gpu-backend", "none"),
    "doctor": ("doctor",),
    "serve": ("serve", "--engine", "sim", "--model", "sim"),
    "worker": ("worker", "--study", "s"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("value", "needle"), GPUS)
@pytest.mark.parametrize("spelling", ["separate", "equals"])
def test_every_gpus_option_refuses_bad_indices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: str, value: str, needle: str, spelling: str) -> None:
    monkeypatch.chdir(tmp_path)  # nothing is created here
    gpus = ("--gpus", value) if spelling == "separate" else (f"--gpus={value}",)
    res = run_main(capsys, monkeypatch, *COMMANDS[command], *gpus)
    assert res.code == 2, (res.out, res.err)
    assert f"--gpus: {needle}" in res.err, res.err
    assert "Traceback" not in res.err
    assert list(tmp_path.iterdir()) == []


def test_good_gpus_still_parse() -> None:
    from cleanslate.cli._common import parse_gpus

    assert parse_gpus("0, 1,3") == [0, 1, 3]
    assert parse_gpus(None) is None and parse_gpus(" ") is None


def test_concurrency_with_an_empty_item_is_refused(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_main(capsys, monkeypatch, "bench", "--url", "http://127.0.0.1:1", "--model", "m",
                   "--concurrency", "1,,16")
    assert res.code == 2 and "--concurrency: item 2 of '1,,16' is empty" in res.err, res.err


def test_tune_check_and_register_together_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nengine: sim\nmodel: sim\nspace: {fault: [null]}\n"
                     "strategy: grid\nconcurrency: [1]\nrequests_per_level: 1\n")
    db = tmp_path / "s.db"
    res = run_main(capsys, monkeypatch, "tune", str(study), "--check", "--register",
                   "--store", f"sqlite:///{db}")
    assert res.code == 2, (res.out, res.err)
    assert "--register: --check and --register cannot be given together" in res.err
    assert not db.exists() and "Traceback" not in res.err


@pytest.mark.parametrize("command", ["tune", "slurm"])
def test_an_unknown_gpu_backend_is_refused_before_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: str) -> None:
    # slurm submit wrote it into the script (quoted, but every task then failed); tune found
    # it only at the first check, after the study was recorded.
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nengine: sim\nmodel: sim\nspace: {fault: [null]}\n"
                     "strategy: grid\nconcurrency: [1]\nrequests_per_level: 1\n")
    db = tmp_path / "s.db"
    args = (["slurm", "submit", str(study), "--workers", "1", "--dry-run"] if command == "slurm"
            else ["tune", str(study)])
    res = run_main(capsys, monkeypatch, *args, "--gpu-backend", "x\ny", "--store",
                   f"sqlite:///{db}")
    assert res.code == 2, (res.out, res.err)
    assert "--gpu-backend: unknown GPU backend 'x\\ny'" in res.err
    assert not db.exists() and "#SBATCH" not in res.out
