"""A metrics endpoint that answers badly never breaks the observation (issue 36 item 7).

The fake OpenAI server answers ``/<case>/metrics`` with each hostile answer of
:data:`~cleanslate.testing.hostile_metrics.METRICS_CASES` (the list the level's test
``test_observe_hostile.py`` shares); an observer for the vLLM flavour (or for a bare URL)
scrapes it. Whatever comes back, nothing raises, the reason is printable and bounded, a
redirect is not followed, a large, slow or compressed body is cut off, and bad values are
skipped and counted while the good ones are read. The sampling loop survives a mixture of all
of them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from cleanslate.bench import MetricMap, MetricsObserver, ServerMetrics
from cleanslate.bench._server_metrics import REASON_CHARS
from cleanslate.engines import engine_class, metric_maps
from cleanslate.testing.fake_openai import FakeServer, start_fake_server
from cleanslate.testing.hostile_metrics import METRICS_CASES, MIB, TRAP_PATH

_VLLM = engine_class("vllm").metric_map
assert _VLLM is not None
VLLM: MetricMap = _VLLM
#: seconds one scrape may take in these tests; the slow answers take longer
TIMEOUT_S = 0.3


@asynccontextmanager
async def hostile_server() -> AsyncIterator[FakeServer]:
    server = await start_fake_server()
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()


def test_there_are_thirty_or_more_hostile_cases() -> None:
    assert len(METRICS_CASES) >= 30


@pytest.mark.parametrize("name", list(METRICS_CASES))
def test_a_hostile_answer_never_breaks_the_observation(name: str) -> None:
    case = METRICS_CASES[name]

    async def go() -> tuple[ServerMetrics, dict[str, int]]:
        async with hostile_server() as server:
            observer = MetricsObserver(f"{server.url}/{name}", (VLLM,), timeout_s=TIMEOUT_S,
                                       max_bytes=8 * MIB)
            await observer.start(loop=False)
            await observer.sample()
            observation = await observer.stop()
            gets = server.gets
        assert len(observation.samples) == 3
        return observation.summary, gets

    summary, gets = asyncio.run(asyncio.wait_for(go(), 10))
    # only the case's path was asked for: no redirect followed (to TRAP_PATH or /metrics)
    assert set(gets) == {f"/{name}/metrics"} and TRAP_PATH not in gets, gets
    if case.reason is None:
        assert summary.unreadable is None, summary.unreadable
        assert case.check(summary), summary
        assert (summary.skipped_values > 0) == case.bad_values, summary
    else:
        reason = summary.unreadable
        assert reason is not None and case.reason in reason, reason
        assert reason.isprintable() and len(reason) <= REASON_CHARS
        assert summary.failed_scrapes == 3 and summary.samples == 0
    for stats in (summary.running, summary.waiting, summary.kv_usage):
        assert stats is None or (math.isfinite(stats.mean) and math.isfinite(stats.max))


def test_the_sampling_loop_survives_every_hostile_answer_in_turn() -> None:
    """A bare-URL observer whose endpoint answers each hostile kind in turn, a good answer
    between two of them: the loop keeps sampling, the good scrapes are read."""
    fast = [n for n, case in METRICS_CASES.items()
            if not case.slow and not n.startswith(("50mb", "gzip"))]

    async def go() -> None:
        async with hostile_server() as server:
            server.set_metrics(*[n for name in fast for n in (name, "ok")])
            observer = MetricsObserver(server.url, metric_maps(), interval_s=0.001,
                                       timeout_s=TIMEOUT_S)
            await observer.start()
            while len(observer.samples) < 2 * len(fast) + 1:
                await asyncio.sleep(0.01)
                assert observer._task is not None and not observer._task.done()
            observation = await observer.stop()
        summary = observation.summary
        assert summary.flavour == "vllm" and summary.unreadable is None
        assert summary.samples >= len(fast) and summary.failed_scrapes >= 10
        assert summary.running is not None and summary.running.max >= 2

    asyncio.run(asyncio.wait_for(go(), 20))


def test_a_gzip_bomb_through_a_decompressing_session_is_cut_at_the_cap() -> None:
    """The benchmark's own session inflates gzip itself: the cap counts inflated bytes."""
    import aiohttp

    async def go() -> ServerMetrics:
        async with hostile_server() as server, aiohttp.ClientSession() as session:
            observer = MetricsObserver(f"{server.url}/gzip-bomb", (VLLM,), session=session,
                                       timeout_s=2.0, max_bytes=MIB)
            await observer.start(loop=False)
            return (await observer.stop()).summary

    summary = asyncio.run(asyncio.wait_for(go(), 10))
    assert summary.unreadable == f"body over {MIB} bytes"
