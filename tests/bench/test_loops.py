"""Closed and open loops against a real (fake) streaming server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from cleanslate.bench import (
    SLO,
    BenchConfig,
    ClosedLoop,
    LevelResult,
    OpenLoop,
    RandomWorkload,
    run_benchmark,
    run_level,
)
from tests.bench.conftest import fake_server

SMALL = RandomWorkload(input_len=8, output_len=5)


def level(
    load: ClosedLoop | OpenLoop, server: dict[str, Any] | None = None, **cfg: Any
) -> LevelResult:
    """One level against the fake; ``server``: its ``faults`` (a tuple) and timing knobs."""
    knobs = dict(server or {})
    faults = knobs.pop("faults", ())

    async def go() -> LevelResult:
        async with fake_server(*faults, **knobs) as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=cfg.pop("workload", SMALL), **cfg)
            return await run_level(config, load)

    return asyncio.run(go())


def test_closed_loop_counts_and_concurrency() -> None:
    lv = level(ClosedLoop(concurrency=8), {"itl_s": 0.002}, num_prompts=40)
    assert lv.completed == 40 and lv.failed == 0 and lv.num_prompts == 40
    assert lv.max_concurrency == 8
    assert lv.max_concurrent_requests == 8
    assert lv.total_output_tokens == 200 and lv.output_tokens_source == "server"
    assert lv.total_input_tokens == 320 and lv.input_tokens_source == "server"
    assert lv.ttft_ms.count == 40 and lv.tpot_ms.count == 40 and lv.itl_ms.count == 160
    assert lv.itl_ms.median is not None and 1.5 < lv.itl_ms.median < 20
    assert lv.output_throughput == pytest.approx(lv.total_output_tokens / lv.duration)
    assert not lv.partial and lv.errors == {}


def test_chat_endpoint() -> None:
    lv = level(ClosedLoop(concurrency=2), num_prompts=6, endpoint="chat")
    assert lv.completed == 6 and lv.total_output_tokens == 30
    assert lv.itl_ms.count == 6 * 4  # the empty role chunk is not content


def test_open_loop_constant_rate_is_achieved() -> None:
    load = OpenLoop(rate=50, arrival="constant")
    lv = level(load, num_prompts=40)
    assert lv.completed == 40
    assert lv.request_rate == 50
    assert lv.achieved_request_rate == pytest.approx(50, rel=0.1)
    assert lv.max_concurrency is None


def test_open_loop_cap_limits_in_flight() -> None:
    load = OpenLoop(rate=math.inf, max_concurrency=3)
    lv = level(load, {"itl_s": 0.005}, num_prompts=15)
    assert lv.completed == 15
    assert lv.max_concurrent_requests == 3
    assert lv.request_rate is None


def test_duration_mode_sends_until_the_deadline() -> None:
    lv = level(ClosedLoop(concurrency=2), {"itl_s": 0.01}, duration_s=0.5)
    assert lv.completed >= 8
    assert 0.45 < lv.duration < 1.0
    assert lv.num_prompts == 0


def test_http_errors_and_malformed_lines_are_counted_not_fatal() -> None:
    lv = level(
        ClosedLoop(concurrency=3),
        {"faults": ("http-500=3", "malformed-every=2")},
        num_prompts=30,
    )
    assert lv.completed == 20 and lv.failed == 10
    assert lv.errors == {"http_500": 10}
    assert lv.malformed_sse_events == 20 * 2  # tokens 2 and 4 of each 5-token response
    assert not lv.partial
    assert any("malformed" in w for w in lv.warnings)


def test_no_usage_falls_back_to_counting_events() -> None:
    lv = level(ClosedLoop(concurrency=2), {"faults": ("no-usage",)}, num_prompts=4)
    assert lv.output_tokens_source == "approx" and lv.total_output_tokens == 20
    assert lv.input_tokens_source == "approx"
    assert any("no usage" in w for w in lv.warnings)


def test_a_server_ignoring_ignore_eos_is_reported() -> None:
    lv = level(ClosedLoop(concurrency=2), {"faults": ("short-by=2",)}, num_prompts=4)
    assert lv.short_output_requests == 4
    assert any("ignore_eos" in w for w in lv.warnings)


def test_goodput_with_slo() -> None:
    lv = level(ClosedLoop(concurrency=1), {"ttft_s": 0.03}, num_prompts=5, slo=SLO(ttft_ms=10))
    assert lv.good_requests == 0 and lv.request_goodput == 0.0
    lv = level(ClosedLoop(concurrency=1), num_prompts=5, slo=SLO(ttft_ms=10_000))
    assert lv.good_requests == 5


def test_run_benchmark_levels_share_one_pool_and_serialize() -> None:
    async def go() -> Any:
        async with fake_server() as (url, stats):
            config = BenchConfig(
                url=url + "/v1/",
                model="m",
                workload=SMALL,
                loads=(ClosedLoop(concurrency=1), ClosedLoop(concurrency=4)),
                num_prompts=12,
                warmup=3,
            )
            result = await run_benchmark(config)
            return result, stats.requests

    result, served = asyncio.run(go())
    assert [lv.label for lv in result.levels] == ["c=1", "c=4"]
    assert served == 3 + 12 + 12
    doc = result.model_dump(mode="json")
    assert doc["levels"][1]["completed"] == 12 and not doc["partial"]
    assert result.model_validate_json(result.model_dump_json()) == result


def test_connection_refused_ends_the_level_partial() -> None:
    async def go() -> LevelResult:
        async with fake_server() as (url, _):
            pass  # closed again: nothing listens on that port now
        config = BenchConfig(url=url, model="m", workload=SMALL, num_prompts=1000)
        return await run_level(config, ClosedLoop(concurrency=4))

    lv = asyncio.run(go())
    assert lv.partial and lv.partial_reason is not None
    assert "unreachable" in lv.partial_reason
    assert lv.completed == 0 and set(lv.errors) <= {"connection_refused", "aborted"}
    assert lv.failed < 1000


def test_open_loop_for_a_duration_at_infinite_rate_is_bounded_by_the_cap() -> None:
    lv = level(OpenLoop(rate=math.inf, max_concurrency=2), {"itl_s": 0.005}, duration_s=0.4)
    assert lv.completed >= 4 and lv.max_concurrent_requests == 2
    assert lv.duration < 1.0


def test_the_heap_is_frozen_while_a_level_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's oldest-generation collection walks the whole heap; in a tuning process that
    paused every stream for 70-250 ms and made a configuration measure 14-30 % slower than
    itself (tests/tune/test_race_sim.py on a loaded machine). While a level is measured the
    heap is frozen (:func:`gc.freeze`), so a collection then walks only what the level made;
    two levels at once collect and freeze once, and the heap is unfrozen when both have
    ended."""
    import gc

    from cleanslate.bench import _runner

    frozen: list[int] = []  # the freeze count, sampled every millisecond of a measured window
    collections: list[int] = []  # explicit collections: one per first level of a batch
    run = _runner._Level.run
    measuring = [0]

    async def timed(self: Any) -> None:
        measuring[0] += 1
        try:
            await run(self)
        finally:
            measuring[0] -= 1

    async def sample() -> None:
        while True:
            if measuring[0]:
                frozen.append(gc.get_freeze_count())
            await asyncio.sleep(0.001)

    async def go() -> list[LevelResult]:
        sampler = asyncio.create_task(sample())
        try:
            async with fake_server(itl_s=0.001) as (url, _stats):
                config = BenchConfig(url=url, model="m", workload=SMALL, num_prompts=60)
                both = await asyncio.gather(run_level(config, ClosedLoop(concurrency=4)),
                                            run_level(config, ClosedLoop(concurrency=6)))
                after = gc.get_freeze_count()
                again = await run_level(config, ClosedLoop(concurrency=2))
                return [*both, again] if after == 0 else []
        finally:
            sampler.cancel()

    monkeypatch.setattr(_runner._Level, "run", timed)
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or collect(*a))
    results = asyncio.run(go())
    assert [r.completed for r in results] == [60, 60, 60], "the heap stayed frozen"
    assert len(frozen) > 20 and min(frozen) > 0, (len(frozen), frozen[:5])
    assert len(collections) == 2  # the pair of levels once, the third level once
    assert gc.get_freeze_count() == 0
