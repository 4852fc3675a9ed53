"""Open-loop arrival distributions: mean gap 1/rate, the right spread, reproducible by seed."""

from __future__ import annotations

import math
import statistics

import pytest

from cleanslate.bench import OpenLoop
from cleanslate.bench._arrivals import intervals, iter_offsets, schedule


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


def test_constant() -> None:
    gaps = intervals(OpenLoop(rate=4, arrival="constant"), 5, seed=0)
    assert gaps == [0.0, 0.25, 0.25, 0.25, 0.25]
    assert schedule(OpenLoop(rate=4, arrival="constant"), 3, seed=0) == [0.0, 0.25, 0.5]


def test_poisson_mean_and_spread() -> None:
    gaps = intervals(OpenLoop(rate=10), 20001, seed=1)[1:]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.03)
    assert cv(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_mean_and_spread(burstiness: float) -> None:
    load = OpenLoop(rate=5, arrival="gamma", burstiness=burstiness)
    gaps = intervals(load, 20001, seed=2)[1:]
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.05)
    assert cv(gaps) == pytest.approx(1 / math.sqrt(burstiness), rel=0.07)


def test_seeded_and_infinite_rate() -> None:
    load = OpenLoop(rate=3)
    assert intervals(load, 50, seed=7) == intervals(load, 50, seed=7)
    assert intervals(load, 50, seed=7) != intervals(load, 50, seed=8)
    assert intervals(OpenLoop(rate=math.inf), 4, seed=0) == [0.0] * 4


@pytest.mark.parametrize("arrival", ["poisson", "constant", "gamma"])
def test_endless_offsets_match_the_schedule(arrival: str) -> None:
    load = OpenLoop(rate=7, arrival=arrival, burstiness=0.5)  # type: ignore[arg-type]
    it = iter_offsets(load, seed=4)
    assert [next(it) for _ in range(30)] == pytest.approx(schedule(load, 30, seed=4))
