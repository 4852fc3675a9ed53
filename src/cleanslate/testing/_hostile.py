"""Hostile streams of the fake OpenAI server: the fault ``hostile=KIND``.

Each kind answers a completion request with a response built to break a client: JSON nested
past Python's recursion limit, bytes that are not UTF-8, a line that never ends, framing that
is not HTTP, a stream that never ends. A kind is a generator of what to do, in order: bytes to
write (at most :data:`PIECE` at a time, one write per event-loop turn and only while the client
reads, so a 100 MiB answer never sits in the server's memory), a number of seconds to wait, or
:data:`CLOSE` (drop the connection) or :data:`RESET` (reset it). A generator that ends has
answered in full; the connection stays open for the next request. :data:`HOSTILE_KINDS` lists
the kinds with what each sends.
"""

from __future__ import annotations

import functools
import socket
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from cleanslate import wire

if TYPE_CHECKING:
    from cleanslate.testing._fake_http import Conn

#: Bytes written per event-loop turn.
PIECE: Final = 64 << 10
#: Depth of the nested JSON of ``deep-nesting`` and ``deep-error`` (Python's recursion limit is
#: 1,000; the C JSON decoder gives up far below this).
DEPTH: Final = 100_000
#: Entries of the ``choices`` list of ``many-choices``.
MANY: Final = 100_000
#: Bytes of ``data-100mib``'s one ``data:`` line.
HUGE_LINE: Final = 100 << 20
#: Bytes a ``gzip-bomb`` response inflates to.
BOMB: Final = 64 << 20


class _Close:
    """Drop the connection here (without the end of the response)."""


CLOSE: Final = _Close()


class _Reset:
    """Reset the connection here (a TCP RST: ``SO_LINGER`` 0, then abort)."""


RESET: Final = _Reset()

Action = bytes | float | _Close | _Reset
Kind = Callable[[wire.ChunkTemplate, int], Iterator[Action]]

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
_CHUNKED = _HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
_LAST = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(*events: bytes) -> Iterator[Action]:
    """A well-framed chunked stream of ``events`` (each a whole SSE event), ``[DONE]`` last."""
    yield _CHUNKED
    for event in events:
        for i in range(0, len(event), PIECE):
            yield _chunk(event[i:i + PIECE])
    yield _chunk(wire.DONE_EVENT) + _LAST


def _words(t: wire.ChunkTemplate, n: int, text: bytes = b" word") -> bytes:
    return b"".join(t.content(text) for _ in range(n))


def _deep(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    nested = b"[" * DEPTH + b"]" * DEPTH
    yield from _sse(_words(t, n), b'data: {"choices":[],"usage":{"completion_tokens":'
                    + nested + b"}}\n\n")


def _deep_error(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    yield from _sse(b'data: {"error":' + b"[" * DEPTH + b"]" * DEPTH + b"}\n\n")


def _invalid_utf8(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    yield from _sse(_words(t, n, b"\xff\xfe\xc3("), t.usage(3, n))


def _nul_bytes(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    yield from _sse(_words(t, n, b"a\x00b"), b"\x00data: \x00\n\n", t.usage(3, n))


def _repeated(payload: bytes) -> Kind:
    def kind(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
        yield from _sse(wire.event(payload) * n)

    return kind


def _usage(prompt: bytes, completion: bytes) -> Kind:
    def kind(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
        yield from _sse(_words(t, n), b'data: {"choices":[],"usage":{"prompt_tokens":' + prompt
                        + b',"completion_tokens":' + completion + b',"total_tokens":'
                        + completion + b"}}\n\n")

    return kind


def _many_choices(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    choices = b'{"index":0,"text":"a"}' + b",{}" * (MANY - 1)
    yield from _sse(b'data: {"choices":[' + choices + b"]}\n\n", t.usage(3, 1))


def _huge_chunk(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    """One HTTP chunk of 8 MiB of well-formed content events."""
    event = t.content(b" word")
    body = event * ((8 << 20) // len(event))
    yield _CHUNKED + b"%x\r\n" % len(body)
    for i in range(0, len(body), PIECE):
        yield body[i:i + PIECE]
    yield b"\r\n" + _LAST


def _long_chunk_line(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    """A chunk-size line of 4 MiB of hex digits that never ends."""
    yield _CHUNKED
    for _ in range((4 << 20) // PIECE):
        yield b"f" * PIECE


def _bad_chunk(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    yield _CHUNKED + b"zz\r\n" + t.content(b" word") + b"\r\n" + _LAST


def _close_mid_event(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    event = t.content(b" word")
    yield _CHUNKED + _chunk(event) + _chunk(event[:len(event) // 2])
    yield 0.01
    yield CLOSE


def _data_100mib(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    """One ``data:`` line of 100 MiB, sent as it is read."""
    yield _CHUNKED + _chunk(b'data: {"choices":[{"index":0,"text":"')
    piece = _chunk(b"a" * PIECE)
    for _ in range(HUGE_LINE // PIECE):
        yield piece
    yield _chunk(b'"}]}\n\n' + wire.DONE_EVENT) + _LAST


def _keepalive_comments(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    """A comment every 10 ms, never an event, never an end."""
    yield _CHUNKED
    while True:
        yield _chunk(b": keep-alive\n\n")
        yield 0.01


def _trickle_line(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    """A content event repeated without a newline, 48 bytes per write, never an end: one
    line that grows until the client stops reading."""
    yield _CHUNKED
    event = t.content(b" word").rstrip(b"\n")
    while True:
        for i in range(0, len(event), 48):
            yield _chunk(event[i:i + 48])
            yield 0.0


def _slow_bytes(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    """Well-formed events, one byte every 20 ms, never an end."""
    yield _CHUNKED
    event = t.content(b" word")
    while True:
        for byte in event:
            yield _chunk(bytes([byte]))
            yield 0.02


def _wrong_content_type(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    body = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
    yield (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
           % (len(body), body))


@functools.cache
def _bomb() -> bytes:
    """:data:`BOMB` bytes of ``data: `` and zeros, gzip-compressed (about 290 KiB)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = b"data: " + b"0" * ((1 << 20) - 6)
    parts = [packer.compress(block) for _ in range(BOMB >> 20)]
    return b"".join(parts) + packer.flush()


def _gzip_bomb(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    body = _bomb()
    yield _HEAD + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
    for i in range(0, len(body), PIECE):
        yield body[i:i + PIECE]


def _bad_status_line(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    yield b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n"


def _header_too_long(t: wire.ChunkTemplate, n: int) -> Iterator[Action]:
    yield b"HTTP/1.1 200 OK\r\nX-Junk: " + b"j" * (1 << 20) + b"\r\n\r\n"


#: Every kind: its name (``hostile=NAME``), what it sends, and its generator.
HOSTILE_KINDS: dict[str, tuple[str, Kind]] = {
    "deep-nesting": ("content, then a usage event nested 100,000 arrays deep", _deep),
    "deep-error": ("an error event nested 100,000 arrays deep", _deep_error),
    "invalid-utf8": ("content events whose text is not UTF-8", _invalid_utf8),
    "nul-bytes": ("content events with NUL bytes, and a line starting with NUL", _nul_bytes),
    "not-json": ("data lines that are not JSON", _repeated(b"not json at all")),
    "json-list": ("data lines that are a JSON list", _repeated(b'[{"text":"a"}]')),
    "json-number": ("data lines that are a JSON number", _repeated(b"42")),
    "negative-usage": ("usage with negative token counts", _usage(b"-7", b"-5")),
    "huge-usage": ("usage with counts of 10^30 and 1e308", _usage(b"1" + b"0" * 30,
                                                                  b"1e308")),
    "many-choices": ("one event with a choices list of 100,000 entries", _many_choices),
    "huge-chunk": ("one HTTP chunk of 8 MiB of events", _huge_chunk),
    "long-chunk-line": ("a chunk-size line of 4 MiB that never ends", _long_chunk_line),
    "bad-chunk": ("a chunk size that is not hexadecimal", _bad_chunk),
    "close-mid-event": ("an event cut in half, then the connection closed",
                        _close_mid_event),
    "data-100mib": ("one data line of 100 MiB", _data_100mib),
    "keepalive-comments": ("a comment every 10 ms, never an event or an end",
                           _keepalive_comments),
    "trickle-line": ("one line without a newline, 48 bytes a write, never an end",
                     _trickle_line),
    "slow-bytes": ("events one byte every 20 ms, never an end", _slow_bytes),
    "wrong-content-type": ("HTTP 200 with an HTML page", _wrong_content_type),
    "gzip-bomb": ("gzip content encoding: 290 KiB inflating to 64 MiB", _gzip_bomb),
    "bad-status-line": ("a status line that is not HTTP", _bad_status_line),
    "header-too-long": ("a header line of 1 MiB", _header_too_long),
}


class Pump:
    """Writes one hostile response on a connection: one action per event-loop turn, only
    while the client reads (parked on the connection otherwise)."""

    def __init__(self, conn: Conn, actions: Iterator[Action]) -> None:
        self.conn = conn
        self.actions = actions

    def start(self) -> None:
        self.conn.loop.call_soon(self.step)

    def resume(self) -> None:
        self.conn.loop.call_soon(self.step)

    def step(self) -> None:
        conn = self.conn
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        if conn.paused:  # the client is not reading: wait for resume_writing
            conn.parked.append(self)
            return
        action = next(self.actions, None)
        if action is None:
            conn.response_done()
        elif isinstance(action, _Close):
            transport.close()
        elif isinstance(action, _Reset):
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        elif isinstance(action, float):
            conn.loop.call_later(action, self.step)
        else:
            transport.write(action)
            conn.loop.call_soon(self.step)


def hostile_response(conn: Conn, kind: str, template: wire.ChunkTemplate, n: int) -> None:
    """Answer a completion request on ``conn`` with the hostile response ``kind``."""
    Pump(conn, HOSTILE_KINDS[kind][1](template, n)).start()
