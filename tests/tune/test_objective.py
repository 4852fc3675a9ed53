"""The objective is read in one place: a trial's value and best level (tune) and a report's
metric and direction (report) both come from :class:`~cleanslate.tune.study.Objective`."""

from __future__ import annotations

import math

from cleanslate.bench import LevelResult
from cleanslate.tune.study import Objective
from tests.store.documents import level


def _levels(*values: float) -> list[LevelResult]:
    return [LevelResult.model_validate(level(f"c={2 ** i}", output_throughput=v,
                                             p99_ttft_ms=1000.0 / (i + 1)))
            for i, v in enumerate(values)]


def test_the_best_level_in_each_direction() -> None:
    levels = _levels(100.0, 300.0, 200.0)
    best = Objective(maximize="output_throughput").best(levels)
    assert best is not None and best.label == "c=2"
    low = Objective(minimize="p99_ttft_ms").best(levels)
    assert low is not None and low.label == "c=4"
    assert Objective(maximize="output_throughput").value(levels[1]) == 300.0


def test_equal_values_pick_the_first_level_and_no_value_picks_none() -> None:
    levels = _levels(300.0, 300.0)
    best = Objective(maximize="output_throughput").best(levels)
    assert best is not None and best.label == "c=1"
    assert Objective(maximize="output_throughput").best([]) is None
    assert Objective(maximize="output_throughput").best(_levels(math.nan)) is None
    no_goodput = _levels(1.0)[0].model_copy(update={"request_goodput": None})
    assert Objective(maximize="request_goodput").best([no_goodput]) is None


def test_the_objective_of_a_stored_spec() -> None:
    assert Objective.of({"objective": {"maximize": "output_throughput", "minimize": None}}) \
        == Objective(maximize="output_throughput")
    minimize = Objective.of({"objective": {"minimize": "p99_ttft_ms"}})
    assert minimize.direction == "minimize" and minimize.metric == "p99_ttft_ms"
    for spec in ({}, {"objective": None}, {"objective": {"maximize": "not_a_metric"}},
                 {"objective": "fast"}):
        assert Objective.of(spec) == Objective(maximize="output_throughput"), spec
