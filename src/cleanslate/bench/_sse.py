"""Server-sent events of an OpenAI-style streaming response, parsed after the stream ends.

The hot path (``_client``) only records, for every network read, ``time.perf_counter()`` and the
bytes; this module turns those into events. An event's timestamp is the time of the read that
delivered its first byte. Events are classified with byte searches, not JSON decoding: an event
carries content when one of ``"text":``, ``"content":``, ``"reasoning_content":`` or
``"reasoning":`` is followed by a non-empty string (:func:`cleanslate.wire.has_content`; the
format is described in :mod:`cleanslate.wire`). Only the event that carries ``"usage":{`` is
JSON-decoded (for the token counts), and every event only when the caller needs the generated
text (no usage and a tokenizer given).

Malformed input is counted, never raised: a line that is not an SSE field (``data:``,
``event:``, ``id:``, ``retry:``, or a ``:`` comment), or a ``data:`` payload that is neither
``[DONE]`` nor a JSON object (``{...}``; bytes-level check), counts as one malformed event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cleanslate.wire import DONE_PAYLOAD, extract_text, has_content

__all__ = ["ParsedStream", "extract_text", "has_content", "parse_stream"]


@dataclass(slots=True)
class ParsedStream:
    """What one streamed response contained."""

    content_times: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    done: bool = False
    malformed: int = 0
    error: str | None = None
    payloads: list[bytes] | None = None


def parse_stream(
    times: list[float], chunks: list[bytes], *, keep_payloads: bool = False
) -> ParsedStream:
    """Events of a response read as ``chunks`` at ``times`` (same length, in order)."""
    out = ParsedStream(payloads=[] if keep_payloads else None)
    content_times = out.content_times
    pending: list[bytes] = []  # the reads of a line not ended yet, joined once it ends
    tail_t = 0.0
    data_parts: list[bytes] = []
    data_t = 0.0
    for t, chunk in zip(times, chunks, strict=True):
        if b"\n" not in chunk:
            if not pending:
                tail_t = t
            pending.append(chunk)
            continue
        if pending:
            pending.append(chunk)
            block = b"".join(pending)
            first_t = tail_t
        else:
            block = chunk
            first_t = t
        lines = block.split(b"\n")
        tail = lines.pop()
        pending = [tail] if tail else []
        line_t = first_t
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data_parts:
                    _event(out, b"\n".join(data_parts), data_t, content_times)
                    data_parts = []
            elif line[:5] == b"data:":
                if not data_parts:
                    data_t = line_t
                data_parts.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not (
                line[:1] == b":"
                or line[:6] == b"event:"
                or line[:3] == b"id:"
                or line[:6] == b"retry:"
            ):
                out.malformed += 1
            line_t = t
        tail_t = t
    tail = b"".join(pending)
    if tail.strip():
        line = tail.rstrip(b"\r")
        if line[:5] == b"data:":
            if not data_parts:
                data_t = tail_t
            data_parts.append(line[6:] if line[5:6] == b" " else line[5:])
        elif not line.startswith((b":", b"event:", b"id:", b"retry:")):
            out.malformed += 1
    if data_parts:
        _event(out, b"\n".join(data_parts), data_t, content_times)
    return out


def _event(out: ParsedStream, payload: bytes, t: float, content_times: list[float]) -> None:
    if payload[:1] == b"{" and payload[-1:] == b"}":
        if has_content(payload):
            content_times.append(t)
            if out.payloads is not None:
                out.payloads.append(payload)
        if b'"usage":{' in payload or b'"usage": {' in payload:
            try:
                usage = json.loads(payload).get("usage")
            except (ValueError, AttributeError):
                out.malformed += 1
                return
            if isinstance(usage, dict):
                out.usage = usage
        elif b'"error"' in payload and out.error is None and not content_times:
            try:
                err = json.loads(payload).get("error")
            except (ValueError, AttributeError):
                err = None
            if err is not None:
                text = str(err.get("message", err) if isinstance(err, dict) else err)
                out.error = "".join(c if c.isprintable() else " " for c in text[:300]).strip()
    elif payload.strip() == DONE_PAYLOAD:
        out.done = True
    else:
        out.malformed += 1
