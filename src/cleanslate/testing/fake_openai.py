"""The fake OpenAI-compatible server: fast, misbehaving on demand (a test double, not an engine).

One server for every test that needs an OpenAI-compatible endpoint without an engine: the smoke
test and readiness logic (a server healthy on ``/health`` whose completions fail), the benchmark
client's tests (HTTP errors, malformed events, a server that streams forever), and the client's
own capacity measurement (``benchmarks/client_capacity.py``). It writes what :mod:`cleanslate.wire`
describes, like the simulated engine.

Raw asyncio (no framework) so that it costs little CPU per token: every event of a response is
pre-built bytes, written one per event-loop turn (zero delay) or one per ``itl_s``. It serves
``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed and whole; ``max_tokens`` /
``max_completion_tokens``, ``stream_options.include_usage``), ``GET /health`` (200 whatever the
faults, like an engine whose worker died after start-up), ``GET /v1/models`` (with
``max_model_len`` under ``--max-model-len N``, which answers HTTP 400 to a request whose prompt
words plus ``max_tokens`` exceed N, in vLLM's words) and ``GET /stats``
(the server's own record: requests served, tokens written, mean gap between the token writes of
a response in seconds). A response has ``max_tokens`` tokens (16 when the request names none),
one word each (``usage`` counts them); the text is varied words. ``GET /metrics`` answers 404,
or ``FakeOptions.metrics`` (``--metrics-file``: e.g. a real engine's capture) as Prometheus text,
or the hostile answers of :mod:`cleanslate.testing.hostile_metrics` set by
:meth:`FakeServer.set_metrics`; ``GET /<case>/metrics`` answers that hostile case whatever is
set, and completions are served under any path prefix (``POST /<case>/v1/chat/completions``).

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
``close-after=MS``     MS milliseconds (default 20) after each completion response, the connection
                       is closed without a ``Connection: close`` header, and a request written
                       into it meanwhile is never answered (as ``llama-server`` does)
``cached-tokens=N``    usage reports N of the prompt's tokens (at most all) as served from a
                       prefix cache (``prompt_tokens_details.cached_tokens``)
``hostile=KIND``       a response built to break a client, one of
                       :data:`~cleanslate.testing._hostile.HOSTILE_KINDS` (JSON nested 100,000
                       deep, text that is not UTF-8, NUL bytes, data that is not a JSON object,
                       negative or huge usage, 100,000 choices, a chunk of 8 MiB, a chunk-size
                       line or a ``data:`` line that never ends, broken chunked framing, a close
                       mid-event, keep-alive comments forever, one byte every 20 ms, an HTML
                       page, a gzip bomb, a status or header line that is not HTTP)
=====================  ============================================================================

In a test: ``async with fake_openai_server("http_500") as url: ...`` (yields the base URL), or
:func:`start_fake_server` for the server object with its :class:`FakeStats`; beside a caller
that blocks its thread (a command run in-process), ``with fake_openai_thread("hostile=gzip-bomb")
as server: ...`` runs it in a thread of its own. As a process:
``python -m cleanslate.testing.fake_openai --port 0 [--itl-ms 10] [--fault endless] [--cpu 0]
[--workers N] [--metrics-file PATH] [--max-model-len N]`` prints ``READY <port>`` on stdout once
listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cleanslate.testing._fake_http import ENGINE_DEAD_MESSAGE, Conn, ServerState
from cleanslate.testing._hostile import HOSTILE_KINDS

__all__ = [
    "DEFAULT_TOKENS",
    "ENGINE_DEAD_MESSAGE",
    "FAULT_NAMES",
    "FakeOptions",
    "FakeServer",
    "FakeStats",
    "Faults",
    "fake_openai_server",
    "fake_openai_thread",
    "main",
    "parse_faults",
    "start_fake_server",
]

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
    "close-after",
    "cached-tokens",
    "hostile",
)
#: Faults that take a count, and the count when none is written (``None``: one is required).
_INT_ARG: dict[str, int | None] = {"http-500": 1, "malformed-every": None, "short-by": None,
                                   "close-after": 20, "cached-tokens": None}

MODEL = "fake"
DEFAULT_TOKENS = 16


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
    close_after: int = 0
    cached_tokens: int = 0
    hostile: str = ""

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
        if name == "hostile":
            if arg not in HOSTILE_KINDS:
                raise ValueError(f"fault 'hostile' needs a kind: hostile=KIND, one of "
                                 f"{', '.join(HOSTILE_KINDS)}")
            values[key] = arg
        elif name == "reject-fields":
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
    #: the body ``GET /metrics`` answers as Prometheus text (``None``: 404, unless
    #: :meth:`FakeServer.set_metrics` set hostile answers)
    metrics: bytes | None = None
    #: the context: a request whose prompt (words) plus ``max_tokens`` exceeds it is answered
    #: HTTP 400 (as vLLM does), and ``GET /v1/models`` says it as ``max_model_len``; ``None``:
    #: no context
    max_model_len: int | None = None


@dataclass
class FakeStats:
    """The server's own record. ``gap_sum`` / ``gap_count``: seconds between the token writes
    of a response, summed, and their number."""

    requests: int = 0
    tokens: int = 0
    gap_sum: float = 0.0
    gap_count: int = 0
    #: requests answered HTTP 400 for exceeding ``max_model_len`` (this process's own)
    too_long: int = 0
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


# --- running it -------------------------------------------------------------------------------


class FakeServer:
    """A listening fake server in the running event loop (see :func:`start_fake_server`)."""

    def __init__(self, server: asyncio.Server, state: ServerState, host: str) -> None:
        self._server = server
        self._state = state
        self.stats = state.stats
        self.port = int(server.sockets[0].getsockname()[1])
        self.url = f"http://{host}:{self.port}"

    def set_metrics(self, *names: str) -> None:
        """What ``GET /metrics`` answers from now on: the hostile answers ``names``
        (:data:`~cleanslate.testing.hostile_metrics.METRICS_CASES`, or ``ok``) in turn, the
        last one repeating; none: back to ``FakeOptions.metrics``."""
        from cleanslate.testing.hostile_metrics import METRICS_CASES

        unknown = [n for n in names if n != "ok" and n not in METRICS_CASES]
        if unknown:
            raise ValueError(f"unknown metrics answers: {', '.join(unknown)}")
        self._state.metrics = list(names)

    @property
    def gets(self) -> dict[str, int]:
        """Every path asked for with GET, and how often."""
        return dict(self._state.gets)

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
    state = ServerState(opts or FakeOptions(), stats or FakeStats())
    loop = asyncio.get_running_loop()
    if sock is not None:
        server = await loop.create_server(lambda: Conn(state), sock=sock, backlog=1024)
    else:
        server = await loop.create_server(lambda: Conn(state), host, port, backlog=1024)
    return FakeServer(server, state, host)


@asynccontextmanager
async def fake_openai_server(
    *faults: str,
    host: str = "127.0.0.1",
    port: int = 0,
    itl_s: float = 0.0,
    ttft_s: float = 0.0,
    default_tokens: int = DEFAULT_TOKENS,
    max_model_len: int | None = None,
) -> AsyncIterator[str]:
    """Run the fake with these faults (``"ok"``: none) and yield ``http://host:port``."""
    opts = FakeOptions(parse_faults(faults), itl_s=itl_s, ttft_s=ttft_s,
                       default_tokens=default_tokens, max_model_len=max_model_len)
    server = await start_fake_server(opts, host=host, port=port)
    try:
        yield server.url
    finally:
        server.close()
        await server.wait_closed()


@contextmanager
def fake_openai_thread(*faults: str, host: str = "127.0.0.1", itl_s: float = 0.0,
                       ttft_s: float = 0.0, max_model_len: int | None = None
                       ) -> Iterator[FakeServer]:
    """Run the fake with these faults in a thread of its own (its own event loop), for a
    caller that blocks its thread: a command run in this process (``cleanslate bench`` through
    :func:`cleanslate.cli.main`). Yields the server (``.url``, ``.stats``, read them between
    the caller's steps); stops it, its loop and the thread on exit."""
    opts = FakeOptions(parse_faults(faults), itl_s=itl_s, ttft_s=ttft_s,
                       max_model_len=max_model_len)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-openai", daemon=True)
    thread.start()
    try:
        server = asyncio.run_coroutine_threadsafe(start_fake_server(opts, host=host),
                                                  loop).result(10)
        try:
            yield server
        finally:
            async def stop() -> None:
                server.close()
                await server.wait_closed()

            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


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
    ap.add_argument("--metrics-file", default=None, metavar="PATH",
                    help="answer GET /metrics with this file as Prometheus text")
    ap.add_argument("--cpu", default=None, help="pin to these CPUs, e.g. 0 or 1-7")
    ap.add_argument("--max-model-len", type=int, default=None, metavar="N",
                    help="the context: HTTP 400 to a request of more than N tokens (prompt "
                    "words plus max_tokens), and max_model_len in GET /v1/models")
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
        metrics=Path(args.metrics_file).read_bytes() if args.metrics_file else None,
        max_model_len=args.max_model_len,
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
