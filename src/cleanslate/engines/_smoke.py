"""The smoke test: a few real requests after ``/health`` says ready (``docs/engines.md``).

A server that answers ``/health`` but cannot complete a request is not ready (the real vLLM
log ``crash_enginedead_first_request.log`` is one: ``/health`` 200, then HTTP 500 on the first
completion). :func:`smoke_test` sends each prompt to ``/v1/completions`` and
``/v1/chat/completions`` (where the engine supports them), once plain and once streaming, and
fails with the first cause it sees:

- ``http_error``: a status >= 400, a connection error, or an ``error`` object in the body or an
  SSE event (the detail has the status and the tail of the body);
- ``timeout``: a request took longer than ``request_timeout`` seconds;
- ``nan``: the output contains NaN/inf markers (a standalone ``nan``, ``NaN``, ``inf``,
  ``Infinity`` word, or a bare ``NaN``/``Infinity`` JSON literal in the response);
- ``empty``: the output is empty or whitespace;
- ``degenerate``: the output is one short unit repeated (``!!!!!!!!``, ``by by by by``) or a
  single word makes up most of it.

The content checks are :mod:`cleanslate.outputs`', which every benchmark level runs too.

The output text is read as the benchmark client reads it (:func:`cleanslate.wire.extract_text`:
completion text, chat content, or a reasoning model's reasoning). Requests are sent one at a
time with sampling on (``temperature`` 0.8 by default): greedy
decoding of random weights repeats at once, while a model emitting NaN collapses to one token
whatever the sampling.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict

import aiohttp

from cleanslate.bench import fresh_session, is_stale, note_retry, request_context, trace_config
from cleanslate.hosts.forward import connector_for
from cleanslate.models import Frozen
from cleanslate.outputs import judge_text
from cleanslate.wire import DONE_PAYLOAD, extract_text

SmokeCause = Literal["nan", "empty", "degenerate", "http_error", "timeout"]
Endpoint = Literal["completions", "chat"]

DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Write one sentence about the ocean.",
)

_NAN_JSON = re.compile(r"[:\[,]\s*-?(?:NaN|Infinity)\s*[,}\]]")


class PromptOutput(Frozen):
    """One request of the smoke test and what came back. ``elapsed_s`` in seconds."""

    endpoint: Endpoint
    stream: bool
    prompt: str
    text: str = ""
    status: int | None = None
    elapsed_s: float = 0.0
    cause: SmokeCause | None = None
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.cause is None


class SmokeResult(Frozen):
    """Outcome of :func:`smoke_test`: ``passed``, else the first ``cause`` with its ``detail``."""

    passed: bool
    cause: SmokeCause | None = None
    detail: str | None = None
    url: str
    model: str
    outputs: tuple[PromptOutput, ...] = ()
    elapsed_s: float = 0.0


def _tail(body: str, n: int = 300) -> str:
    body = body.strip()
    return body if len(body) <= n else "..." + body[-n:]


def _error_in(payload: Any) -> str | None:
    if isinstance(payload, dict) and payload.get("error"):
        error = payload["error"]
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error)
    return None


class ChatMessage(TypedDict):
    """One message of a chat request."""

    role: str
    content: str


class RequestBody(TypedDict):
    """The JSON body of one smoke request: ``prompt`` for completions, ``messages`` for chat."""

    model: str
    max_tokens: int
    temperature: float
    stream: bool
    prompt: NotRequired[str]
    messages: NotRequired[list[ChatMessage]]


class PromptFields(TypedDict):
    """What every :class:`PromptOutput` of one request says of the request."""

    endpoint: Endpoint
    stream: bool
    prompt: str


def _body(
    endpoint: Endpoint, model: str, prompt: str, stream: bool, max_tokens: int, temperature: float
) -> RequestBody:
    body: RequestBody = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": stream,
    }
    if endpoint == "completions":
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    return body


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    endpoint: Endpoint,
    prompt: str,
    stream: bool,
    *,
    max_tokens: int,
    temperature: float,
    timeout: float,
) -> PromptOutput:
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    start = time.monotonic()
    status: int | None = None
    fields: PromptFields = {"endpoint": endpoint, "stream": stream, "prompt": prompt}
    body = _body(endpoint, model, prompt, stream, max_tokens, temperature)
    target = url.rstrip("/") + path

    async def exchange(sess: aiohttp.ClientSession, ctx: dict[str, bool]
                       ) -> tuple[int, str, str, str | None, str | None]:
        """(status, text, raw body, error message, HTTP error body) of one POST."""
        async with sess.post(target, json=body, trace_request_ctx=ctx) as response:
            ctx["responded"] = True
            if response.status >= 400:
                return response.status, "", "", None, await response.text(errors="replace")
            if stream:
                text, raw, error = await _read_stream(response)
                return response.status, text, raw, error, None
            raw = await response.text(errors="replace")
            error = None
            try:
                payload = json.loads(raw)
            except ValueError:
                payload, error = None, f"response is not JSON: {_tail(raw, 120)!r}"
            return (response.status, extract_text([raw.encode()]), raw,
                    error or _error_in(payload), None)

    try:
        async with asyncio.timeout(timeout):
            ctx = request_context()
            try:
                status, text, raw, error, http_body = await exchange(session, ctx)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if not is_stale(exc, ctx):
                    raise
                # A kept-alive connection the server had closed silently (llama-server): once
                # more on a new one (cleanslate.bench._keepalive).
                note_retry(session)
                async with fresh_session(session) as fresh:
                    status, text, raw, error, http_body = await exchange(
                        fresh, request_context())
            if http_body is not None:
                return PromptOutput(
                    **fields,
                    status=status,
                    elapsed_s=time.monotonic() - start,
                    cause="http_error",
                    detail=f"POST {path} -> HTTP {status}: {_tail(http_body)}",
                )
    except TimeoutError:
        return PromptOutput(
            **fields,
            status=status,
            elapsed_s=time.monotonic() - start,
            cause="timeout",
            detail=f"POST {path} took longer than {timeout:g} s",
        )
    except (aiohttp.ClientError, OSError) as exc:
        return PromptOutput(
            **fields,
            status=status,
            elapsed_s=time.monotonic() - start,
            cause="http_error",
            detail=f"POST {path} failed: {type(exc).__name__}: {exc}",
        )
    elapsed = time.monotonic() - start
    if error is not None:
        return PromptOutput(
            **fields,
            text=text,
            status=status,
            elapsed_s=elapsed,
            cause="http_error",
            detail=f"POST {path} -> HTTP {status} with an error: {_tail(error)}",
        )
    verdict = judge_text(text)
    if verdict is None and _NAN_JSON.search(raw):
        verdict = ("nan", "the response contains a NaN/Infinity JSON literal")
    if verdict is not None:
        return PromptOutput(
            **fields,
            text=text,
            status=status,
            elapsed_s=elapsed,
            cause=verdict[0],
            detail=f"POST {path}{' (stream)' if stream else ''}: {verdict[1]}",
        )
    return PromptOutput(**fields, text=text, status=status, elapsed_s=elapsed)


async def _read_stream(response: aiohttp.ClientResponse) -> tuple[str, str, str | None]:
    """Read an SSE stream: (its text, as :func:`cleanslate.wire.extract_text` reads it; the raw
    events; the first error message or ``None``)."""
    payloads: list[bytes] = []
    error: str | None = None

    def take(data: bytes) -> None:
        nonlocal error
        # Bytes that are not UTF-8 are text with replacement characters, not a broken event.
        data = data.decode(errors="replace").encode()
        if not data or data == DONE_PAYLOAD:
            return
        payloads.append(data)
        try:
            payload = json.loads(data)
        except ValueError:
            error = error or f"stream event is not JSON: {data.decode()[:120]!r}"
            return
        error = error or _error_in(payload)

    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                take(line[5:].strip())
    if buffer.strip().startswith(b"data:"):
        take(buffer.strip()[5:].strip())
    if not payloads and error is None:
        error = "the stream ended without any event"
    raw = "\n".join(p.decode(errors="replace") for p in payloads)
    return extract_text(payloads), raw, error


async def smoke_test(
    url: str,
    model: str,
    *,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    completions: bool = True,
    chat: bool = True,
    stream: bool = True,
    max_tokens: int = 16,
    temperature: float = 0.8,
    request_timeout: float = 60.0,
    session: aiohttp.ClientSession | None = None,
) -> SmokeResult:
    """Send the smoke requests to the server at ``url`` (``http://host:port``) and judge them.

    For each prompt and each enabled endpoint: one plain request and, with ``stream``, one
    streaming request. Stops at the first failure (its output is the last in ``outputs``).
    ``request_timeout`` is in seconds per request. Never raises for a server's misbehaviour.
    """
    if not (completions or chat):
        raise ValueError("smoke_test needs at least one of completions, chat")
    if not prompts:
        raise ValueError("smoke_test needs at least one prompt")
    endpoints: list[Endpoint] = []
    if completions:
        endpoints.append("completions")
    if chat:
        endpoints.append("chat")
    modes = (False, True) if stream else (False,)
    start = time.monotonic()
    outputs: list[PromptOutput] = []
    own = session is None
    client = session or aiohttp.ClientSession(connector=connector_for(url),
                                              timeout=aiohttp.ClientTimeout(total=None),
                                              trace_configs=[trace_config()])
    try:
        for endpoint in endpoints:
            for streaming in modes:
                for prompt in prompts:
                    output = await _one(
                        client,
                        url,
                        model,
                        endpoint,
                        prompt,
                        streaming,
                        max_tokens=max_tokens,
                        temperature=temperature,
                        timeout=request_timeout,
                    )
                    outputs.append(output)
                    if not output.ok:
                        return SmokeResult(
                            passed=False,
                            cause=output.cause,
                            detail=output.detail,
                            url=url,
                            model=model,
                            outputs=tuple(outputs),
                            elapsed_s=time.monotonic() - start,
                        )
    finally:
        if own:
            await client.close()
    return SmokeResult(
        passed=True,
        url=url,
        model=model,
        outputs=tuple(outputs),
        elapsed_s=time.monotonic() - start,
    )
