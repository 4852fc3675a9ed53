"""A crash in a study is shown first and decides its configuration (issue 38 item 3): on the
sim, a configuration whose server crashes at the second level (``crash-at-concurrency``, the
sim's SGLang traceback) is recorded ``crashed at c=8 (python_exception)``, its first level's
value kept; it is not raced (one launch, the race log says why: before, a first level within
the noise of the incumbent's was raced, each more measurement a launch); the report's failures
list it and its throughput line stops at c=2."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cleanslate.report import load_report
from cleanslate.report._console import failure_lines
from cleanslate.report._plots import throughput_line
from cleanslate.store import Store
from tests._kit import study_yaml
from tests.conftest import run_cli

CRASH = "crash-at-concurrency=4"

STUDY = dict(name="crashes",
             fixed={"tp-size": 1, "time-scale": 0.25, "drift": 0, "cold-start": 1,
                    "cold-start-decode": 1, "noise-seed": 1},
             space={"fault": [None, CRASH]}, strategy="grid",
             workload={"kind": "random", "input_len": 32, "output_len": 8},
             concurrency=[2, 8], requests_per_level=16, warmup=0,
             objective={"minimize": "mean_tpot_ms"},
             observe={"interval_s": 0.1, "gpu_source": "off"},
             statistics={"replicates": "auto", "max_replicates": 3, "tie_margin": 0.05})


def _rows(db: Path, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(r[0]) for r in conn.execute(f"select data from {table} order by id")]


@pytest.mark.slow  # two verified sim trials: about 12 s on 2 cores
def test_a_crashed_configuration_is_decided_by_its_crash_not_raced(tmp_path: Path) -> None:
    study = tmp_path / "crashes.yaml"
    study.write_text(study_yaml(**STUDY))
    (tmp_path / "gpus").mkdir()
    db = tmp_path / "s.db"
    env = {"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus"), "COLUMNS": "250"}
    done = run_cli("tune", str(study), "--store", f"sqlite:///{db}", env=env, timeout=120)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    trials = {t["params"]["fault"]: t for t in _rows(db, "cs_trials")}
    crashed = trials[CRASH]
    assert (crashed["status"], crashed["cause"]) == ("infeasible", "python_exception")
    assert crashed["level_verdicts"] == {"c=2": "ok", "c=8": "crashed"}
    assert crashed["best_level"] == "c=2" and crashed["value"] > 0  # kept, below the crash
    assert not crashed["races"] and not crashed["replicates"]
    # one launch for the crashed configuration: its first, nothing more
    runs = [r for r in _rows(db, "cs_runs") if r.get("trial") == crashed["number"]]
    assert len(runs) == 1 and runs[0]["status"] == "crashed", runs
    said = "crashed at c=8 (python_exception)"
    assert f"trial {crashed['number']} {said}: decided by its crash, not raced" in out, out
    assert f"  {said}: c=8: AttributeError: 'PrefillMetadata'" in out  # its progress line
    table = out.split("2 trials (2 new)", 1)[1]
    assert said in table and "best configuration (trial 0)" in table, table

    store = Store(f"sqlite:///{db}")
    try:
        report = load_report(store, "crashes")
    finally:
        store.close()
    assert [t.number for t in report.failures] == [crashed["number"]]
    lines = failure_lines(report)
    assert lines[1].startswith(f"  #{crashed['number']} {said}: c=8: AttributeError:"), lines
    assert any("page_table_1_flattened" in line for line in lines[2:])
    trial = report.trial(crashed["number"])
    assert trial is not None
    line = throughput_line(trial)
    assert [p[0] for p in line.points] == [2.0] and line.crashes == [(8.0, line.points[0][1])]
    assert all(y > 0 for _, y, _ in line.points)
