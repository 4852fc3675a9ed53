"""One streaming request over the shared aiohttp session, measured with monotonic clocks.

The read loop does the least it can per network read: take ``time.perf_counter()`` and keep the
bytes. Parsing (``_sse``) happens once the stream has ended. Failures are classified, never
raised: the record's ``error`` is one of ``connection_refused``, ``connection_reset``,
``connection_error``, ``timeout`` (no byte for the read timeout), ``deadline`` (no end within
the request's deadline), ``response_too_large``, ``http_<status>``, ``malformed_sse``,
``protocol_error`` (a response that is not HTTP: status line, header line, chunked framing),
``server_error`` (an error event in the stream), ``empty_response``, ``aborted`` (cancelled when
its level ended early), ``client_error`` (any other exception raised on the request's path,
e.g. a ``RecursionError`` from JSON nested too deep); its ``error_detail`` is the server's
error body or the exception's type and text, as printable text (at most
:data:`DETAIL_CHARS` characters). Every request sent ends with a record: completed, or failed
with one of these classes.

Every request is bounded: it ends within its deadline (:func:`~cleanslate.bench._limits.
request_deadline_s`) and reads at most :func:`~cleanslate.bench._limits.response_byte_cap`
bytes, so a server that streams forever cannot hold a level or the client's memory.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Literal

import aiohttp

from cleanslate.bench import _keepalive as keepalive
from cleanslate.bench._limits import request_deadline_s, response_byte_cap
from cleanslate.bench._sse import extract_text, parse_stream
from cleanslate.bench._tokens import Tokenizer
from cleanslate.bench._workloads import Prompt
from cleanslate.outputs import has_error_finish

#: Errors that say the server may be gone (they trigger a liveness probe).
CONNECTION_ERRORS = frozenset({"connection_refused", "connection_reset", "connection_error"})

#: Characters of an error detail kept (a server's error body, an exception's text).
DETAIL_CHARS = 300
#: Characters of a sampled request's text kept for the level's output checks.
TEXT_CHARS = 2000
#: The most prompt tokens a usage may report (1 Ti tokens; a larger count is not believed). A
#: response's completion tokens are at most its bytes: a token is at least one byte of text.
MAX_USAGE_TOKENS = 1 << 40


def printable(text: str, limit: int = DETAIL_CHARS) -> str:
    """``text`` cut to ``limit`` characters, control characters (terminal escapes, newlines)
    replaced by spaces: safe to print and to keep in JSON."""
    text = text[:limit]
    return "".join(ch if ch.isprintable() else " " for ch in text).strip()


@dataclass(slots=True)
class RequestRecord:
    """The measured life of one request. Times are ``perf_counter()`` seconds."""

    t_send: float
    input_tokens: int
    input_source: str
    requested_output: int
    t_first: float = 0.0
    t_last: float = 0.0
    t_end: float = 0.0
    content_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    output_source: Literal["server", "tokenizer", "approx", "none"] = "none"
    error: str | None = None
    error_detail: str | None = None
    malformed: int = 0
    bytes_received: int = 0
    #: sent again on a new connection: the server had closed the kept-alive one silently
    retried: bool = False
    #: prompt tokens the server says it served from its prefix cache (``None``: not reported)
    cached_tokens: int | None = None
    #: the generated text, kept for the requests a level samples (``None`` for the others)
    text: str | None = None
    #: whether the response ended with ``finish_reason: error`` (sampled requests only)
    error_finish: bool = False
    #: the turn of a conversation this request was (from 1; 0 for a request on its own)
    turn: int = 0
    #: seconds the send was late against its schedule (``None``: a closed loop's request)
    lag_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class RequestBuilder:
    """Builds the URL and JSON body of a request for an endpoint (bytes, serialized once)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        endpoint: Literal["completions", "chat"],
        *,
        ignore_eos: bool,
        extra_body: dict[str, Any],
        api_key: str | None,
        deadline_s: float | None = None,
    ) -> None:
        """``deadline_s``: seconds from send to the last byte of every request (``None``: the
        default derived from each prompt's output length, see ``_limits``)."""
        base = base_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
        self.url = base + path
        self.model = model
        self.endpoint = endpoint
        self.ignore_eos = ignore_eos
        self.extra_body = extra_body
        self.deadline_s = deadline_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def body(self, prompt: Prompt, history: Sequence[tuple[str, str]] | None = None) -> bytes:
        """The request of ``prompt``; with ``history`` (``(role, text)`` messages, the last
        one ``prompt``'s) a conversation's next turn: its ``messages`` on the chat endpoint,
        ``prompt``'s text (the history as one text) on completions."""
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": prompt.output_len,
            "temperature": 0.0,
        }
        if self.endpoint == "completions":
            body["prompt"] = prompt.text
        else:
            body["messages"] = ([{"role": role, "content": text} for role, text in history]
                                if history is not None
                                else [{"role": "user", "content": prompt.text}])
            body["max_completion_tokens"] = prompt.output_len
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = prompt.output_len
        body.update(self.extra_body)
        return json.dumps(body).encode()


def classify(exc: BaseException) -> tuple[str, str]:
    """Map an exception raised by a request to an error type and a short detail."""
    detail = printable(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, asyncio.TimeoutError | TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout", detail
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_err = getattr(exc, "os_error", None)
        if (
            isinstance(os_err, ConnectionRefusedError)
            or getattr(os_err, "errno", None) == errno.ECONNREFUSED
        ):
            return "connection_refused", detail
        return "connection_error", detail
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientPayloadError
        | ConnectionResetError
        | BrokenPipeError,
    ):
        return "connection_reset", detail
    if isinstance(exc, aiohttp.ClientResponseError):
        # The client never raises for a status: this is a response that is not HTTP (its
        # status line, a header line, its chunked framing), from a server that is there.
        return "protocol_error", detail
    if isinstance(exc, aiohttp.ClientOSError):
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            return "connection_reset", detail
        if exc.errno == errno.ECONNREFUSED:
            return "connection_refused", detail
        return "connection_error", detail
    if isinstance(exc, aiohttp.ClientError | OSError):
        return "connection_error", detail
    return "client_error", detail


async def send_request(
    session: aiohttp.ClientSession,
    builder: RequestBuilder,
    prompt: Prompt,
    body: bytes,
    *,
    tokenizer: Tokenizer | None,
    on_chunk: list[int] | None = None,
    keep_text: bool = False,
    text_limit: int = TEXT_CHARS,
) -> RequestRecord:
    """Send one streaming request and measure it. Never raises, except on cancellation and on
    the exceptions that are not errors (``KeyboardInterrupt``, ``SystemExit``): whatever else
    is raised on the request's path, the network's errors and the parsing of what the server
    sent alike, ends in the record's ``error`` (an exception no class names is
    ``client_error``, its type and text the detail).

    ``keep_text``: keep the generated text (and whether it ended with ``finish_reason: error``)
    in the record, for the level's output checks (:mod:`cleanslate.outputs`), its first
    ``text_limit`` characters.

    ``on_chunk``, when given, is a one-element list incremented per network read; the live view
    reads it (cheaper than a callback).
    """
    rec = RequestRecord(perf_counter(), prompt.input_tokens, prompt.input_source, prompt.output_len)
    try:
        await _send(session, builder, prompt, body, rec, tokenizer, on_chunk, keep_text,
                    text_limit)
    except Exception as exc:  # the one place a request ends: counted, never fatal
        if rec.error is None:  # a network error found first stays the request's class
            rec.error, rec.error_detail = classify(exc)
        if not rec.t_end:
            rec.t_end = perf_counter()
    return rec


async def _send(
    session: aiohttp.ClientSession,
    builder: RequestBuilder,
    prompt: Prompt,
    body: bytes,
    rec: RequestRecord,
    tokenizer: Tokenizer | None,
    on_chunk: list[int] | None,
    keep_text: bool,
    text_limit: int,
) -> None:
    """The exchange within the request's deadline (its errors classified into ``rec`` so that
    what arrived is still parsed), then the parsing (:func:`_finish`)."""
    times: list[float] = []
    chunks: list[bytes] = []
    deadline = request_deadline_s(prompt.output_len, builder.deadline_s)
    cap = response_byte_cap(prompt.output_len)
    bound = asyncio.timeout(deadline)
    ctx = keepalive.request_context()
    try:
        async with bound:
            try:
                await _exchange(session, builder, body, ctx, rec, times, chunks, cap, prompt,
                                on_chunk)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not keepalive.is_stale(exc, ctx):
                    raise
                # The server closed a kept-alive connection without saying so: once more, on
                # a new connection (see cleanslate.bench._keepalive).
                keepalive.note_retry(session)
                rec.retried = True
                times.clear()
                chunks.clear()
                async with keepalive.fresh_session(session) as fresh:
                    await _exchange(fresh, builder, body, keepalive.request_context(), rec,
                                    times, chunks, cap, prompt, on_chunk)
    except Exception as exc:  # classified here, so that what arrived is parsed below
        if bound.expired():
            rec.error = "deadline"
            rec.error_detail = f"no end {deadline:g} s after the send (the request deadline)"
        else:
            rec.error, rec.error_detail = classify(exc)
    rec.t_end = perf_counter()
    # Let every other stream woken in this loop turn take its timestamps before this one's
    # parsing and the caller's next send: under a closed loop many streams end together, and
    # their last reads would otherwise wait behind each other's work (inflating ITL and E2E).
    await asyncio.sleep(0)
    _finish(rec, times, chunks, tokenizer, keep_text, text_limit)


async def _exchange(
    session: aiohttp.ClientSession,
    builder: RequestBuilder,
    body: bytes,
    ctx: dict[str, bool],
    rec: RequestRecord,
    times: list[float],
    chunks: list[bytes],
    cap: int,
    prompt: Prompt,
    on_chunk: list[int] | None,
) -> None:
    """One POST and its stream, read into ``times`` / ``chunks`` (errors go to ``rec`` or
    propagate for :func:`send_request` to classify)."""
    async with session.post(builder.url, data=body, headers=builder.headers,
                            trace_request_ctx=ctx) as resp:
        ctx["responded"] = True
        await _read_response(resp, rec, times, chunks, cap, prompt, on_chunk)


async def _read_response(
    resp: aiohttp.ClientResponse,
    rec: RequestRecord,
    times: list[float],
    chunks: list[bytes],
    cap: int,
    prompt: Prompt,
    on_chunk: list[int] | None,
) -> None:
    if resp.status != 200:
        text = await resp.content.read(2048)
        rec.error = f"http_{resp.status}"
        rec.error_detail = printable(text.decode(errors="replace"))
        return
    read = resp.content.readany
    t_append = times.append
    c_append = chunks.append
    size = 0
    while True:
        data = await read()
        if not data:
            break
        t_append(perf_counter())
        c_append(data)
        if on_chunk is not None:
            on_chunk[0] += 1
        size += len(data)
        if size > cap:
            rec.error = "response_too_large"
            rec.error_detail = f"more than {cap:,} bytes for {prompt.output_len} output tokens"
            break


def _finish(
    rec: RequestRecord, times: list[float], chunks: list[bytes], tokenizer: Tokenizer | None,
    keep_text: bool = False, text_limit: int = TEXT_CHARS,
) -> None:
    rec.bytes_received = sum(len(c) for c in chunks)
    parsed = parse_stream(times, chunks, keep_payloads=tokenizer is not None or keep_text)
    if keep_text:
        rec.text = extract_text(parsed.payloads or [])[:text_limit]
        rec.error_finish = has_error_finish(b"".join(chunks))
    rec.malformed = parsed.malformed
    rec.content_times = parsed.content_times
    if parsed.content_times:
        rec.t_first = parsed.content_times[0]
        rec.t_last = parsed.content_times[-1]
    if rec.error is not None:
        return
    if parsed.error is not None:
        rec.error, rec.error_detail = "server_error", parsed.error
        return
    if not parsed.content_times:
        rec.error = "malformed_sse" if parsed.malformed else "empty_response"
        return
    usage = parsed.usage
    completion = _count(usage.get("completion_tokens"), rec.bytes_received) if usage else None
    if usage and "completion_tokens" in usage and completion is None:
        rec.malformed += 1  # a count no response of these bytes can hold: not the server's
    if completion is not None and usage is not None:
        rec.output_tokens, rec.output_source = completion, "server"
        prompt_tokens = _count(usage.get("prompt_tokens"), MAX_USAGE_TOKENS)
        if prompt_tokens is not None:
            rec.input_tokens, rec.input_source = prompt_tokens, "server"
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens"), prompt_tokens or MAX_USAGE_TOKENS
                        ) if isinstance(details, dict) else None
        if cached is not None:
            rec.cached_tokens = cached
    elif tokenizer is not None and parsed.payloads is not None:
        rec.output_tokens = tokenizer.count(extract_text(parsed.payloads))
        rec.output_source = "tokenizer"
    else:
        rec.output_tokens, rec.output_source = len(parsed.content_times), "approx"


def _count(value: object, most: int) -> int | None:
    """A token count of a server's usage, when it is one: an integer (not a bool) from 0 to
    ``most``; ``None`` otherwise (negative, huge, a float, a string)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most:
        return value
    return None


def aborted_record(prompt: Prompt, t_send: float) -> RequestRecord:
    """The record of a request cancelled because its level was ended early."""
    rec = RequestRecord(t_send, prompt.input_tokens, prompt.input_source, prompt.output_len)
    rec.t_end = perf_counter()
    rec.error = "aborted"
    return rec


def failed_record(prompt: Prompt, t_send: float, exc: Exception) -> RequestRecord:
    """The record of a request whose sending raised ``exc`` (classified as
    :func:`send_request` classifies what it meets)."""
    rec = RequestRecord(t_send, prompt.input_tokens, prompt.input_source, prompt.output_len)
    rec.t_end = perf_counter()
    rec.error, rec.error_detail = classify(exc)
    return rec
