"""A tiny OpenAI-compatible streaming server for measuring the client itself (not an engine).

Raw asyncio (no framework) so that it costs little CPU per token: every event of a response is
the same pre-built bytes, written one per event-loop turn (zero delay) or one per ``itl_s``.
It serves ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming only),
``GET /health`` and ``GET /stats`` (the server's own record: requests served, tokens written,
mean gap between the token writes of a response, in seconds).

Knobs (constructor or command line) used by the tests and ``bench/client_capacity.py``:
``itl_s`` gap between tokens, ``ttft_s`` delay before the first token, ``usage`` whether to send
a usage event, ``malformed_every`` a junk line every N events, ``fail_every`` answer every Nth
request with HTTP 500, ``short_by`` send this many tokens fewer than ``max_tokens`` (a server that
ignores ``ignore_eos``).

Run: ``python -m cleanslate.bench._fakeserver --port 8123 [--itl-ms 10] [--cpu 0]``; prints
``READY <port>`` on stdout once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any


@dataclass
class FakeOptions:
    itl_s: float = 0.0
    ttft_s: float = 0.0
    usage: bool = True
    malformed_every: int = 0
    fail_every: int = 0
    short_by: int = 0
    default_tokens: int = 16


@dataclass
class FakeStats:
    requests: int = 0
    tokens: int = 0
    gap_sum: float = 0.0
    gap_count: int = 0
    first_token_delays: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "mean_itl_s": self.gap_sum / self.gap_count if self.gap_count else None,
        }


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_COMPLETION_EVENT = _chunk(
    b'data: {"id":"cmpl-fake","object":"text_completion","created":0,"model":"fake",'
    b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}],'
    b'"usage":null}\n\n'
)
_CHAT_EVENT = _chunk(
    b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":"fake",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}],'
    b'"usage":null}\n\n'
)
_CHAT_ROLE = _chunk(
    b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":"fake",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
)
_MALFORMED = _chunk(b"this is not an sse line\n\n")
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
_HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _final(chat: bool, prompt_tokens: int, completion_tokens: int) -> bytes:
    obj: dict[str, Any] = {
        "id": "fake",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 0,
        "model": "fake",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")


def _plain(status: str, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        len(body),
        body,
    )


class _Conn(asyncio.Protocol):
    def __init__(self, opts: FakeOptions, stats: FakeStats) -> None:
        self.opts = opts
        self.stats = stats
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            method, path, _ = head.split("\r\n", 1)[0].split(" ", 2)
            self.handle(method, path, body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        assert self.transport is not None
        if method == "GET":
            if path == "/stats":
                self.transport.write(_plain("200 OK", json.dumps(self.stats.as_dict()).encode()))
            else:
                self.transport.write(_plain("200 OK", b"{}"))
            return
        self.stats.requests += 1
        if self.opts.fail_every and self.stats.requests % self.opts.fail_every == 0:
            self.transport.write(_plain("500 Internal Server Error", b'{"error":"injected"}'))
            return
        try:
            req = json.loads(body)
        except ValueError:
            self.transport.write(_plain("400 Bad Request", b'{"error":"bad json"}'))
            return
        chat = path.endswith("/chat/completions")
        n = int(req.get("max_tokens") or self.opts.default_tokens)
        n = max(1, n - self.opts.short_by)
        text = req.get("prompt") if not chat else (req.get("messages") or [{}])[-1].get("content")
        prompt_tokens = len(str(text or "").split())
        usage = self.opts.usage and bool((req.get("stream_options") or {}).get("include_usage"))
        self.transport.write(_HEADERS + (_CHAT_ROLE if chat else b""))
        stream = _Stream(self, chat, n, prompt_tokens, usage)
        if self.opts.ttft_s > 0:
            self.loop.call_later(self.opts.ttft_s, stream.start)
        else:
            stream.start()


class _Stream:
    def __init__(self, conn: _Conn, chat: bool, n: int, prompt_tokens: int, usage: bool) -> None:
        self.conn = conn
        self.event = _CHAT_EVENT if chat else _COMPLETION_EVENT
        self.chat = chat
        self.n = n
        self.sent = 0
        self.prompt_tokens = prompt_tokens
        self.usage = usage
        self.last = 0.0

    def start(self) -> None:
        """Begin streaming: on a timer per token (``itl_s > 0``) or via the shared ticker."""
        if self.conn.opts.itl_s > 0:
            self.step()
        else:
            self.conn.loop.call_soon(self.spin)

    def spin(self) -> None:
        if self.step():
            self.conn.loop.call_soon(self.spin)

    def step(self) -> bool:
        """Write the next event; False once the stream is finished or its client is gone."""
        conn = self.conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            return False
        if conn.paused:
            return True
        now = perf_counter()
        stats = conn.stats
        if self.sent:
            stats.gap_sum += now - self.last
            stats.gap_count += 1
        self.last = now
        self.sent += 1
        stats.tokens += 1
        every = conn.opts.malformed_every
        if every and self.sent % every == 0:
            transport.write(self.event + _MALFORMED)
        elif self.sent < self.n:
            transport.write(self.event)
        if self.sent >= self.n:
            tail = _final(self.chat, self.prompt_tokens, self.n) if self.usage else b""
            transport.write(self.event + tail + _DONE)
            return False
        if conn.opts.itl_s > 0:
            conn.loop.call_later(conn.opts.itl_s, self.step)
        return True


async def serve(
    port: int, opts: FakeOptions, host: str = "127.0.0.1"
) -> tuple[asyncio.Server, FakeStats]:
    """Start listening (port 0: any free port); the caller keeps the loop running."""
    stats = FakeStats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(opts, stats), host, port, backlog=1024)
    return server, stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--malformed-every", type=int, default=0)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--short-by", type=int, default=0)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    opts = FakeOptions(
        itl_s=args.itl_ms / 1000.0,
        ttft_s=args.ttft_ms / 1000.0,
        usage=not args.no_usage,
        malformed_every=args.malformed_every,
        fail_every=args.fail_every,
        short_by=args.short_by,
    )

    async def run() -> None:
        server, _stats = await serve(args.port, opts)
        port = server.sockets[0].getsockname()[1]
        sys.stdout.write(f"READY {port}\n")
        sys.stdout.flush()
        await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
