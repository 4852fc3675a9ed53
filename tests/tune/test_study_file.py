"""Study files: bad input exits 2 with file:line and a hint, never a traceback; strategies."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanslate.tune.space import ablation_configs, distributions, grid_configs, trial_budget
from cleanslate.tune.study import StudySpec, load_study
from tests.conftest import run_cli

GOOD = """\
name: t
engine: sim
model: sim
fixed: {tp-size: 1}
baseline: {mem-fraction-static: 0.85, disable-cuda-graph: true, max-running-requests: 64}
space:
  mem-fraction-static: [0.85, 0.88, 0.92]
  disable-cuda-graph: [true, false]
  max-running-requests: {int: [64, 2048], log: true}
strategy: ablation
workload: {kind: random, input_len: 1024, output_len: 256}
concurrency: [512, 64, 256]
objective: {maximize: output_throughput}
slo: {ttft_p99_ms: 5000, tpot_p99_ms: 100}
budget: {trials: 30, hours: 12}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_the_issue_shape_loads(tmp_path: Path) -> None:
    spec, _ = load_study(_write(tmp_path, GOOD))
    assert spec.concurrency == [64, 256, 512]
    assert spec.slo_limits() == {"p99_ttft_ms": 5000, "p99_tpot_ms": 100}
    assert spec.factor_values("max-running-requests") == [64, 362, 2048]


def test_ablation_differs_from_the_baseline_in_one_flag_each(tmp_path: Path) -> None:
    spec, _ = load_study(_write(tmp_path, GOOD))
    configs = ablation_configs(spec)
    base = configs[0]
    assert base == {"mem-fraction-static": 0.85, "disable-cuda-graph": True,
                    "max-running-requests": 64}
    # baseline + (3-1) + (2-1) + (3-1) one-factor changes
    assert len(configs) == 1 + 2 + 1 + 2
    for config in configs[1:]:
        changed = [k for k in config if config[k] != base[k]]
        assert len(changed) == 1
    assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)
    assert trial_budget(spec) == 6


def test_grid_and_samplers(tmp_path: Path) -> None:
    spec, _ = load_study(_write(tmp_path, GOOD.replace("strategy: ablation", "strategy: grid")))
    grid = grid_configs(spec)
    assert len(grid) == spec.grid_size() == 18
    assert grid[0] == spec.baseline
    tpe = StudySpec.model_validate({**spec.model_dump(by_alias=True), "strategy": "tpe"})
    dists = distributions(tpe)
    assert type(dists["max-running-requests"]).__name__ == "IntDistribution"
    assert type(dists["disable-cuda-graph"]).__name__ == "CategoricalDistribution"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (GOOD.replace("space:\n", "space:\n  bad: [1, 2\n"), 8, "YAML syntax error"),
        (GOOD.replace("engine: sim", "engine: sglangg"), 2, "unknown engine"),
        (GOOD.replace("concurrency: [512, 64, 256]", "concurrency: [64, lots]"), 12,
         "concurrency"),
        (GOOD.replace("budget: {trials: 30, hours: 12}", "budget: {trials: many}"), 15,
         "trials"),
        ("name: t\nengine: sim\nmodel: sim\nspace: {}\nconcurrency: [1]\n", 4, "empty"),
        (GOOD.replace("strategy: ablation", "strategy: bayes"), 10, "strategy"),
        (GOOD.replace("slo: {ttft_p99_ms: 5000", "slo: {ttft_p42_ms: 5000"), 14, "SLO"),
        (GOOD + "colour: blue\n", 16, "colour"),
    ],
)
def test_bad_study_files_exit_2_with_file_and_line(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = _write(tmp_path, text)
    result = run_cli("tune", str(path), "--store", f"sqlite:///{tmp_path}/s.db")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:{line}" in result.stderr, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "artifacts").exists()


def test_a_flag_the_engine_does_not_know_is_exit_2_at_its_line(tmp_path: Path) -> None:
    text = GOOD.replace("fixed: {tp-size: 1}", "fixed:\n  tp-size: 1\n  mem-fraction-statik: 0.9")
    path = _write(tmp_path, text)
    result = run_cli("tune", str(path), "--store", f"sqlite:///{tmp_path}/s.db")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:6" in result.stderr
    assert "mem-fraction-static" in result.stderr  # the closest valid spelling
    assert "Traceback" not in result.stderr
