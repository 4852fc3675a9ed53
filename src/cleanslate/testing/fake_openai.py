"""The fake OpenAI-compatible server: fast, misbehaving on demand (a test double, not an engine).

One server for every test that needs an OpenAI-compatible endpoint without an engine: the smoke
test and readiness logic (a server healthy on ``/health`` whose completions fail), the benchmark
client's tests (HTTP errors, malformed events, a server that streams forever), and the client's
own capacity measurement (``bench/client_capacity.py``). It writes what :mod:`cleanslate.wire`
describes, like the simulated engine.

Raw asyncio (no framework) so that it costs little CPU per token: every event of a response is
pre-built bytes, written one per event-loop turn (zero delay) or one per ``itl_s``. It serves
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed and whole; ``max_tokens`` /
``max_completion_tokens``, ``stream_options.include_usage``), ``GET /health`` (200 whatever the
faults, like an engine whose worker died after start-up), ``GET /v1/models`` and ``GET /stats``
(the server's own record: requests served, tokens written, mean gap between the token writes of
a response in seconds). A response has ``max_tokens`` tokens (16 when the request names none),
one word each (``usage`` counts them); the text is varied words.

Faults, one vocabulary for the Python API and the command line (``NAME[=ARG]``, ``_`` or ``-``,
as the simulated engine's ``--fault``):

=====================  ============================================================================
``ok``                 no fault
``http-500[=N]``       every Nth request (default: every one) answers HTTP 500 with vLLM's dead
                       EngineCore message (``/health`` stays 200)
``error-body``         HTTP 200 whose body (or first stream event) is an ``error`` object
``empty``              every token's text is empty
``nan``                every token is `` NaN`` (the simulated engine's ``nan``)
``degenerate``         every token is ``!``
``hang``               requests are accepted and never answered (the sim's ``hang-after=0``)
``malformed-every=N``  a line that is not SSE after every Nth event
``no-usage``           never a usage chunk, even when asked for
``short-by=N``         N tokens fewer than asked for (a server that ignores ``ignore_eos``)
``endless``            streams never end
``reject-fields=A,B``  HTTP 422 ``{"detail": "Unexpected fields: A, B"}`` to a request with any of
                       these body fields (as ``transformers serve`` answers ``ignore_eos``)
=====================  ============================================================================

In a test: ``async with fake_openai_server("http_500") as url: ...`` (yields the base URL), or
:func:`start_fake_server` for the server object with its :class:`FakeStats`. As a process:
``python -m cleanslate.testing.fake_openai --port 0 [--itl-ms 10] [--fault endless] [--cpu 0]
[--workers N]`` prints ``READY <port>`` on stdout once listening.
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
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from time import perf_counter
from typing import Any

from cleanslate import wire

FAULT_NAMES = (
    "ok",
    "http-500",
    "error-body",
    "empty",
    "nan",
    "degenerate",
    "hang",
    "malformed-every",
    "no-usage",
    "short-by",
    "endless",
    "reject-fields",
)
#: Faults that take a count, and the count when none is written (``None``: one is required).
_INT_ARG: dict[str, int | None] = {"http-500": 1, "malformed-every": None, "short-by": None}

#: What ``http-500`` answers (vLLM's words once its engine core is dead).
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
MODEL = "fake"
DEFAULT_TOKENS = 16

_SENTENCE = "the river runs past a quiet city where seven blue lights shine over old roads"
_WORDS = tuple(_SENTENCE.split(" "))


@dataclass(frozen=True)
class Faults:
    """The parsed faults (see the module docstring); ``0`` / ``False`` / ``()`` is off."""

    http_500: int = 0
    error_body: bool = False
    empty: bool = False
    nan: bool = False
    degenerate: bool = False
    hang: bool = False
    malformed_every: int = 0
    no_usage: bool = False
    short_by: int = 0
    endless: bool = False
    reject_fields: tuple[str, ...] = ()

    def active(self) -> list[str]:
        """The faults that are on, spelled as :func:`parse_faults` reads them."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if not value:
                continue
            name = f.name.replace("_", "-")
            if value is True:
                out.append(name)
            elif isinstance(value, tuple):
                out.append(f"{name}={','.join(value)}")
            else:
                out.append(f"{name}={value}")
        return out


def parse_faults(specs: Iterable[str]) -> Faults:
    """Parse ``["http-500=3", "no_usage", "reject-fields=ignore_eos,min_tokens"]``.

    Raises ``ValueError`` naming the known faults for an unknown name, a missing or extra
    argument, or a count that is not a positive integer.
    """
    values: dict[str, Any] = {}
    for raw in specs:
        name, eq, arg = raw.strip().partition("=")
        name = name.strip().replace("_", "-").lower()
        arg = arg.strip()
        if name not in FAULT_NAMES:
            raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(FAULT_NAMES)}")
        if name == "ok":
            if eq:
                raise ValueError("fault 'ok' takes no argument")
            continue
        key = name.replace("-", "_")
        if name == "reject-fields":
            names = tuple(f.strip() for f in arg.split(",") if f.strip())
            if not names:
                raise ValueError("fault 'reject-fields' needs field names: reject-fields=A,B")
            values[key] = names
        elif name in _INT_ARG:
            default = _INT_ARG[name]
            if not arg and default is None:
                raise ValueError(f"fault {name!r} needs a count: {name}=N")
            try:
                count = int(arg) if arg else int(default or 0)
            except ValueError:
                raise ValueError(f"fault {name!r}: {arg!r} is not an integer") from None
            if count < 1:
                raise ValueError(f"fault {name!r}: the count must be at least 1")
            values[key] = count
        else:
            if eq:
                raise ValueError(f"fault {name!r} takes no argument")
            values[key] = True
    return Faults(**values)


@dataclass(frozen=True)
class FakeOptions:
    """How the fake answers: its faults and its timing (seconds)."""

    faults: Faults = field(default_factory=Faults)
    #: gap between two tokens of a stream (0: one token per event-loop turn)
    itl_s: float = 0.0
    #: delay before the first token (a whole response: before the response)
    ttft_s: float = 0.0
    #: tokens of a response whose request names no ``max_tokens``
    default_tokens: int = DEFAULT_TOKENS
    model: str = MODEL


@dataclass
class FakeStats:
    """The server's own record. ``gap_sum`` / ``gap_count``: seconds between the token writes
    of a response, summed, and their number."""

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
        """What ``GET /stats`` answers (all workers' figures in multi-process mode)."""
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


# --- bytes on the wire ----------------------------------------------------------------------


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (``Transfer-Encoding: chunked``)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_LAST_CHUNK = b"0\r\n\r\n"
_MALFORMED = _chunk(b"this is not an sse line\n\n")
_STREAM_HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _plain(status: str, body: Any) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        len(data),
        data,
    )


class _Shapes:
    """The pre-built events of one endpoint (completions or chat) under the faults."""

    def __init__(self, opts: FakeOptions, chat: bool) -> None:
        faults = opts.faults
        if faults.empty:
            words: tuple[str, ...] = ("",)
        elif faults.nan:
            words = ("NaN",)
        elif faults.degenerate:
            words = ("!",)
        else:
            words = _WORDS
        self.pieces = tuple(w if faults.degenerate or not w else " " + w for w in words)
        self.rid = "chatcmpl-fake" if chat else "cmpl-fake"
        self.template = wire.ChunkTemplate(self.rid, opts.model, chat=chat, created=0)
        self.texts = tuple(wire.json_string_body(p) for p in self.pieces)
        self.events = tuple(_chunk(self.template.content(t)) for t in self.texts)
        self.role = _chunk(self.template.role()) if chat else b""
        self.chat = chat

    def last(self, index: int, prompt_tokens: int, n: int, *, usage: bool,
             malformed: bool) -> bytes:
        """The last token's event (with its finish reason), a malformed line if asked for, the
        usage chunk if asked for, ``[DONE]`` and the last HTTP chunk."""
        data = _chunk(self.template.content(self.texts[index % len(self.texts)], "length"))
        if malformed:
            data += _MALFORMED
        tail = self.template.usage(prompt_tokens, n) if usage else b""
        return data + _chunk(tail + wire.DONE_EVENT) + _LAST_CHUNK


class _Server:
    """Shared state of one listening socket: options, stats, the open connections."""

    def __init__(self, opts: FakeOptions, stats: FakeStats) -> None:
        self.opts = opts
        self.stats = stats
        self.shapes = {False: _Shapes(opts, False), True: _Shapes(opts, True)}
        self.conns: set[_Conn] = set()


class _Conn(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self.server = server
        self.opts = server.opts
        self.stats = server.stats
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.paused = False
        self.parked: list[_Stream] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.conns.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # as engines' servers do: no Nagle delay on small event writes
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.conns.discard(self)

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
                    length = int(value.strip() or 0)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            parts = head.split("\r\n", 1)[0].split(" ")
            if len(parts) < 2:
                self._write(_plain("400 Bad Request", wire.http_error_body(400, "bad request")))
                continue
            self.handle(parts[0], parts[1].split("?", 1)[0], body)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def handle(self, method: str, path: str, body: bytes) -> None:
        opts = self.opts
        faults = opts.faults
        if method == "GET":
            if path == "/health":
                self._write(_plain("200 OK", b"{}"))
            elif path == "/stats":
                self._write(_plain("200 OK", self.stats.as_dict()))
            elif path == "/v1/models":
                models = wire.models_body([{"id": opts.model, "owned_by": "cleanslate-fake"}])
                self._write(_plain("200 OK", models))
            else:
                self._write(_plain("404 Not Found", wire.http_error_body(404, f"no {path}")))
            return
        if method != "POST":
            self._write(_plain("405 Method Not Allowed", wire.http_error_body(405, method)))
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._write(_plain("404 Not Found", wire.http_error_body(404, f"no {path}")))
            return
        self.stats.requests += 1
        if faults.hang:
            return
        if faults.http_500 and self.stats.requests % faults.http_500 == 0:
            error = wire.http_error_body(500, ENGINE_DEAD_MESSAGE, "InternalServerError")
            self._write(_plain("500 Internal Server Error", error))
            return
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise ValueError("not an object")
            n = int(req.get("max_tokens") or req.get("max_completion_tokens")
                    or opts.default_tokens)
        except (ValueError, TypeError):
            self._write(_plain("400 Bad Request", wire.http_error_body(400, "bad JSON body")))
            return
        unexpected = [f for f in faults.reject_fields if f in req]
        if unexpected:
            detail = {"detail": f"Unexpected fields: {', '.join(unexpected)}"}
            self._write(_plain("422 Unprocessable Entity", detail))
            return
        chat = path.endswith("/chat/completions")
        stream = bool(req.get("stream"))
        if faults.error_body:
            error = wire.error_event_body("model crashed")
            if stream:
                self._write(_STREAM_HEADERS + _chunk(wire.json_event(error) + wire.DONE_EVENT)
                            + _LAST_CHUNK)
            else:
                self._write(_plain("200 OK", error))
            return
        n = max(1, n - faults.short_by)
        prompt_tokens = _prompt_tokens(req, chat)
        if not stream:
            self._whole(chat, n, prompt_tokens)
            return
        options = req.get("stream_options")
        usage = (
            not faults.no_usage
            and isinstance(options, dict)
            and bool(options.get("include_usage"))
        )
        shapes = self.server.shapes[chat]
        self._write(_STREAM_HEADERS + shapes.role)
        stream_ = _Stream(self, shapes, n, prompt_tokens, usage)
        if opts.ttft_s > 0:
            self.loop.call_later(opts.ttft_s, stream_.start)
        else:
            stream_.start()

    def _whole(self, chat: bool, n: int, prompt_tokens: int) -> None:
        shapes = self.server.shapes[chat]
        pieces = shapes.pieces
        text = "".join(pieces[i % len(pieces)] for i in range(n))
        body = wire.whole_response(
            shapes.rid, self.opts.model, chat=chat, created=0, text=text,
            finish_reason="length", prompt_tokens=prompt_tokens, completion_tokens=n,
        )
        self.stats.tokens += n
        data = _plain("200 OK", body)
        delay = self.opts.ttft_s + self.opts.itl_s * (n - 1)
        if delay > 0:
            self.loop.call_later(delay, self._write, data)
        else:
            self._write(data)


def _prompt_tokens(req: dict[str, Any], chat: bool) -> int:
    """Words of the prompt (of the last message for chat); a token-id list's length."""
    if chat:
        messages = req.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else {}
        text = last.get("content") if isinstance(last, dict) else None
    else:
        text = req.get("prompt")
        if isinstance(text, list):
            return len(text)
    return len(str(text or "").split())


class _Stream:
    def __init__(self, conn: _Conn, shapes: _Shapes, n: int, prompt_tokens: int,
                 usage: bool) -> None:
        self.conn = conn
        self.shapes = shapes
        self.events = shapes.events
        self.n = n
        self.sent = 0
        self.prompt_tokens = prompt_tokens
        self.usage = usage
        self.last = 0.0

    def start(self) -> None:
        """Begin streaming: on a timer per token (``itl_s > 0``) or one per loop turn."""
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
        index = self.sent
        self.sent += 1
        stats.tokens += 1
        faults = conn.opts.faults
        every = faults.malformed_every
        malformed = bool(every) and self.sent % every == 0
        if self.sent >= self.n and not faults.endless:
            transport.write(self.shapes.last(index, self.prompt_tokens, self.n,
                                             usage=self.usage, malformed=malformed))
            return False
        data = self.events[index % len(self.events)]
        transport.write(data + _MALFORMED if malformed else data)
        if conn.opts.itl_s > 0:
            conn.loop.call_later(conn.opts.itl_s, self.step)
        return True


# --- running it -------------------------------------------------------------------------------


class FakeServer:
    """A listening fake server in the running event loop (see :func:`start_fake_server`)."""

    def __init__(self, server: asyncio.Server, state: _Server, host: str) -> None:
        self._server = server
        self._state = state
        self.stats = state.stats
        self.port = int(server.sockets[0].getsockname()[1])
        self.url = f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop listening and drop every open connection (hanging requests included)."""
        self._server.close()
        for conn in list(self._state.conns):
            if conn.transport is not None:
                conn.transport.abort()

    async def wait_closed(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def serve_forever(self) -> None:
        await self._server.serve_forever()


async def start_fake_server(
    opts: FakeOptions | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    stats: FakeStats | None = None,
) -> FakeServer:
    """Listen on ``host:port`` (0: a free port) or on ``sock``; the caller keeps the loop
    running and calls :meth:`FakeServer.close`."""
    state = _Server(opts or FakeOptions(), stats or FakeStats())
    loop = asyncio.get_running_loop()
    if sock is not None:
        server = await loop.create_server(lambda: _Conn(state), sock=sock, backlog=1024)
    else:
        server = await loop.create_server(lambda: _Conn(state), host, port, backlog=1024)
    return FakeServer(server, state, host)


@asynccontextmanager
async def fake_openai_server(
    *faults: str,
    host: str = "127.0.0.1",
    port: int = 0,
    itl_s: float = 0.0,
    ttft_s: float = 0.0,
    default_tokens: int = DEFAULT_TOKENS,
) -> AsyncIterator[str]:
    """Run the fake with these faults (``"ok"``: none) and yield ``http://host:port``."""
    opts = FakeOptions(parse_faults(faults), itl_s=itl_s, ttft_s=ttft_s,
                       default_tokens=default_tokens)
    server = await start_fake_server(opts, host=host, port=port)
    try:
        yield server.url
    finally:
        server.close()
        await server.wait_closed()


def main(argv: list[str] | None = None) -> None:
    """``python -m cleanslate.testing.fake_openai``: see the module docstring."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--port", type=int, required=True, help="0: any free port")
    ap.add_argument("--itl-ms", type=float, default=0.0, help="gap between tokens")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    ap.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                    help="tokens of a response whose request names no max_tokens")
    ap.add_argument("--fault", action="append", default=[], metavar="NAME[=ARG]",
                    help=f"repeatable; one of: {', '.join(FAULT_NAMES)}")
    ap.add_argument("--cpu", default=None, help="pin to these CPUs, e.g. 0 or 1-7")
    ap.add_argument(
        "--workers", type=int, default=1, help="server processes sharing the port (Linux)"
    )
    args = ap.parse_args(argv)
    try:
        faults = parse_faults(args.fault)
    except ValueError as exc:
        ap.error(str(exc))
    opts = FakeOptions(
        faults,
        itl_s=args.itl_ms / 1000.0,
        ttft_s=args.ttft_ms / 1000.0,
        default_tokens=args.tokens,
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
        server = await start_fake_server(opts, sock=sock, stats=stats)
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
