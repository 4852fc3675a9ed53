"""The H200 racing study (``examples/h200-statistics.yaml``, issue 24 point 9) and what its two
runs recorded (``docs/validation/h200-statistics-run{1,2}.json``, cleanslate report exports of
the stores brought back): the file loads as the page describes it, and the tie set recomputed
from the recorded measurements is the one both runs printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cleanslate.store._trials import TrialRecord
from cleanslate.tune import load_study
from cleanslate.tune.race import tie_set

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "examples" / "h200-statistics.yaml"


def _trials(run: int) -> list[TrialRecord]:
    doc = json.loads((REPO / "docs" / "validation" / f"h200-statistics-run{run}.json").read_text())
    fields = set(TrialRecord.model_fields)
    return [TrialRecord.model_validate({k: v for k, v in t.items() if k in fields})
            for t in doc["studies"][0]["trials"]]


def test_the_example_is_a_racing_grid_of_four_with_the_expected_best_first() -> None:
    spec, _root = load_study(STUDY)
    assert spec.engine == "transformers"
    assert spec.fixed == {"device": "cuda", "dtype": "bfloat16", "continuous-batching": True}
    assert spec.strategy == "grid"
    assert {k: list(v) for k, v in spec.space.items()} == {
        "cb-use-cuda-graph": [True, False], "cb-max-memory-percent": [0.3, 0.5]}
    assert spec.baseline == {"cb-use-cuda-graph": True, "cb-max-memory-percent": 0.5}
    assert spec.concurrency == [16, 64]
    stats = spec.statistics
    assert stats.racing and stats.max_replicates == 4 and stats.tie_margin == 0.05


def _contenders(run: int) -> tuple[int | None, set[int], set[int]]:
    spec, _root = load_study(STUDY)
    found = tie_set(_trials(run), spec)
    assert found.best is not None
    return found.best.number, set(found.tied), set(found.contenders)


@pytest.mark.parametrize("run", [1, 2])
def test_each_run_tells_graphs_apart_and_not_the_memory_cap(run: int) -> None:
    trials = _trials(run)
    assert len(trials) == 4
    best, tied, contenders = _contenders(run)
    # The two configurations with CUDA graphs are the contenders (best and undecided, no tie);
    # the two without lost to the incumbent without a race: one measurement each.
    assert contenders == {0, 1} and best in contenders and tied == set()
    by_number = {t.number: t for t in trials}
    for n in (2, 3):
        assert by_number[n].params["cb-use-cuda-graph"] is False
        assert len(by_number[n].replicates) == 1
        assert [(r.against, r.outcome) for r in by_number[n].races] == [(0, "loss")]
    # The race stopped after 3 of its 4 pairs, undecided: 3 measurements of each racer.
    assert [(r.against, r.outcome, r.pairs) for r in by_number[1].races] == [(0, "undecided", 3)]
    assert len(by_number[0].replicates) == 3 and len(by_number[1].replicates) == 3


def test_the_two_runs_agree_on_the_best_and_the_contenders() -> None:
    assert _contenders(1) == _contenders(2)


def test_run_5_with_the_heap_frozen_names_the_same_contenders() -> None:
    """Run 5 (the load generator's heap frozen during levels): the same best and contenders
    as runs 3 and 4; the two configurations without graphs lost to the incumbent of the time,
    #1, one measurement each."""
    best, tied, contenders = _contenders(5)
    assert (best, tied, contenders) == (1, set(), {0, 1})
    by_number = {t.number: t for t in _trials(5)}
    assert [(r.against, r.outcome) for r in by_number[1].races] == [(0, "undecided")]
    for n in (2, 3):
        assert len(by_number[n].replicates) == 1
        assert [(r.against, r.outcome) for r in by_number[n].races] == [(1, "loss")]
