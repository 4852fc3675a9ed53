"""What a report derives from the store: order, best, Pareto front, ablation effects."""

from __future__ import annotations

import pytest

from cleanslate.errors import InputError
from cleanslate.report import StudyReport, load_report, pareto
from cleanslate.store import Store
from tests.report.conftest import StudyStore


@pytest.fixture(scope="module")
def quickstart(recorded_store: StudyStore) -> StudyReport:
    return load_report(Store(recorded_store.url), "quickstart")


@pytest.fixture(scope="module")
def tiny(recorded_store: StudyStore) -> StudyReport:
    return load_report(Store(recorded_store.url), "report-tiny")


def test_pareto_keeps_the_undominated_points_sorted_by_throughput() -> None:
    points = [("a", 100.0, 50.0), ("b", 200.0, 80.0), ("c", 150.0, 90.0), ("d", 200.0, 100.0),
              ("e", 50.0, 10.0), ("f", 100.0, 50.0)]
    # c is beaten by b (more tokens/s, less TTFT), d by b (same tokens/s, more TTFT).
    assert pareto(points) == ["e", "a", "f", "b"]
    assert pareto([]) == []


def test_trials_sorted_by_objective_then_infeasible(quickstart: StudyReport) -> None:
    ordered = quickstart.sorted_trials()
    values = [t.record.value for t in ordered if t.feasible]
    assert values == sorted(values, reverse=True)  # maximize: best first
    assert [t.status for t in ordered][-1] == "infeasible"
    assert ordered[-1].record.cause == "oom"
    assert quickstart.best is ordered[0]
    assert quickstart.best.record.value == max(v for v in values if v is not None)


def test_best_level_figures_come_from_the_best_level(quickstart: StudyReport) -> None:
    best = quickstart.best
    assert best is not None and best.best is not None
    assert best.best.label == best.record.best_level
    assert best.metric("output_throughput") == pytest.approx(best.record.value)
    assert best.metric("p99_ttft_ms") == best.best.ttft_ms.p99
    assert best.launch_command.split()[1:4] == ["-m", "cleanslate", "sim"]


def test_ablation_effects_are_relative_to_the_baseline(quickstart: StudyReport) -> None:
    base = quickstart.baseline_trial()
    assert base is not None and base.record.params == quickstart.baseline
    effects = quickstart.ablation_effects()
    # One effect per non-baseline trial, each one flag away from the baseline.
    assert len(effects) == len(quickstart.results) - 1
    assert base.record.value is not None
    for effect in effects:
        assert effect.trial.record.params[effect.factor] == effect.value
        if effect.trial.feasible:
            assert effect.trial.record.value is not None
            expected = (effect.trial.record.value / base.record.value - 1) * 100
            assert effect.change_pct == pytest.approx(expected)
            assert effect.better == (expected > 0)
            assert effect.cause is None
        else:
            assert effect.change_pct is None and effect.cause == "oom"


def test_level_points_and_front_only_use_levels_that_met_the_slos(
        quickstart: StudyReport) -> None:
    points = quickstart.level_points()
    assert len(points) == sum(len(t.record.levels) for t in quickstart.trials)
    front = quickstart.pareto_front()
    assert front
    for trial, level, x, y in front:
        assert trial.level_verdict(level) == "ok"
        assert not any(x2 >= x and y2 <= y and (x2 > x or y2 < y)
                       for t2, l2, x2, y2 in points if t2.level_verdict(l2) == "ok")


def test_simulated_engine_is_declared(tiny: StudyReport) -> None:
    assert tiny.simulated and tiny.engine == "sim"
    assert tiny.factors == ["fault", "max-running-requests"]
    assert tiny.short_params(tiny.trials[0]) == "baseline"


def test_unknown_study_names_the_known_ones(recorded_store: StudyStore) -> None:
    with pytest.raises(InputError) as info:
        load_report(Store(recorded_store.url), "nope")
    assert "nope" in info.value.message
    assert info.value.hint is not None
    assert "report-tiny" in info.value.hint and "quickstart" in info.value.hint


def test_minimize_sorts_ascending_and_judges_changes_the_other_way(
        quickstart: StudyReport) -> None:
    from dataclasses import replace

    spec = {**quickstart.spec, "objective": {"minimize": "output_throughput"}}
    low = replace(quickstart, spec=spec)
    values = [t.record.value for t in low.sorted_trials() if t.feasible]
    assert values == sorted(values)
    assert low.best is not None and low.best.record.value == min(v for v in values if v)
    for effect in low.ablation_effects():
        if effect.change_pct is not None:
            assert effect.better == (effect.change_pct < 0)
