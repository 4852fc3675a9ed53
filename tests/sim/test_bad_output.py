"""Output is checked at every level, not only at smoke: a sim configuration that answers well at
c=4 and emits NaN garbage above 8 requests in flight (``--fault nan=8``) gets its c=64 level
marked ``bad_output`` with a sample, by ``bench`` and by ``tune`` (which keeps c=4)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests._kit import study_yaml
from tests.conftest import run_cli
from tests.sim._client import MODEL
from tests.sim.conftest import SimServers

pytestmark = pytest.mark.slow


def test_bench_marks_the_level_whose_output_breaks(sims: SimServers) -> None:
    server = sims.start("--tp-size", "1", "--time-scale", "0.25", "--fault", "nan=8")
    res = run_cli("bench", "--url", server.url, "--model", MODEL, "--concurrency", "4,64",
                  "--num-prompts", "64", "--workload", "random:input_len=64,output_len=16",
                  "--json", "-", "--no-live", timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    low, high = res.json()["levels"]
    assert low["bad_output"] is None and low["output_samples"] >= 4 and low["failed"] == 0
    assert high["bad_output"] == "nan" and high["output_issues"]["nan"] >= 1
    assert any("NaN" in e for e in high["output_evidence"])
    assert "bad output" in res.stderr


def test_tune_records_the_level_infeasible_and_keeps_the_one_below(tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml(
        name="nan-under-load", fixed={"tp-size": 1, "time-scale": 0.25, "fault": "nan=8"},
        space={"max-running-requests": [128]},
        workload={"kind": "random", "input_len": 64, "output_len": 16}, concurrency=[4, 64],
        requests_per_level=64))
    (tmp_path / "gpus").mkdir()
    db = tmp_path / "s.db"
    res = run_cli("tune", str(study), "--store", f"sqlite:///{db}",
                  env={"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    with sqlite3.connect(db) as conn:
        (data,) = conn.execute("select data from cs_trials").fetchone()
    trial = json.loads(data)
    assert trial["level_verdicts"] == {"c=4": "ok", "c=64": "bad_output"}
    assert trial["status"] == "feasible" and trial["best_level"] == "c=4"
    assert trial["cause"] == "bad_output" and "NaN" in trial["detail"]
