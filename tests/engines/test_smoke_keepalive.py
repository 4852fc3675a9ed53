"""The smoke test survives a server that closes kept-alive connections without saying so
(llama.cpp's ``llama-server`` does after every streamed response): before the fix, the second
request of the smoke test was written into the dead socket and failed every time."""

from __future__ import annotations

import asyncio

from cleanslate.engines import smoke_test
from cleanslate.testing.fake_openai import fake_openai_server


def test_smoke_passes_against_a_server_that_closes_after_each_response() -> None:
    async def go() -> tuple[bool, str | None, int]:
        async with fake_openai_server("close-after=20") as url:
            result = await smoke_test(url, "fake", request_timeout=10)
            return result.passed, result.detail, len(result.outputs)

    passed, detail, outputs = asyncio.run(go())
    assert passed, detail
    assert outputs >= 4  # completions and chat, plain and streamed: the connection was reused
