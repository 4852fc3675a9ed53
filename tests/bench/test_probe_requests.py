"""A capacity probe's request count (:func:`cleanslate.bench._find_max.probe_requests`): a
closed-loop probe sends at least as many requests as it has slots, whatever ``num_prompts``
says, so that a probe at c=1024 is measured at that load and not at the load of its 40
requests."""

from __future__ import annotations

from cleanslate.bench import BenchConfig, CapacitySearch, CapacitySLO, ClosedLoop
from cleanslate.bench._find_max import probe_requests


def _search() -> CapacitySearch:
    return CapacitySearch("concurrency", CapacitySLO(limits={"p90_tpot_ms": 10.0}))


def test_a_probe_has_at_least_its_concurrency_in_requests() -> None:
    config = BenchConfig(url="http://127.0.0.1:1", model="m", num_prompts=40)
    search = _search()
    assert probe_requests(config, search, ClosedLoop(concurrency=1024)) == 1024
    assert probe_requests(config, search, ClosedLoop(concurrency=8)) == 40


def test_the_default_count_and_the_slo_floor_still_hold() -> None:
    config = BenchConfig(url="http://127.0.0.1:1", model="m")
    assert probe_requests(config, _search(), ClosedLoop(concurrency=8)) == 50  # 5/slot, >= 50
    p99 = CapacitySearch("concurrency", CapacitySLO(limits={"p99_tpot_ms": 10.0}))
    assert probe_requests(config.model_copy(update={"num_prompts": 10}), p99,
                          ClosedLoop(concurrency=8)) == 381  # min_requests of a p99 at 95 %
