"""Whether a level's figures are a measurement: the steady window, the error-rate gate, the
prefix-cache warning and the per-request counts behind an SLO share (issue 24, point 2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cleanslate.bench import (
    STEADY_FLOOR,
    BenchConfig,
    ClosedLoop,
    LevelResult,
    OpenLoop,
    RandomWorkload,
    SharedPrefixWorkload,
    run_repeats,
)
from cleanslate.bench import _metrics as m
from cleanslate.bench._client import RequestRecord
from tests.bench.conftest import fake_server

SMALL = RandomWorkload(input_len=8, output_len=5)


def level(load: ClosedLoop | OpenLoop, *faults: str, itl_s: float = 0.0,
          ttft_s: float = 0.0, **cfg: Any) -> LevelResult:
    async def go() -> LevelResult:
        async with fake_server(*faults, itl_s=itl_s, ttft_s=ttft_s) as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=cfg.pop("workload", SMALL), **cfg)
            return await run_repeats(config, load)

    return asyncio.run(go())


def ramped(slots: int = 10, span: float = 10.0, until: float = 40.0) -> list[RequestRecord]:
    """A closed loop whose slots start one second apart (a ten-second ramp): slot ``i`` sends
    at ``i``, then again as each request ends ``span`` seconds later, until ``until``; each
    request has one content event (one token) per second after its send."""
    out = []
    for i in range(slots):
        t = float(i)
        while t < until:
            rec = RequestRecord(t_send=t, input_tokens=8, input_source="server",
                                requested_output=int(span))
            rec.content_times = [t + k for k in range(1, int(span) + 1)]
            rec.t_first, rec.t_last, rec.t_end = rec.content_times[0], t + span, t + span
            rec.output_tokens = int(span)
            out.append(rec)
            t += span
    return out


def test_the_steady_window_of_a_level_with_a_long_ramp() -> None:
    records = ramped()
    # the tenth slot's first send (t=9) to the first slot's last end (t=40); the dips of a
    # slot's end and next send at the same instant stay inside
    assert m.steady_window(records, 10) == (9.0, 40.0)
    start, end = m.window(records)
    assert (start, end) == (0.0, 49.0)
    steady = m.steady(records, 10, end - start)
    assert steady is not None
    assert steady.share == pytest.approx(31 / 49)
    events = sum(1 for r in records for t in r.content_times if 9.0 <= t <= 40.0)
    assert steady.output_throughput == pytest.approx(events / 31)
    assert steady.request_throughput == pytest.approx(
        sum(1 for r in records if 9.0 <= r.t_end <= 40.0) / 31)
    # latencies: the requests sent and ended inside the window only
    assert steady.requests == sum(1 for r in records if r.t_send >= 9.0 and r.t_end <= 40.0)
    # 95 % of 10 is 9.5: ten requests in flight are needed; with 20 slots 19 are enough
    assert m.steady_window(records, 11) is None


def test_a_level_that_is_mostly_drain_is_flagged_and_a_steady_one_is_not() -> None:
    drained = level(ClosedLoop(concurrency=20), itl_s=0.002, num_prompts=25,
                    workload=RandomWorkload(input_len=8, output_len=50, range_ratio=0.9))
    assert drained.steady_share is not None and drained.steady_share < STEADY_FLOOR
    assert drained.steady_ok is False
    assert any("steady window" in w for w in drained.warnings)
    assert drained.steady_output_throughput is not None and drained.steady_output_throughput > 0
    assert drained.valid  # a short window is a warning, not an invalid level
    steady = level(ClosedLoop(concurrency=2), itl_s=0.001, num_prompts=40)
    assert steady.steady_ok is True and steady.steady_share is not None
    assert steady.steady_share > 0.8
    assert not any("steady window" in w for w in steady.warnings)
    assert steady.steady_requests is not None and 0 < steady.steady_requests <= 40
    assert steady.steady_median_ttft_ms is not None
    # an open loop has no concurrency to be steady at
    open_loop = level(OpenLoop(rate=200.0), num_prompts=10)
    assert open_loop.steady_share is None and open_loop.steady_ok is None


def test_two_percent_failed_requests_is_not_a_throughput_result() -> None:
    lv = level(ClosedLoop(concurrency=4), "http-500=50", num_prompts=200)
    assert (lv.failed, lv.completed) == (4, 196)
    assert lv.error_rate == pytest.approx(0.02)
    assert lv.valid is False
    assert lv.invalid_reason is not None
    assert "2.0% of requests failed (4 of 200)" in lv.invalid_reason
    lenient = level(ClosedLoop(concurrency=4), "http-500=50", num_prompts=200,
                    max_error_rate=0.05)
    assert lenient.valid is True and lenient.invalid_reason is None
    at_gate = level(ClosedLoop(concurrency=4), "http-500=100", num_prompts=200)
    assert at_gate.failed == 2 and at_gate.valid is True  # 1 % is not more than 1 %


def test_the_gate_over_repeats_counts_every_repeat_request() -> None:
    lv = level(ClosedLoop(concurrency=2), "http-500=25", num_prompts=50, repeats=2)
    assert lv.n_repeats == 2 and lv.failed == 4 and lv.error_rate == pytest.approx(0.04)
    assert not lv.valid and all(not r.valid for r in lv.repeats)


def test_cached_prompt_tokens_on_a_random_workload_are_a_warning() -> None:
    lv = level(ClosedLoop(concurrency=2), "cached-tokens=4", num_prompts=6)
    assert lv.cached_prompt_tokens == 24
    assert any("prefix cache" in w and "24 prompt tokens" in w for w in lv.warnings)
    # a shared prefix is what a prefix cache is for; a random workload with a prefix too
    shared = level(ClosedLoop(concurrency=2), "cached-tokens=4", num_prompts=6,
                   workload=SharedPrefixWorkload(num_prefixes=2, prefix_len=8, suffix_len=4,
                                                 output_len=4))
    prefixed = level(ClosedLoop(concurrency=2), "cached-tokens=4", num_prompts=6,
                     workload=RandomWorkload(input_len=8, output_len=5, prefix_len=8))
    clean = level(ClosedLoop(concurrency=2), num_prompts=6)
    for lv in (shared, prefixed, clean):
        assert not any("prefix cache" in w for w in lv.warnings)
    # on chat, a few cached tokens are the chat template's shared head: 1 of 64 is no warning
    chat = level(ClosedLoop(concurrency=2), "cached-tokens=1", num_prompts=6, endpoint="chat",
                 workload=RandomWorkload(input_len=64, output_len=4))
    assert chat.cached_prompt_tokens == 6
    assert not any("prefix cache" in w for w in chat.warnings)


def test_limit_counts_are_the_samples_that_met_each_limit() -> None:
    records = ramped(slots=2, span=4.0, until=8.0)
    records[1].t_first = records[1].t_send + 2.5  # one slow first token
    samples = m.samples_ms(records)
    counts = m.limit_counts(samples, {"p99_ttft_ms": 1500.0, "max_e2el_ms": 4000.0,
                                      "p50_itl_ms": 999.0, "mean_tpot_ms": 1000.0})
    assert counts["p99_ttft_ms"] == (3, 4)
    assert counts["max_e2el_ms"] == (4, 4)
    assert counts["p50_itl_ms"] == (0, 12)  # every gap is 1000 ms
    assert counts["mean_tpot_ms"][1] == 4


def test_limit_counts_of_a_measured_level_match_its_own_distribution() -> None:
    # the fake waits 30 ms before every first token: none is under 20 ms, all under 10 s
    limits = {"p99_ttft_ms": 10_000.0, "p90_ttft_ms": 20.0, "p50_itl_ms": 1e-6}
    lv = level(ClosedLoop(concurrency=4), itl_s=0.001, ttft_s=0.03, num_prompts=40, repeats=2,
               limits=limits)
    assert lv.ttft_ms.min is not None and lv.ttft_ms.min > 20.0
    assert lv.limit_counts["p90_ttft_ms"] == (0, 80)
    assert lv.limit_counts["p99_ttft_ms"] == (80, 80) == (lv.ttft_ms.count, lv.ttft_ms.count)
    assert lv.limit_counts["p50_itl_ms"] == (0, lv.itl_ms.count)
    assert [r.limit_counts["p99_ttft_ms"] for r in lv.repeats] == [(40, 40), (40, 40)]



def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="not a latency key"):
        BenchConfig(url="http://127.0.0.1:9", model="m", limits={"p99_latency": 5.0})
    with pytest.raises(ValueError, match="positive"):
        BenchConfig(url="http://127.0.0.1:9", model="m", limits={"p99_ttft_ms": -1.0})
