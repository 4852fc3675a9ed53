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
ignores ``ignore_eos``), ``endless`` never end a stream (a server that streams forever),
``reject_fields`` answer HTTP 422 ``{"detail": "Unexpected fields: ..."}`` to a request that has
any of these body fields (as ``transformers serve`` answers ``ignore_eos``).

Run: ``python -m cleanslate.bench._fakeserver --port 8123 [--itl-ms 10] [--cpu 0]``; prints
``READY <port>`` on stdout once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import socket
import sys
from dataclasses import dataclass
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
    endless: bool = False
    reject_fields: tuple[str, ...] = ()


@dataclass
class FakeStats:
    requests: int = 0
    tokens: int = 0
    gap_sum: float = 0.0
    gap_count: int = 0
    #: multi-process mode: every worker's figures, 4 slots each (see :func:`main`)
    shared: Any = None
    index: int = 0

    def publish(self) -> None:
        if self.shared is not None:
            base = 4 * self.index
            self.shared[base : base + 4] = [
                self.requests,
                self.tokens,
                self.gap_sum,
                self.gap_count,
            ]

    def as_dict(self) -> dict[str, Any]:
        if self.shared is None:
            req, tok, gap_sum, gap_count = self.requests, self.tokens, self.gap_sum, self.gap_count
        else:
            self.publish()
            vals = list(self.shared)
            req, tok, gap_sum, gap_count = (sum(vals[i::4]) for i in range(4))
        return {
            "requests": int(req),
            "tokens": int(tok),
            "mean_itl_s": gap_sum / gap_count if gap_count else None,
            "gap_sum_s": gap_sum,
            "gap_count": int(gap_count),
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
        self.parked: list[_Stream] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # as engines' servers do: no Nagle delay on small event writes
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        parked = list(self.parked)
        self.parked.clear()
        for stream in parked:
            stream.resume()

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
            elif path == "/v1/models":
                models = {"object": "list", "data": [{"id": "fake", "object": "model"}]}
                self.transport.write(_plain("200 OK", json.dumps(models).encode()))
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
        unexpected = [f for f in self.opts.reject_fields if f in req]
        if unexpected:
            detail = {"detail": f"Unexpected fields: {', '.join(unexpected)}"}
            self.transport.write(
                _plain("422 Unprocessable Entity", json.dumps(detail).encode())
            )
            return
        chat = path.endswith("/chat/completions")
        n = int(
            req.get("max_tokens") or req.get("max_completion_tokens") or self.opts.default_tokens
        )
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
        if self.conn.paused:  # the client is not reading: wait for resume_writing
            self.conn.parked.append(self)
        elif self.step():
            self.conn.loop.call_soon(self.spin)

    def resume(self) -> None:
        self.conn.loop.call_soon(self.spin if self.conn.opts.itl_s <= 0 else self.step)

    def step(self) -> bool:
        """Write the next event; False once the stream is finished or its client is gone."""
        conn = self.conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            return False
        if conn.paused:  # the client is not reading: wait for resume_writing
            if conn.opts.itl_s > 0:
                conn.parked.append(self)
            return False
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
        elif self.sent < self.n or conn.opts.endless:
            transport.write(self.event)
        if self.sent >= self.n and not conn.opts.endless:
            tail = _final(self.chat, self.prompt_tokens, self.n) if self.usage else b""
            transport.write(self.event + tail + _DONE)
            return False
        if conn.opts.itl_s > 0:
            conn.loop.call_later(conn.opts.itl_s, self.step)
        return True


async def serve(
    port: int,
    opts: FakeOptions,
    host: str = "127.0.0.1",
    *,
    sock: socket.socket | None = None,
    stats: FakeStats | None = None,
) -> tuple[asyncio.Server, FakeStats]:
    """Start listening (port 0: any free port; or on ``sock``); the caller keeps the loop
    running."""
    stats = stats or FakeStats()
    loop = asyncio.get_running_loop()
    if sock is not None:
        server = await loop.create_server(lambda: _Conn(opts, stats), sock=sock, backlog=1024)
    else:
        server = await loop.create_server(lambda: _Conn(opts, stats), host, port, backlog=1024)
    return server, stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--malformed-every", type=int, default=0)
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--short-by", type=int, default=0)
    ap.add_argument("--endless", action="store_true", help="never end a stream")
    ap.add_argument("--reject-fields", default="",
                    help="answer 422 to requests with these body fields, e.g. ignore_eos")
    ap.add_argument("--cpu", default=None, help="pin to these CPUs, e.g. 0 or 1-7")
    ap.add_argument(
        "--workers", type=int, default=1, help="server processes sharing the port (Linux)"
    )
    args = ap.parse_args(argv)
    opts = FakeOptions(
        itl_s=args.itl_ms / 1000.0,
        ttft_s=args.ttft_ms / 1000.0,
        usage=not args.no_usage,
        malformed_every=args.malformed_every,
        fail_every=args.fail_every,
        short_by=args.short_by,
        endless=args.endless,
        reject_fields=tuple(f for f in args.reject_fields.split(",") if f),
    )
    cpus: list[int] = []
    for part in (args.cpu or "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(1024)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    if args.workers <= 1:
        if cpus:
            os.sched_setaffinity(0, set(cpus))
        _run_worker(sock, opts, FakeStats(), port, announce=True)
        return
    shared = multiprocessing.RawArray("d", 4 * args.workers)
    children: list[int] = []
    for i in range(args.workers):
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            if cpus:
                os.sched_setaffinity(0, {cpus[i % len(cpus)]})
            _run_worker(sock, opts, FakeStats(shared=shared, index=i), port, announce=False)
            os._exit(0)
        children.append(pid)
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()

    def stop(_sig: int, _frame: object) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for pid in children:
        os.waitpid(pid, 0)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (no orphaned workers)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _run_worker(
    sock: socket.socket, opts: FakeOptions, stats: FakeStats, port: int, *, announce: bool
) -> None:
    async def run() -> None:
        server, _ = await serve(port, opts, sock=sock, stats=stats)
        if announce:
            sys.stdout.write(f"READY {port}\n")
            sys.stdout.flush()
        loop = asyncio.get_running_loop()

        def tick() -> None:
            stats.publish()
            loop.call_later(0.02, tick)

        tick()
        await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
