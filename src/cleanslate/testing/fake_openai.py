"""A small OpenAI-compatible server that misbehaves on demand, for testing the smoke test.

It is healthy on ``/health`` (200) whatever the behaviour, like a real engine whose worker died
after startup, and answers ``/v1/completions`` and ``/v1/chat/completions`` (plain and SSE) as
``behaviour`` says:

=============  ==============================================================================
``ok``         varied text
``http_500``   HTTP 500 with a JSON error body (vLLM's answer once its EngineCore is dead)
``empty``      an empty string
``nan``        text made of ``NaN`` tokens
``degenerate`` one token repeated (``!!!!!!!!``)
``hang``       accepts the request and never answers
``error_body`` HTTP 200 whose body (or first SSE event) is an ``error`` object
=============  ==============================================================================

Use :func:`fake_openai_server` as an async context manager; it yields the base URL.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from aiohttp import web

Behaviour = Literal["ok", "http_500", "empty", "nan", "degenerate", "hang", "error_body"]
BEHAVIOURS: tuple[Behaviour, ...] = (
    "ok",
    "http_500",
    "empty",
    "nan",
    "degenerate",
    "hang",
    "error_body",
)

_SENTENCE = "the river runs past a quiet city where seven blue lights shine over old roads"
_WORDS = tuple(_SENTENCE.split())


def _text(behaviour: Behaviour, rng: random.Random, n: int) -> list[str]:
    if behaviour == "empty":
        return [""]
    if behaviour == "nan":
        return [" NaN"] * n
    if behaviour == "degenerate":
        return ["!"] * n
    return [" " + rng.choice(_WORDS) for _ in range(n)]


def make_app(behaviour: Behaviour, *, seed: int = 0) -> web.Application:
    """The aiohttp application (exposed so tests can mount it their own way)."""
    rng = random.Random(seed)
    app = web.Application()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def generate(request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        chat = request.path.endswith("/chat/completions")
        if behaviour == "hang":
            await asyncio.sleep(3600)
        if behaviour == "http_500":
            return web.json_response(
                {"error": {"message": "EngineCore encountered an issue", "code": 500}},
                status=500,
            )
        if behaviour == "error_body":
            error = {"error": {"message": "model crashed", "type": "InternalServerError"}}
            if body.get("stream"):
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await response.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
                return response
            return web.json_response(error)
        pieces = _text(behaviour, rng, int(body.get("max_tokens") or 16))

        def choice(piece: str, stream: bool) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": piece}
            key = "delta" if stream else "message"
            return {"index": 0, key: {"role": "assistant", "content": piece}}

        if not body.get("stream"):
            return web.json_response({"object": "x", "choices": [choice("".join(pieces), False)]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            event = {"object": "x", "choices": [choice(piece, True)]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


@asynccontextmanager
async def fake_openai_server(
    behaviour: Behaviour = "ok", *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Run the fake server on ``host:port`` (0: a free port) and yield ``http://host:port``."""
    runner = web.AppRunner(make_app(behaviour), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()
