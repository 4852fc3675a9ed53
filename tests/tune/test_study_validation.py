"""The whole study is validated before any launch: a bad workload, an objective that is not a
metric, sizes beyond the documented caps, flag values that make no argument and distributions
Optuna refuses all exit 2 at file:line, with no run recorded and no process started.
``tune --check`` validates and prints the plan without launching anything."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests._kit import free_port
from tests.conftest import run_cli

BASE = """\
name: v
engine: sim
model: sim
port: PORT
gpus: [0]
fixed: {tp-size: 1, time-scale: 0.25}
space:
  fault: [null, nan]
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
concurrency: [2]
requests_per_level: 4
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
"""


def _study(tmp_path: Path, text: str) -> tuple[Path, int]:
    port = free_port()
    path = tmp_path / "study.yaml"
    path.write_text(text.replace("PORT", str(port)))
    return path, port


def _replace(key: str, line: str) -> str:
    """BASE with the line of ``key`` replaced by ``line`` (or ``line`` added)."""
    lines: list[str] = []
    dropping = False
    for ln in BASE.splitlines():
        if ln.startswith(f"{key}:"):
            dropping = True
        elif dropping and ln.startswith(" "):
            continue
        else:
            dropping = False
            lines.append(ln)
    return "\n".join([*lines, line]) + "\n"


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _runs(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("select count(*) from cs_runs").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def test_an_invalid_workload_exits_2_before_any_launch(tmp_path: Path) -> None:
    path, port = _study(tmp_path, _replace("workload",
                                           "workload: {kind: random, input_len: -5}"))
    db = tmp_path / "s.db"
    t0 = time.monotonic()
    res = run_cli("tune", str(path), "--store", f"sqlite:///{db}",
                  env={"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{path}:{_line_of(path, 'workload:')}" in res.stderr
    assert "input_len" in res.stderr and "Traceback" not in res.stderr
    assert time.monotonic() - t0 < 30
    assert _runs(db) == 0 and not _listening(port)


@pytest.mark.parametrize(
    ("key", "line", "needle"),
    [
        ("objective", "objective: {maximize: throughput}", "not a metric"),
        ("objective", "objective: {minimize: label}", "not a metric"),
        ("concurrency", "concurrency: [100000000]", "concurrency"),
        ("concurrency", "concurrency: [" + ", ".join(str(i) for i in range(1, 300)) + "]",
         "concurrency"),
        ("requests_per_level", "requests_per_level: 1000000000", "requests_per_level"),
        ("workload", "workload: {kind: random, input_len: 100000000}", "input_len"),
        ("workload", "workload: {kind: sharegpt}", "path"),
        ("workload", "workload: {kind: sharegpt, path: /nonexistent/sg.json}", "dataset"),
        ("workload", "workload: {kind: zipf}", "kind"),
        ("space", "space: {x: {int: [1, 100], points: 1000000000}}", "points"),
        ("space", "space: {x: {float: [0, .inf]}}", "finite"),
        ("slo", "slo: {latency: 5}", "unknown SLO"),
        ("seed", "seed: -1", "seed"),
        ("fixed", "fixed: {tp-size: [[1, 2]]}", "tp-size"),
        ("fixed", "fixed: {'two words': 1}", "whitespace"),
    ],
)
def test_bad_studies_exit_2_at_their_line(tmp_path: Path, key: str, line: str,
                                          needle: str) -> None:
    path, _port = _study(tmp_path, _replace(key, line))
    res = run_cli("tune", str(path), "--check")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{path}:" in res.stderr and needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_grid_too_large_is_refused_without_building_it(tmp_path: Path) -> None:
    factors = "\n".join(f"  f{i}: {{int: [1, 1000], points: 1000}}" for i in range(6))
    text = BASE.replace("space:\n  fault: [null, nan]\n", f"space:\n{factors}\n")
    path, _port = _study(tmp_path, text)
    t0 = time.monotonic()
    res = run_cli("tune", str(path), "--check")
    assert res.returncode == 2 and "plans" in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("factor", ["{float: [0.1, 1.0], log: true, step: 0.1}",
                                    "{int: [1, 10], step: 0.5}"])
def test_distributions_optuna_refuses_are_input_errors(tmp_path: Path, factor: str) -> None:
    text = BASE.replace("space:\n  fault: [null, nan]\n",
                        f"space:\n  fault: [null]\n  x: {factor}\n").replace(
                            "strategy: grid", "strategy: tpe")
    path, _port = _study(tmp_path, text)
    res = run_cli("tune", str(path), "--check")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{path}:{_line_of(path, '  x:')}" in res.stderr and "Traceback" not in res.stderr


def test_check_prints_the_plan_and_launches_nothing(tmp_path: Path) -> None:
    path, port = _study(tmp_path, BASE)
    db = tmp_path / "s.db"
    res = run_cli("tune", str(path), "--check", "--store", f"sqlite:///{db}")
    assert res.returncode == 0, res.stderr
    assert "2 trials" in res.stdout and "│ nan" in res.stdout, res.stdout
    assert not db.exists() and not _listening(port)
    res = run_cli("tune", str(path), "--check", "--json")
    assert res.returncode == 0, res.stderr
    plan: dict[str, Any] = json.loads(res.stdout)
    assert plan["trials"] == 2
    assert plan["configurations"] == [{"fault": None}, {"fault": "nan"}]
    assert plan["levels"] == ["c=2"]
