"""The smoke test against small aiohttp servers that misbehave in each way."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from cleanslate.engines import has_nan_marker, is_degenerate, smoke_test
from cleanslate.testing.fake_openai import fake_openai_server


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_good_server_passes_on_every_endpoint_and_mode() -> None:
    async def go() -> None:
        async with fake_openai_server("ok") as url:
            result = await smoke_test(url, "m", prompts=["a", "b"])
        assert result.passed and result.cause is None
        assert [(o.endpoint, o.stream) for o in result.outputs] == [
            ("completions", False),
            ("completions", False),
            ("completions", True),
            ("completions", True),
            ("chat", False),
            ("chat", False),
            ("chat", True),
            ("chat", True),
        ]
        assert all(o.text.strip() and o.status == 200 for o in result.outputs)

    run(go())


def test_healthy_on_health_but_500_on_a_completion_fails() -> None:
    async def go() -> None:
        async with fake_openai_server("http_500") as url:
            result = await smoke_test(url, "m")
        assert not result.passed
        assert result.cause == "http_error"
        assert result.detail is not None
        assert "HTTP 500" in result.detail and "EngineCore encountered an issue" in result.detail
        assert len(result.outputs) == 1 and result.outputs[0].status == 500

    run(go())


@pytest.mark.parametrize(
    ("behaviour", "cause"),
    [
        ("empty", "empty"),
        ("nan", "nan"),
        ("degenerate", "degenerate"),
        ("hang", "timeout"),
        ("error_body", "http_error"),
    ],
)
def test_each_misbehaviour_has_its_cause(behaviour: str, cause: str) -> None:
    async def go() -> None:
        async with fake_openai_server(behaviour) as url:  # type: ignore[arg-type]
            result = await smoke_test(url, "m", request_timeout=1.0)
        assert not result.passed
        assert result.cause == cause
        assert result.outputs[-1].cause == cause

    run(go())


def test_streaming_only_failures_are_caught() -> None:
    """A server whose plain answers are fine but whose streams are empty."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": " a fine answer here"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": ""}]}\n\ndata: [DONE]\n\n')
        return response

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            result = await smoke_test(f"http://127.0.0.1:{port}", "m", chat=False)
        finally:
            await runner.cleanup()
        assert result.cause == "empty"
        assert result.outputs[-1].stream is True
        assert "(stream)" in (result.detail or "")

    run(go())


def test_nothing_listening_is_an_http_error() -> None:
    async def go() -> None:
        async with fake_openai_server("ok") as url:
            pass  # the server is gone once the block ends
        result = await smoke_test(url, "m")
        assert result.cause == "http_error"
        assert "failed" in (result.detail or "")

    run(go())


def test_chat_can_be_left_out() -> None:
    async def go() -> None:
        async with fake_openai_server("ok") as url:
            result = await smoke_test(url, "m", chat=False, stream=False)
        assert {o.endpoint for o in result.outputs} == {"completions"}
        assert not any(o.stream for o in result.outputs)

    run(go())
    with pytest.raises(ValueError):
        run(smoke_test("http://127.0.0.1:1", "m", chat=False, completions=False))


@pytest.mark.parametrize(
    "text",
    [
        "!!!!!!!!!!!!!!!!",
        " by by by by by by by by",
        "ab ab ab ab ab ab a",
        "754 549 549 549 549 549 549",
        "the the the the the the the cat",
    ],
)
def test_degenerate_outputs(text: str) -> None:
    assert is_degenerate(text)


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris.",
        "hello world",
        "!!!",
        " tokenU hostUich t 149(asumber 149asU 514845 39",  # a random-weight model, sampled
        "one two three four five six seven",
    ],
)
def test_healthy_outputs_are_not_degenerate(text: str) -> None:
    assert not is_degenerate(text)


def test_nan_markers() -> None:
    assert has_nan_marker(" NaN NaN")
    assert has_nan_marker("loss is nan")
    assert has_nan_marker("value -inf")
    assert not has_nan_marker("banana infinite nano")
