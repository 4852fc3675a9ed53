"""The observers' side-by-side benchmark, short (issue 36 item 7; the figure itself is
``benchmarks/client_capacity.py --observe-side-by-side``, ``benchmarks/RESULTS.md``).

The same level with the observers on (the default) and off, against the fake OpenAI server
whose ``/metrics`` answers the real vLLM 0.32 capture: with them on the observation reads it
(vLLM found from a bare URL, every scrape readable), scrapes never come faster than the
interval, and the level's own figures (requests, tokens) are the same as with them off. No
timing is compared here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import cleanslate.engines  # noqa: F401  (registers the engines' metric names, as bench does)
from cleanslate.bench import (
    BenchConfig,
    BenchResult,
    ClosedLoop,
    ObserveOptions,
    parse_workload,
    run_benchmark,
)
from cleanslate.testing.fake_openai import FakeOptions, FakeServer, start_fake_server

CAPTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "engine-metrics"
           / "vllm-0.32-after.txt")
INTERVAL_S = 0.05


def run(observe: bool) -> tuple[BenchResult, dict[str, int]]:
    async def go() -> tuple[BenchResult, dict[str, int]]:
        server: FakeServer = await start_fake_server(
            FakeOptions(itl_s=0.002, metrics=CAPTURE.read_bytes()))
        try:
            config = BenchConfig(
                url=server.url, model="fake", endpoint="chat",
                workload=parse_workload("random:input_len=32,output_len=16"),
                loads=(ClosedLoop(concurrency=8),), num_prompts=24,
                observe=ObserveOptions(enabled=observe, interval_s=INTERVAL_S))
            return await run_benchmark(config), server.gets
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(asyncio.wait_for(go(), 30))


def test_the_observers_read_a_real_vllm_answer_and_leave_the_level_as_it_is() -> None:
    on, gets_on = run(True)
    off, gets_off = run(False)
    level_on, level_off = on.levels[0], off.levels[0]
    for level in (level_on, level_off):
        assert level.completed == 24 and level.failed == 0 and not level.errors
    assert level_on.total_output_tokens == level_off.total_output_tokens == 24 * 16
    assert level_off.server_metrics is None and "/metrics" not in gets_off
    seen = level_on.server_metrics
    assert seen is not None and seen.unreadable is None and seen.flavour == "vllm"
    assert seen.failed_scrapes == 0 and seen.skipped_values == 0 and seen.samples >= 2
    # the capture's own values: nothing running, 3184 tokens generated before the level
    assert seen.running is not None and seen.running.max == 0
    assert seen.generation_tokens == 0 and seen.counter_resets == 0
    # never faster than the interval: the baseline, one scrape per interval of the level at
    # most, and the final scrape (its config read asks /metrics once more)
    assert gets_on["/metrics"] <= level_on.duration / INTERVAL_S + 4, (gets_on, level_on.duration)


def test_a_real_sized_answer_is_parsed_on_the_loop_and_a_long_one_in_a_thread(
        monkeypatch: Any) -> None:
    """A parse in a worker thread takes the interpreter's lock from the loop that reads the
    streams (the on client measured 0.92-0.95 of the off one): vLLM's 52 KB answer is parsed
    on the loop; one over ``INLINE_PARSE_CHARS``, or whose lines read are over
    ``INLINE_READ_CHARS`` (many ranks, or hostile), in the thread, and all read the same."""
    from cleanslate.bench import MetricsObserver
    from cleanslate.bench._server_metrics import INLINE_PARSE_CHARS, INLINE_READ_CHARS
    from cleanslate.engines import engine_class

    vllm = engine_class("vllm").metric_map
    assert vllm is not None
    threaded: list[int] = []
    to_thread = asyncio.to_thread

    async def spy(function: Any, *args: Any, **kwargs: Any) -> Any:
        threaded.append(len(args[0]))
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    capture = CAPTURE.read_bytes()
    padded = capture + b"# padding\n" * (INLINE_PARSE_CHARS // 10 + 1)

    async def scrape(body: bytes) -> Any:
        server = await start_fake_server(FakeOptions(metrics=body))
        try:
            observer = MetricsObserver(server.url, (vllm,))
            await observer.start(loop=False)
            return (await observer.stop()).summary
        finally:
            server.close()
            await server.wait_closed()

    short = asyncio.run(scrape(capture))
    assert threaded == [] and short.unreadable is None and short.samples == 2
    long = asyncio.run(scrape(padded))
    assert len(threaded) == 2 and min(threaded) > INLINE_PARSE_CHARS, threaded
    assert long.unreadable is None and long.running == short.running
    # within the size, but with more lines read than INLINE_READ_CHARS (a hostile answer of
    # many series): their parse goes to the thread too
    threaded.clear()
    many = "".join(f'vllm:num_requests_waiting{{engine="{i}"}} 1\n'
                   for i in range(INLINE_READ_CHARS // 30)).encode() + capture
    assert len(many) <= INLINE_PARSE_CHARS
    wide = asyncio.run(scrape(many))
    assert len(threaded) == 2 and min(threaded) > INLINE_READ_CHARS, threaded
    assert wide.unreadable is None and wide.running == short.running
