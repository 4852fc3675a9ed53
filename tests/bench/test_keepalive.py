"""A server that closes kept-alive connections without saying so (llama.cpp's ``llama-server``)
fails no request: a request that meets a dead reused connection before any response byte is
sent once more on a new one, counted, and the pool stops reusing connections to that server."""

from __future__ import annotations

import asyncio

import aiohttp

from cleanslate.bench import BenchConfig, ClosedLoop, run_level
from cleanslate.bench._workloads import RandomWorkload
from tests.bench.conftest import fake_server

SMALL = RandomWorkload(input_len=8, output_len=4)


async def _plain_pool_failures(url: str, n: int) -> int:
    failures = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            try:
                async with session.post(url + "/v1/completions", json={
                        "model": "m", "prompt": "hi", "max_tokens": 4, "stream": True}) as resp:
                    await resp.read()
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                failures += 1
    return failures


def test_the_fake_reproduces_the_dead_socket_a_plain_pool_writes_into() -> None:
    async def go() -> int:
        async with fake_server("close-after=20") as (url, _stats):
            return await _plain_pool_failures(url, 10)

    assert asyncio.run(go()) >= 3  # a plain keep-alive pool fails about every other request


def test_bench_retries_on_a_new_connection_and_fails_nothing() -> None:
    async def go() -> tuple[int, int, int, list[str]]:
        async with fake_server("close-after=20") as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=SMALL, num_prompts=30)
            one = await run_level(config, ClosedLoop(concurrency=1))
            four = await run_level(config, ClosedLoop(concurrency=4))
            return (one.failed + four.failed, one.connection_retries + four.connection_retries,
                    one.completed + four.completed, [*one.warnings, *four.warnings])

    failed, retries, completed, warnings = asyncio.run(go())
    assert failed == 0 and completed == 60
    assert 1 <= retries <= 8  # once per pool, then no more reuse of that server's connections
    assert any("closed kept-alive connections without saying so" in w for w in warnings)


def test_a_server_that_keeps_connections_needs_no_retry() -> None:
    async def go() -> int:
        async with fake_server() as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=SMALL, num_prompts=20)
            return (await run_level(config, ClosedLoop(concurrency=2))).connection_retries

    assert asyncio.run(go()) == 0


def test_a_drop_on_a_new_connection_is_not_retried() -> None:
    async def go() -> tuple[int, dict[str, int]]:
        async with fake_server("hang") as (url, _stats):
            config = BenchConfig(url=url, model="m", workload=SMALL, num_prompts=2,
                                 request_timeout_s=1.0)
            level = await run_level(config, ClosedLoop(concurrency=2))
            return level.connection_retries, level.errors

    retries, errors = asyncio.run(go())
    assert retries == 0 and sum(errors.values()) == 2
