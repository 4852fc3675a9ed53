"""The HTTP side of the fake OpenAI server (:mod:`cleanslate.testing.fake_openai`): raw asyncio.

One :class:`Conn` per connection parses requests (``Content-Length`` bodies, keep-alive) and
answers them; a streamed response is written by a :class:`Stream`, one pre-built event per
event-loop turn or per ``itl_s``, pausing while the client does not read. What is answered is
the public module's business (its faults and options); this module only turns them into bytes.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from time import perf_counter
from typing import TYPE_CHECKING, Any

from cleanslate import wire
from cleanslate.testing._hostile import Pump, hostile_response

if TYPE_CHECKING:
    from cleanslate.testing.fake_openai import FakeOptions, FakeStats

#: What ``http-500`` answers (vLLM's words once its engine core is dead).
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_SENTENCE = "the river runs past a quiet city where seven blue lights shine over old roads"
#: The words of a healthy response, one per token, in turn.
WORDS = tuple(_SENTENCE.split(" "))


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (``Transfer-Encoding: chunked``)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_LAST_CHUNK = b"0\r\n\r\n"
_METRICS_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                 b"Content-Length: %d\r\n\r\n")
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
            words = WORDS
        self.pieces = tuple(w if faults.degenerate or not w else " " + w for w in words)
        self.rid = "chatcmpl-fake" if chat else "cmpl-fake"
        self.template = wire.ChunkTemplate(self.rid, opts.model, chat=chat, created=0)
        self.texts = tuple(wire.json_string_body(p) for p in self.pieces)
        self.events = tuple(_chunk(self.template.content(t)) for t in self.texts)
        self.role = _chunk(self.template.role()) if chat else b""
        self.chat = chat
        self.cached = faults.cached_tokens

    def last(self, index: int, prompt_tokens: int, n: int, *, usage: bool,
             malformed: bool) -> bytes:
        """The last token's event (with its finish reason), a malformed line if asked for, the
        usage chunk if asked for, ``[DONE]`` and the last HTTP chunk."""
        data = _chunk(self.template.content(self.texts[index % len(self.texts)], "length"))
        if malformed:
            data += _MALFORMED
        cached = min(self.cached, prompt_tokens) if self.cached else None
        tail = self.template.usage(prompt_tokens, n, cached) if usage else b""
        return data + _chunk(tail + wire.DONE_EVENT) + _LAST_CHUNK


class ServerState:
    """Shared state of one listening socket: options, stats, the open connections."""

    def __init__(self, opts: FakeOptions, stats: FakeStats) -> None:
        self.opts = opts
        self.stats = stats
        self.shapes = {False: _Shapes(opts, False), True: _Shapes(opts, True)}
        self.conns: set[Conn] = set()
        #: what ``GET /metrics`` answers, in turn (the last one repeats): names of
        #: :data:`~cleanslate.testing.hostile_metrics.METRICS_CASES`; empty: ``opts.metrics``
        self.metrics: list[str] = []
        #: how often each metrics answer was given (a restarting counter answers by it)
        self.metrics_served: Counter[str] = Counter()
        #: every path asked for with GET, counted (a redirect target never asked for was not
        #: followed)
        self.gets: Counter[str] = Counter()

    def answer_metrics(self, conn: Conn, path: str) -> bool:
        """Answer ``GET path`` when it is a metrics path; ``False`` when it is not one."""
        from cleanslate.testing.hostile_metrics import METRICS_CASES, OK_ANSWER, TRAP_PATH

        if path == "/metrics":
            if self.metrics:
                name = self.metrics.pop(0) if len(self.metrics) > 1 else self.metrics[0]
            elif self.opts.metrics is not None:
                conn._write(_METRICS_HEAD % len(self.opts.metrics) + self.opts.metrics)
                return True
            else:
                return False
        elif path in ("/ok/metrics", TRAP_PATH):
            name = "ok"
        else:
            prefix, _, rest = path[1:].partition("/")
            if rest != "metrics" or prefix not in METRICS_CASES:
                return False
            name = prefix
        answer = OK_ANSWER if name == "ok" else METRICS_CASES[name].answer
        nth = self.metrics_served[name]
        self.metrics_served[name] += 1
        Pump(conn, answer(nth)).start()
        return True


class Conn(asyncio.Protocol):
    """One client connection: requests parsed as they arrive, answered in order."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.opts = server.opts
        self.stats = server.stats
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.paused = False
        self.parked: list[Stream | Pump] = []
        self.closing = False

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
        if self.closing:
            return  # closes after its response and answers nothing more (close-after)
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

    def response_done(self) -> None:
        """A completion response ended: with ``close-after``, close this connection a moment
        later without having said so, and answer nothing more on it."""
        delay_ms = self.opts.faults.close_after
        if delay_ms and self.transport is not None:
            self.closing = True
            self.loop.call_later(delay_ms / 1000, self.transport.close)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def handle(self, method: str, path: str, body: bytes) -> None:
        opts = self.opts
        faults = opts.faults
        if method == "GET":
            self.server.gets[path] += 1
            if path.endswith("/metrics") and self.server.answer_metrics(self, path):
                return
            if path == "/health":
                self._write(_plain("200 OK", b"{}"))
            elif path == "/stats":
                self._write(_plain("200 OK", self.stats.as_dict()))
            elif path == "/v1/models":
                entry: dict[str, Any] = {"id": opts.model, "owned_by": "cleanslate-fake"}
                if opts.max_model_len is not None:
                    entry["max_model_len"] = opts.max_model_len
                models = wire.models_body([entry])
                self._write(_plain("200 OK", models))
            else:
                self._write(_plain("404 Not Found", wire.http_error_body(404, f"no {path}")))
            return
        if method != "POST":
            self._write(_plain("405 Method Not Allowed", wire.http_error_body(405, method)))
            return
        # a path prefix is accepted, as behind a proxy (``/<case>/v1/...``: hostile_metrics)
        if not path.endswith(("/v1/completions", "/v1/chat/completions")):
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
        if opts.max_model_len is not None:
            prompt = _prompt_tokens(req, chat)
            if prompt + n > opts.max_model_len:
                self.stats.too_long += 1
                self._write(_plain("400 Bad Request", wire.http_error_body(400, (
                    f"This model's maximum context length is {opts.max_model_len} tokens. "
                    f"However, you requested {prompt + n} tokens ({prompt} in the messages, "
                    f"{n} in the completion)."))))
                return
        stream = bool(req.get("stream"))
        if faults.error_body:
            event = wire.error_event_body("model crashed")
            if stream:
                self._write(_STREAM_HEADERS + _chunk(wire.json_event(event) + wire.DONE_EVENT)
                            + _LAST_CHUNK)
            else:
                self._write(_plain("200 OK", event))
            return
        n = max(1, n - faults.short_by)
        if faults.hostile:
            hostile_response(self, faults.hostile, self.server.shapes[chat].template, n)
            return
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
        stream_ = Stream(self, shapes, n, prompt_tokens, usage)
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
            self.loop.call_later(delay, self._write_done, data)
        else:
            self._write_done(data)

    def _write_done(self, data: bytes) -> None:
        self._write(data)
        self.response_done()


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


class Stream:
    """One streamed response being written, token by token."""

    def __init__(self, conn: Conn, shapes: _Shapes, n: int, prompt_tokens: int,
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
            conn.response_done()
            return False
        data = self.events[index % len(self.events)]
        transport.write(data + _MALFORMED if malformed else data)
        if conn.opts.itl_s > 0:
            conn.loop.call_later(conn.opts.itl_s, self.step)
        return True
