"""The capacity search as a state machine (cleanslate.bench._capacity): no server, probes made
from a known attainment curve."""

from __future__ import annotations

from typing import Any

import pytest

from cleanslate.bench import CapacitySearch, CapacitySLO, Probe, ProbeVerdict, StopReason
from cleanslate.bench._capacity import SloCheck, level_key, parse_slo_keys

P99 = CapacitySLO(limits={"p99_tpot_ms": 200.0})


def probe(search: CapacitySearch, load: float, verdict: ProbeVerdict,
          throughput: float = 100.0) -> Probe:
    return Probe(index=len(search.probes), load=load, label=f"c={int(load)}", verdict=verdict,
                 output_throughput=throughput)


def drive(search: CapacitySearch, verdict_of) -> list[float]:  # type: ignore[no-untyped-def]
    loads = []
    while (load := search.next_load()) is not None:
        loads.append(load)
        search.record(probe(search, load, verdict_of(load)))
    return loads


@pytest.mark.parametrize("boundary", [1, 5, 37, 100, 129, 1000, 3000])
def test_doubling_then_bisection_brackets_the_boundary_within_the_tolerance(boundary: int) -> None:
    search = CapacitySearch("concurrency", P99, start=8, max_load=4096, tolerance=0.1)
    loads = drive(search, lambda c: ProbeVerdict.PASS if c <= boundary else ProbeVerdict.FAIL)
    result = search.result()
    assert result.stopped_by == StopReason.TOLERANCE
    assert result.capacity is not None and result.upper is not None
    assert result.capacity <= boundary < result.upper
    assert result.upper - result.capacity <= max(0.1 * result.capacity, 1)
    assert len(loads) == len(set(loads))  # no load probed twice
    assert len(loads) <= 16


def test_every_probe_passing_stops_at_the_cap() -> None:
    search = CapacitySearch("concurrency", P99, start=8, max_load=100)
    loads = drive(search, lambda c: ProbeVerdict.PASS)
    assert loads == [8, 16, 32, 64, 100]
    result = search.result()
    assert (result.capacity, result.upper, result.stopped_by) == (100, None, StopReason.MAX_LOAD)


def test_nothing_passes() -> None:
    search = CapacitySearch("concurrency", P99, start=8)
    loads = drive(search, lambda c: ProbeVerdict.FAIL)
    assert loads == [8, 4, 2, 1]
    result = search.result()
    assert result.capacity is None and result.stopped_by == StopReason.NOTHING_PASSES
    assert "none" in result.summary()


def test_a_crash_ends_the_search_and_no_load_above_it_passes() -> None:
    search = CapacitySearch("concurrency", P99, start=8)
    for load in (8, 16, 32):
        assert search.next_load() == load
        search.record(probe(search, load, ProbeVerdict.PASS))
    assert search.next_load() == 64
    search.record(probe(search, 64, ProbeVerdict.CRASHED).model_copy(
        update={"cause": "cuda_error", "detail": "illegal memory access"}))
    assert search.next_load() is None
    result = search.result()
    assert result.crash == "crashed at c=64 (cuda_error: illegal memory access)"
    assert (result.capacity, result.upper, result.stopped_by) == (32, 64, StopReason.CRASHED)
    assert "crashed at c=64" in result.summary()


def test_unresolved_and_errors_are_upper_bounds_never_passes() -> None:
    search = CapacitySearch("concurrency", P99, start=8, tolerance=0.1)

    def verdict(c: float) -> ProbeVerdict:
        if c <= 40:
            return ProbeVerdict.PASS
        return ProbeVerdict.UNRESOLVED if c < 60 else ProbeVerdict.ERRORS

    drive(search, verdict)
    result = search.result()
    assert result.capacity == 40 and result.upper is not None and result.upper <= 44
    assert result.unresolved and all(40 < u < 60 for u in result.unresolved)
    assert "unresolved" in result.summary()


def test_rates_bisect_without_rounding_to_integers() -> None:
    slo = CapacitySLO(limits={"p90_ttft_ms": 500.0})
    search = CapacitySearch("rate", slo, start=1.0, max_load=1000.0, tolerance=0.05)
    drive(search, lambda r: ProbeVerdict.PASS if r <= 6.3 else ProbeVerdict.FAIL)
    result = search.result()
    assert result.capacity is not None and result.upper is not None
    assert result.capacity <= 6.3 < result.upper <= result.capacity * 1.05 + 1e-9


def test_a_cliff_between_two_passing_probes_is_reported() -> None:
    search = CapacitySearch("concurrency", P99, start=8, max_load=32, cliff=0.2)
    for load, tput in ((8, 1000.0), (16, 1900.0), (32, 1200.0)):
        assert search.next_load() == load
        search.record(probe(search, load, ProbeVerdict.PASS, tput))
    result = search.result()
    assert len(result.cliffs) == 1 and "fell 37% from c=16" in result.cliffs[0]


def test_the_fewest_requests_that_can_show_a_target() -> None:
    assert P99.min_requests() == 381
    assert CapacitySLO(limits={"p95_tpot_ms": 1.0}).min_requests() == 73
    assert CapacitySLO(limits={"median_ttft_ms": 1.0}).min_requests() == 4
    assert CapacitySLO(limits={"mean_ttft_ms": 1.0}).min_requests() == 1
    assert CapacitySLO(limits={"tpot_ms": 50.0}, attainment=0.9).min_requests() == 35


def test_slo_keys_in_either_spelling_and_clear_errors() -> None:
    assert parse_slo_keys("p99_tpot_ms=200, tpot_p90_ms=50") == {
        "p99_tpot_ms": 200.0, "p90_tpot_ms": 50.0}
    assert level_key("e2e_p99_ms") == "p99_e2el_ms"
    with pytest.raises(ValueError, match="not a latency SLO"):
        parse_slo_keys("p99_speed_ms=2")
    with pytest.raises(ValueError, match="not a number"):
        parse_slo_keys("p99_tpot_ms=fast")
    with pytest.raises(ValueError, match="per request"):
        CapacitySLO(limits={"p99_tpot_ms": 1.0}, attainment=0.99)
    with pytest.raises(ValueError, match="statistic"):
        CapacitySLO(limits={"tpot_ms": 1.0})


def test_a_check_describes_its_interval() -> None:
    check = SloCheck(slo="p99_tpot_ms", limit=200, target=0.99, met=377, n=381, low=0.973,
                     high=0.996, decision="straddles")
    assert check.describe() == ("p99_tpot_ms: 377 of 381 (99.0%, interval 97.3%-99.6%) "
                                "against 99.0%")


def test_a_server_that_answers_nothing_ends_the_search_at_its_first_probe() -> None:
    """Every request an HTTP 500 (the fake server's vLLM dead-EngineCore answer): one probe,
    not a halving down to one request in flight."""
    import asyncio

    from cleanslate.bench import BenchConfig, RandomWorkload, find_max
    from tests.bench.conftest import fake_server

    async def go() -> Any:
        async with fake_server("http-500") as (url, _stats):
            config = BenchConfig(url=url, model="m", num_prompts=8,
                                 workload=RandomWorkload(input_len=8, output_len=4))
            search = CapacitySearch("concurrency", CapacitySLO(limits={"p50_tpot_ms": 50.0}),
                                    start=8)
            return await find_max(config, search)

    result = asyncio.run(go())
    assert [p.verdict for p in result.probes] == [ProbeVerdict.ERRORS]
    assert result.stopped_by == StopReason.NOTHING_PASSES and result.capacity is None
    assert result.probes[0].cause == "request_errors"
    assert "none (not even c=8)" in result.summary()


def test_the_summary_of_a_search_stopped_early_claims_no_cap() -> None:
    search = CapacitySearch("concurrency", P99, start=8)
    assert search.next_load() == 8
    search.record(probe(search, 8, ProbeVerdict.PASS))
    search.stop(StopReason.INTERRUPTED)
    text = search.result().summary()
    assert "at least c=8 (no probe above it had failed" in text and "cap" not in text
    empty = CapacitySearch("concurrency", P99, start=8)
    empty.stop(StopReason.INTERRUPTED)
    assert "none passed before the search stopped" in empty.result().summary()
