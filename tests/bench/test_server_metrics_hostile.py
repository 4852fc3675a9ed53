"""A metrics endpoint that answers badly never breaks the observation (issue 36 item 7).

One small aiohttp server on 127.0.0.1 answers ``/<case>/metrics`` with each hostile answer of
:data:`CASES`; an observer for the vLLM flavour (or for a bare URL) scrapes it. Whatever comes
back, nothing raises, the reason is printable and bounded, a redirect is not followed, a large,
slow or compressed body is cut off, and bad values are skipped and counted while the good ones
are read. The sampling loop survives a mixture of all of them.
"""

from __future__ import annotations

import asyncio
import gzip
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from aiohttp import web

from cleanslate.bench import MetricsObserver, ServerMetrics
from cleanslate.bench._server_metrics import REASON_CHARS
from cleanslate.engines import engine_class, metric_maps
from tests._kit import served

VLLM = engine_class("vllm").metric_map
assert VLLM is not None
GOOD = ('vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_waiting{engine="0"} 6\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
        'vllm:generation_tokens_total{engine="0"} 100\n')
MIB = 1024 * 1024
#: seconds one scrape may take in these tests; the slow answers take longer
TIMEOUT_S = 0.3

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def text(body: str | bytes, status: int = 200, ctype: str | None = "text/plain",
         **headers: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        raw = body.encode() if isinstance(body, str) else body
        h = dict(headers)
        if ctype is not None:
            h["Content-Type"] = ctype
        return web.Response(status=status, body=raw, headers=h)
    return handle


def streamed(chunk: bytes, count: int, *, delay_s: float = 0.0,
             length: int | None = None) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        if length is not None:
            resp.content_length = length
        await resp.prepare(request)
        for _ in range(count):
            await resp.write(chunk)
            if delay_s:
                await asyncio.sleep(delay_s)
        return resp
    return handle


def slow_headers() -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(text=GOOD)
    return handle


def cut_short() -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        resp.content_length = 10_000
        await resp.prepare(request)
        await resp.write(GOOD.encode())
        assert request.transport is not None
        request.transport.close()
        return resp
    return handle


def resetting() -> Handler:
    """A counter that restarts mid-level: 100, 200, 5, 50, ..."""
    values = iter([100, 200, 5, 50, 60, 70, 80, 90])

    async def handle(request: web.Request) -> web.StreamResponse:
        v = next(values, 90)
        return web.Response(text=f'vllm:generation_tokens_total{{engine="0"}} {v}\n'
                                 f'vllm:num_requests_running{{engine="0"}} 1\n')
    return handle


def gzip_bomb() -> Handler:
    bomb = gzip.compress(b"0" * (64 * MIB), compresslevel=9)

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=bomb, headers={"Content-Type": "text/plain",
                                                "Content-Encoding": "gzip"})
    return handle


@dataclass(frozen=True)
class Case:
    handler: Handler
    #: a text the unreadable reason contains, or None: the observation is readable
    reason: str | None
    #: checks on a readable summary
    check: Callable[[ServerMetrics], bool] = lambda s: True


def running_is(n: float) -> Callable[[ServerMetrics], bool]:
    return lambda s: s.running is not None and s.running.max == n


many_ranks = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(10_000))
ansi = '\x1b[31m\x1b]0;owned\x07'

CASES: dict[str, Case] = {
    "garbage": Case(text("hello \x00 world {{{ ###\n"), "none of the metric names"),
    "http-404": Case(text("no", status=404), "HTTP 404"),
    "http-500": Case(text("boom", status=500), "HTTP 500"),
    "http-204": Case(text(b"", status=204, ctype=None), "HTTP 204"),
    "html": Case(text("<html><body>hi</body></html>", ctype="text/html"), "content-type"),
    "html-as-text": Case(text("<html>vllm:num_requests_running</html>\n"),
                         "none of the metric names"),
    "html-name-first": Case(text("vllm:num_requests_running<html></html>\n"),
                            "not Prometheus text"),
    "json-as-text": Case(text('{"vllm:num_requests_running": 3}'), "none of the metric names"),
    "wrong-type-json": Case(text(GOOD, ctype="application/json"), "content-type"),
    "wrong-type-binary": Case(text(GOOD, ctype="application/octet-stream"), "content-type"),
    "empty-body": Case(text(""), "none of the metric names"),
    "other-names-only": Case(text("python_gc_objects_collected_total 3\nup 1\n"),
                             "none of the metric names"),
    "not-utf8": Case(text(b"vllm:num_requests_running 1\n\xff\xfe\xfa\n"), "not UTF-8"),
    "50mb-with-length": Case(streamed(b"#" * MIB, 50, length=50 * MIB), "body over"),
    "50mb-chunked": Case(streamed(b"x" * MIB, 50), "body over"),
    "slow-headers": Case(slow_headers(), "no answer within"),
    "slow-body": Case(streamed(b"vllm:num_requests_running 1\n", 100, delay_s=0.05),
                      "no answer within"),
    "cut-short": Case(cut_short(), "Error"),
    "redirect-elsewhere": Case(text("", status=302, Location="http://169.254.169.254/metrics"),
                               "not followed"),
    "redirect-same-host": Case(text("", status=301, Location="/ok/metrics"), "not followed"),
    "gzip-bomb": Case(gzip_bomb(), "compressed body"),
    "nan-value": Case(text(GOOD + 'vllm:num_requests_waiting{engine="1"} NaN\n'), None,
                      lambda s: s.skipped_values >= 1 and s.waiting is not None
                      and s.waiting.max == 6),
    "inf-value": Case(text(GOOD.replace("} 2\n", "} +Inf\n", 1)), None,
                      lambda s: s.running is None and s.skipped_values >= 1),
    "minus-inf": Case(text(GOOD.replace("} 0.5\n", "} -Inf\n")), None,
                      lambda s: s.kv_usage is None and s.skipped_values >= 1),
    "negative-counter": Case(text(GOOD.replace("} 100\n", "} -100\n")), None,
                             lambda s: s.generation_tokens is None and s.skipped_values >= 1),
    "kv-over-one": Case(text(GOOD.replace("} 0.5\n", "} 75\n")), None,
                        lambda s: s.kv_usage is None and s.skipped_values >= 1),
    "huge-value": Case(text(GOOD.replace("} 2\n", "} 1e308\n", 1)), None,
                       lambda s: s.running is None and s.skipped_values >= 1),
    "duplicate-series": Case(text(GOOD + 'vllm:num_requests_running{engine="0"} 99\n'), None,
                             lambda s: running_is(2)(s) and s.skipped_values >= 1),
    "ansi-label": Case(text(f'vllm:num_requests_running{{engine="{ansi}"}} 3\n'), None,
                       lambda s: running_is(3)(s) and all(
                           k.isprintable() for k in s.per_rank["running"])),
    "1mb-label": Case(text(f'vllm:num_requests_running{{engine="{"a" * MIB}"}} 4\n'), None,
                      lambda s: running_is(4)(s) and all(
                          len(k) <= 80 for k in s.per_rank["running"])),
    "1mb-name": Case(text("vllm:num_requests_running" + "z" * MIB + " 1\n" + GOOD), None,
                     running_is(2)),
    "many-series": Case(text(many_ranks), None,
                        lambda s: running_is(64)(s) and s.skipped_values >= 9_000),
    "broken-quote": Case(text('vllm:num_requests_running{engine="0} 1\n'),
                         "not Prometheus text"),
    "bad-number": Case(text('vllm:num_requests_running{engine="0"} 0x1F\n'),
                       "not Prometheus text"),
    "counter-reset": Case(resetting(), None,
                          lambda s: s.counter_resets == 1 and s.generation_tokens == 100 + 5
                          and running_is(1)(s)),
    "openmetrics": Case(text(GOOD + "# EOF\n", ctype="application/openmetrics-text"), None,
                        running_is(2)),
    "crlf": Case(text(GOOD.replace("\n", "\r\n")), None, lambda s: True),
}


@asynccontextmanager
async def hostile_server(extra: dict[str, Handler] | None = None) -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in (extra or {}).items():
        app.router.add_get(path, handler)
    for name, case in CASES.items():
        app.router.add_get(f"/{name}/metrics", case.handler)
    app.router.add_get("/ok/metrics", text(GOOD))
    async with served(app, handler_cancellation=True, shutdown_timeout=0.1) as url:
        yield url


def test_there_are_thirty_or_more_hostile_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_answer_never_breaks_the_observation(name: str) -> None:
    case = CASES[name]

    async def go() -> ServerMetrics:
        async with hostile_server() as url:
            observer = MetricsObserver(f"{url}/{name}", (VLLM,), timeout_s=TIMEOUT_S,
                                       max_bytes=8 * MIB)
            await observer.start(loop=False)
            await observer.sample()
            observation = await observer.stop()
        assert len(observation.samples) == 3
        return observation.summary

    summary = asyncio.run(asyncio.wait_for(go(), 10))
    if case.reason is None:
        assert summary.unreadable is None, summary.unreadable
        assert case.check(summary), summary
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
    fast = [n for n in CASES if not n.startswith(("slow", "50mb", "gzip"))]
    order = iter([n for name in fast for n in (name, "ok")])
    good = text(GOOD)

    async def rotating(request: web.Request) -> web.StreamResponse:
        name = next(order, "ok")
        return await (good if name == "ok" else CASES[name].handler)(request)

    async def go() -> None:
        async with hostile_server({"/rotating/metrics": rotating}) as url:
            observer = MetricsObserver(f"{url}/rotating", metric_maps(), interval_s=0.001,
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
        async with hostile_server() as url, aiohttp.ClientSession() as session:
            observer = MetricsObserver(f"{url}/gzip-bomb", (VLLM,), session=session,
                                       timeout_s=2.0, max_bytes=MIB)
            await observer.start(loop=False)
            return (await observer.stop()).summary

    summary = asyncio.run(asyncio.wait_for(go(), 10))
    assert summary.unreadable == f"body over {MIB} bytes"
