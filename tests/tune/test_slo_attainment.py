"""A percentile SLO's verdict is a share of requests with a Wilson interval: a level whose
interval straddles the target (with at least one miss) is measured once more and decided on
both samples together (cleanslate.tune.trial.slo_attainment, pool_counts)."""

from __future__ import annotations

import pytest

from cleanslate.bench import LevelResult
from cleanslate.stats import wilson
from cleanslate.tune.trial import pool_counts, share_target, slo_attainment
from tests.store.documents import level


def _level(met: int, n: int) -> LevelResult:
    return LevelResult.model_validate(level("c=8", limit_counts={"p99_ttft_ms": [met, n]}))


def test_share_targets() -> None:
    assert share_target("p99_ttft_ms") == pytest.approx(0.99)
    assert share_target("p99.9_e2el_ms") == pytest.approx(0.999)
    assert share_target("median_tpot_ms") == 0.5
    assert share_target("mean_tpot_ms") is None
    assert share_target("max_itl_ms") is None


def test_a_straddling_share_is_flagged_and_a_clear_one_is_not() -> None:
    limits = {"p99_ttft_ms": 5000.0}
    near = slo_attainment(_level(297, 300), limits, 0.95)["p99_ttft_ms"]
    assert near["straddles"] and near["target"] == pytest.approx(0.99)
    assert (near["low"], near["high"]) == pytest.approx(wilson(297, 300), abs=1e-5)
    # 300 of 300: nothing contradicts the SLO, more requests can only confirm it.
    assert not slo_attainment(_level(300, 300), limits, 0.95)["p99_ttft_ms"]["straddles"]
    # 250 of 300: clearly below 99 %, the interval lies under the target.
    clear_miss = slo_attainment(_level(250, 300), limits, 0.95)["p99_ttft_ms"]
    assert not clear_miss["straddles"] and clear_miss["high"] < 0.99
    # Means and maxima have no share: not checked this way.
    assert slo_attainment(_level(297, 300), {"mean_ttft_ms": 10.0}, 0.95) == {}


def test_two_samples_pool_their_counts() -> None:
    pooled = pool_counts(_level(297, 300), _level(299, 300))
    assert pooled == {"p99_ttft_ms": (596, 600)}
    both = slo_attainment(_level(297, 300), {"p99_ttft_ms": 5000.0}, 0.95, counts=pooled)
    assert both["p99_ttft_ms"]["met"] == 596 and both["p99_ttft_ms"]["n"] == 600
    low, high = wilson(596, 600)
    assert high - low < wilson(297, 300)[1] - wilson(297, 300)[0]
