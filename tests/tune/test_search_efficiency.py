"""``benchmarks/search_efficiency.py``: launches counted per strategy, the guided path driven
through the product's notebook on the sim's steady-state surface, and the JSON a results page
reads (the machinery, not the targets)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
efficiency: Any = importlib.import_module("search_efficiency")


def _count_ok(count: object) -> bool:
    """A count is a number, or ``> N`` for seeds that never reached the optimum."""
    return isinstance(count, int) or (isinstance(count, str) and count.startswith("> "))


def test_guided_reaches_the_noise_free_optimum_and_every_launch_is_counted() -> None:
    said: list[str] = []
    data = efficiency.run(["quick"], ["guided", "tpe"], seeds=3, sigma=0.0, say=said.append)
    (space,) = data["spaces"]
    assert space["name"] == "quick" and space["configs"] == 120
    assert 1 <= space["ties"] <= space["feasible"] < space["configs"]
    rows = {r["strategy"]: r for r in space["rows"]}
    assert set(rows) == {"guided", "tpe"}
    for row in rows.values():
        assert len(row["runs"]) == 3
        for what in ("median_launches", "worst_launches", "median_trials", "worst_trials"):
            assert _count_ok(row[what]), (row["strategy"], what, row[what])
        for run in row["runs"]:
            # every trial is at least one launch; a race adds its pairs' measurements
            assert run["spent_launches"] >= run["spent_trials"] >= 1
    guided = rows["guided"]
    assert guided["not_reached"] == 0
    margin = data["statistics"]["tie_margin"]
    for run in guided["runs"]:
        assert run["launches"] >= run["trials"] >= 2  # the baseline is not the optimum
        assert run["incumbent_share"] >= 1 - margin
    # what the launches up to the optimum went on: the baseline once, at least one step kept
    spent = guided["spent_on"]
    assert spent["baseline"] == {"launches": 1, "steps": 1}
    assert spent["kept"]["steps"] >= 1
    # without noise every seed takes the same path, so the kinds add up to its launches
    assert len({run["launches"] for run in guided["runs"]}) == 1
    assert sum(kind["launches"] for kind in spent.values()) == guided["median_launches"]
    assert any(run["spent_launches"] > run["spent_trials"] for run in guided["runs"])
    assert [t["space"] for t in data["targets"]] == ["quick", "quick"]
    assert all(isinstance(t["met"], bool) for t in data["targets"])
    assert any(line.startswith("| strategy | median launches") for line in said)
    n = guided["median_launches"]  # every seed the same: median, interval and worst agree
    assert any(line.startswith(f"| guided | {n} [{n}, {n}] | {n} |") for line in said)


def test_a_trial_is_recorded_as_tune_records_it() -> None:
    space = efficiency.spaces()["quick"]
    spec = space.spec("guided", 0, 10)
    baseline = efficiency.record(space, spec, 0, dict(space.baseline), 1.0)
    # the baseline misses the SLO at c=256, where 128 requests wait behind the cap
    assert baseline.status == "feasible" and baseline.best_level == "c=128"
    assert baseline.limit_level == "c=256" and baseline.limit_bottleneck is not None
    assert baseline.limit_bottleneck.verdict == "running_cap"
    assert baseline.value == space.truth(space.baseline)
    crash = {**space.baseline, "disable-cuda-graph": False, "max-running-requests": 256}
    crashed = efficiency.record(space, spec, 1, crash, 1.0)
    assert crashed.status == "infeasible" and crashed.crashed_at == "c=256"
    assert crashed.cause == "python_exception" and crashed.value is None
    assert crashed.limit_bottleneck is not None and crashed.limit_bottleneck.verdict == "crashed"


def test_a_bad_argument_is_exit_2_naming_it(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["search_efficiency.py", "--spaces", "huge"])
    assert efficiency.main() == 2
    assert "not known: huge" in capsys.readouterr().err


def test_the_median_interval_is_the_order_statistics_the_binomial_gives() -> None:
    # 30 values: P(Binomial(30, 1/2) <= 9) = 0.021 <= 0.025 < P(<= 10): the 10th and 21st
    assert efficiency.median_interval([float(v) for v in range(30, 0, -1)]) == (10.0, 21.0)
    # too few to exclude anything at 95 %: the range; a seed that never reached stays infinite
    assert efficiency.median_interval([3.0, float("inf"), 1.0]) == (1.0, float("inf"))
