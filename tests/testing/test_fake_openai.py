"""The one fake OpenAI server: its fault vocabulary, and each fault as a client sees it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from typing import Any

import aiohttp
import pytest

from cleanslate import wire
from cleanslate.bench._sse import parse_stream
from cleanslate.testing.fake_openai import (
    FAULT_NAMES,
    FakeOptions,
    Faults,
    fake_openai_server,
    parse_faults,
    start_fake_server,
)


def test_fault_vocabulary() -> None:
    assert parse_faults([]) == Faults() == parse_faults(["ok"])
    assert parse_faults(["http_500"]) == Faults(http_500=1)
    faults = parse_faults(
        ["http-500=3", "no_usage", "reject-fields=ignore_eos, min_tokens", "short-by=2"]
    )
    assert faults == Faults(
        http_500=3, no_usage=True, reject_fields=("ignore_eos", "min_tokens"), short_by=2
    )
    assert parse_faults(faults.active()) == faults
    hostile = parse_faults(["hostile=deep-nesting"])
    assert hostile == Faults(hostile="deep-nesting") == parse_faults(hostile.active())
    assert set(FAULT_NAMES) >= {f.replace("_", "-") for f in Faults.__dataclass_fields__}
    for bad, message in [
        ("bogus", "known faults: ok, http-500"),
        ("nan=1", "takes no argument"),
        ("short-by", "needs a count"),
        ("malformed-every=0", "at least 1"),
        ("http-500=x", "not an integer"),
        ("reject-fields=", "needs field names"),
        ("hostile", "needs a kind: hostile=KIND, one of deep-nesting"),
        ("hostile=bogus", "needs a kind"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_faults([bad])


async def post(
    session: aiohttp.ClientSession, url: str, chat: bool, stream: bool, **body: Any
) -> tuple[int, bytes]:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    payload: dict[str, Any] = {"model": "m", "stream": stream, **body}
    if chat:
        payload["messages"] = [{"role": "user", "content": "a b c"}]
    else:
        payload["prompt"] = "a b c"
    async with session.post(url + path, json=payload) as resp:
        return resp.status, await resp.read()


def stream_text(data: bytes) -> tuple[str, dict[str, Any] | None, str | None]:
    out = parse_stream([0.0], [data], keep_payloads=True)
    assert out.done and out.malformed == 0
    return wire.extract_text(out.payloads or []), out.usage, out.error


def test_ok_answers_whole_and_streamed_with_usage() -> None:
    async def go() -> None:
        server = await start_fake_server(FakeOptions())
        try:
            async with aiohttp.ClientSession() as session:
                for chat in (False, True):
                    status, data = await post(session, server.url, chat, False, max_tokens=5)
                    assert status == 200
                    body = json.loads(data)
                    choice = body["choices"][0]
                    text = choice["message"]["content"] if chat else choice["text"]
                    assert text == " the river runs past a"
                    assert body["usage"] == wire.usage(3, 5)
                    status, data = await post(
                        session, server.url, chat, True, max_tokens=20,
                        stream_options={"include_usage": True},
                    )  # fmt: skip
                    text, usage, error = stream_text(data)
                    assert status == 200 and error is None
                    assert len(text.split()) == 20 and len(set(text.split())) == 15
                    assert usage == wire.usage(3, 20)
                    # no usage chunk unless asked for; 16 tokens when none are named
                    _, data = await post(session, server.url, chat, True)
                    text, usage, _ = stream_text(data)
                    assert usage is None and len(text.split()) == 16
                async with session.get(server.url + "/v1/models") as resp:
                    assert (await resp.json())["data"][0]["id"] == "fake"
                async with session.get(server.url + "/nothing") as resp:
                    assert resp.status == 404
            stats = server.stats.as_dict()
            assert stats["requests"] == 6 and stats["tokens"] == 2 * (5 + 20 + 16)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("fault", "text"),
    [("nan", " NaN" * 4), ("degenerate", "!!!!"), ("empty", "")],
)
def test_content_faults(fault: str, text: str) -> None:
    async def go() -> None:
        async with fake_openai_server(fault) as url, aiohttp.ClientSession() as session:
            for chat in (False, True):
                _, data = await post(session, url, chat, True, max_tokens=4)
                assert stream_text(data)[0] == text
                _, data = await post(session, url, chat, False, max_tokens=4)
                choice = json.loads(data)["choices"][0]
                assert (choice["message"]["content"] if chat else choice["text"]) == text

    asyncio.run(go())


def test_error_faults_and_health_stays_ok() -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            async with fake_openai_server("http-500") as url:
                status, data = await post(session, url, False, True)
                assert status == 500
                assert json.loads(data)["message"].startswith("EngineCore encountered an issue")
                async with session.get(url + "/health") as resp:
                    assert resp.status == 200
            async with fake_openai_server("error-body") as url:
                status, data = await post(session, url, True, True)
                assert status == 200 and stream_text(data)[2] == "model crashed"
                status, data = await post(session, url, True, False)
                assert status == 200 and json.loads(data)["error"]["message"] == "model crashed"
            async with fake_openai_server("reject-fields=ignore_eos") as url:
                status, data = await post(session, url, False, True, ignore_eos=True)
                assert status == 422
                assert json.loads(data) == {"detail": "Unexpected fields: ignore_eos"}
                assert (await post(session, url, False, True))[0] == 200

    asyncio.run(go())


def test_hang_never_answers_and_closing_drops_the_request() -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            async with fake_openai_server("hang") as url:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await post(session, url, False, True)
                task = asyncio.ensure_future(post(session, url, False, False))
                await asyncio.sleep(0.2)
            # the server closed: the hanging request ends with a connection error, not never
            with pytest.raises(aiohttp.ClientError):
                await asyncio.wait_for(task, 5)

    asyncio.run(go())


def test_stream_shape_faults() -> None:
    async def go() -> None:
        faults = ("short-by=2", "malformed-every=2", "no-usage")
        async with aiohttp.ClientSession() as session, fake_openai_server(*faults) as url:
            _, data = await post(
                session, url, False, True, max_tokens=5, stream_options={"include_usage": True}
            )
            out = parse_stream([0.0], [data])
            assert len(out.content_times) == 3 and out.usage is None
            assert out.malformed == 1 and out.done

    asyncio.run(go())


def test_as_a_process_with_workers(procs: Any) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "cleanslate.testing.fake_openai", "--port", "0", "--fault", "x"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown fault 'x'" in bad.stderr
    proc = procs.start(
        [sys.executable, "-m", "cleanslate.testing.fake_openai", "--port", "0",
         "--workers", "2", "--fault", "no-usage"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    line = proc.stdout.readline().decode()
    assert line.startswith("READY "), line
    url = f"http://127.0.0.1:{int(line.split()[1])}"

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(4):
                assert (await post(session, url, True, True, max_tokens=3))[0] == 200

    asyncio.run(go())
    deadline = 50
    while deadline:
        with urllib.request.urlopen(url + "/stats", timeout=5) as resp:
            stats = json.loads(resp.read())
        if stats["tokens"] == 12:
            break
        deadline -= 1
        asyncio.run(asyncio.sleep(0.05))
    assert stats["requests"] == 4 and stats["tokens"] == 12
