"""A racing study on the sim engine, end to end: the sim draws a new restart factor for every
start (sigma 2.4 %, as measured between restarts on an H200, plus a slow drift), so the race
measures real noise on real servers. Three configurations: the baseline, one that differs in a
flag that cannot change the sim's speed (``mem-fraction-static`` 0.88 -> 0.92), and one 6 %
faster (every step 6 % shorter: ``time-scale``). The identical one must never be declared
different, the faster one never slower; tests/tune/test_race.py shows, on 30 seeded worlds,
how often each race ends tied, won or undecided."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests._kit import free_port
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

STUDY = """\
name: race-sim
engine: sim
model: sim
port: {port}
gpus: [0]
fixed: {{tp-size: 1}}
baseline: {{mem-fraction-static: 0.88, time-scale: 0.2}}
space:
  mem-fraction-static: [0.88, 0.92]
  time-scale: [0.2, 0.1886]
strategy: ablation
workload: {{kind: random, input_len: 256, output_len: 32}}
concurrency: [16]
duration_s_per_level: 2
statistics: {{replicates: auto, tie_margin: 0.05, max_replicates: 5}}
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
"""


def test_a_racing_study_on_the_sim(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    study = tmp_path / "study.yaml"
    study.write_text(STUDY.format(port=free_port()))
    db = tmp_path / "s.db"
    done = run_cli("tune", str(study), "--store", f"sqlite:///{db}", "--json",
                   env={"CLEANSLATE_SIM_GPU_DIR": str(gpus)}, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    stats = done.json()["statistics"]
    with sqlite3.connect(db) as conn:
        trials = {json.loads(r[0])["number"]: json.loads(r[0])
                  for r in conn.execute("select data from cs_trials order by id")}
    by_params = {(t["params"]["mem-fraction-static"], t["params"]["time-scale"]): t
                 for t in trials.values()}
    same = by_params[(0.92, 0.2)]
    faster = by_params[(0.88, 0.1886)]
    base = by_params[(0.88, 0.2)]
    assert same["races"] and faster["races"], (same["races"], faster["races"])
    assert same["races"][-1]["outcome"] in ("tie", "undecided"), same["races"]
    assert faster["races"][-1]["outcome"] in ("win", "undecided"), faster["races"]
    # Every measurement of a race is a new server: distinct run ids, the pair's seeds shared.
    runs = [r["run_id"] for t in (base, same, faster) for r in t["replicates"]]
    assert len(runs) == len(set(runs)) and None not in runs
    # The identical configuration races the baseline; when that race ends undecided with it
    # ahead, it is the incumbent the faster one races, and measures that race's seeds too.
    seeds = {k: {r["seed"] for r in t["replicates"]}
             for k, t in (("base", base), ("same", same), ("faster", faster))}
    assert seeds["same"] <= seeds["base"] | seeds["faster"], seeds
    against = trials[faster["races"][-1]["against"]]  # the last race: nobody raced it after
    assert seeds["faster"] <= {r["seed"] for r in against["replicates"]}, seeds
    # The document says what the store says.
    assert stats["best"] in trials and stats["n_replicates"] >= 1
    assert stats["statistics_gpu_s"] > 0
    assert same["races"][-1]["against"] in trials and faster["races"][-1]["against"] in trials
    print("races:", {k: v["races"][-1]["outcome"] + f" after {v['races'][-1]['pairs']} pairs"
                     for k, v in (("same", same), ("faster", faster))},
          "best", stats["best"], "tied", stats["tied_with"], "undecided", stats["undecided"])
