"""``cleanslate tune`` with ``engine: command``: a study's ``argv:`` template is launched for each
trial (the simulated engine started by its own command line), each trial verified clean."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._kit import free_port
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_two_trials_through_the_command_engine(tmp_path: Path) -> None:
    study = {
        "name": "command-engine", "engine": "command", "model": "sim", "port": free_port(),
        "argv": [sys.executable, "-m", "cleanslate.sim", "serve", "--port", "{port}",
                 "--model-path", "{model}"],
        "fixed": {"time-scale": 0.25}, "space": {"tp-size": [1, 2]}, "strategy": "grid",
        "workload": {"kind": "random", "input_len": 64, "output_len": 16},
        "concurrency": [2], "requests_per_level": 8, "ready_timeout_s": 60,
        "smoke_timeout_s": 10, "grace_s": 5, "verify_deadline_s": 20,
    }
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(study, indent=1))
    (tmp_path / "gpus").mkdir()
    db = tmp_path / "s.db"
    result = run_cli("tune", str(path), "--store", f"sqlite:///{db}",
                     env={"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    with sqlite3.connect(db) as conn:
        trials: list[dict[str, Any]] = [
            json.loads(r[0]) for r in conn.execute("select data from cs_trials order by id")]
    assert sorted(t["params"]["tp-size"] for t in trials) == [1, 2]
    for trial in trials:
        assert trial["status"] == "feasible", trial
        assert trial["argv"][:3] == [sys.executable, "-m", "cleanslate.sim"]
        assert trial["verdict_before"] == "clean" and trial["verdict_after"] == "clean"
