"""The OpenAI-compatible wire format that cleanslate's servers write and its client reads.

One module for the bytes on the wire, shared by the simulated engine (:mod:`cleanslate.sim`),
the fake server of the tests (:mod:`cleanslate.testing.fake_openai`) and the benchmark client
(:mod:`cleanslate.bench`), so the three cannot drift apart. Standard library only (the fake and
the sim's launcher import it at start-up).

Writing:

- **SSE framing**: a streamed response is ``text/event-stream``; each event is one line
  ``data: <JSON object>`` and a blank line (:func:`event`); the stream ends with
  :data:`DONE_EVENT` (``data: [DONE]``).
- **Chunks**: :class:`ChunkTemplate` holds the pre-encoded fragments of one response's chunks
  (``id``, ``object``, ``created``, ``model``), so a content chunk costs one concatenation:
  ``text_completion`` chunks carry ``choices[0].text``; ``chat.completion.chunk`` chunks carry
  ``choices[0].delta.content`` and a first chunk with ``delta.role = "assistant"`` and empty
  content (as vLLM and SGLang send). The last content chunk carries the ``finish_reason``
  (``length`` or ``stop``), the others ``null``.
- **Usage**: with ``stream_options.include_usage`` the chunk after the last content chunk has
  ``"choices": []`` and ``usage`` (:func:`usage`: ``prompt_tokens``, ``completion_tokens``,
  ``total_tokens``); a whole (non-streamed) response always carries ``usage``.
- **Errors**: an HTTP error (status >= 400) has the body :func:`http_error_body` (SGLang's and
  vLLM's ``{"object": "error", "message", "type", "param", "code"}``); an error inside a
  200 response or a stream is :func:`error_event_body` (``{"error": {"message", "type",
  "param", "code"}}``, OpenAI's shape, which clients look for under the ``error`` key).

Reading (what the client needs of an event, by byte search, without decoding JSON):
:func:`has_content` and :func:`extract_text`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NotRequired, TypedDict

#: The last event of every stream.
DONE_EVENT = b"data: [DONE]\n\n"
#: The payload of :data:`DONE_EVENT`.
DONE_PAYLOAD = b"[DONE]"
#: The media type of a streamed response.
EVENT_STREAM = "text/event-stream"

COMPLETION_OBJECT = "text_completion"
CHAT_CHUNK_OBJECT = "chat.completion.chunk"
CHAT_OBJECT = "chat.completion"

#: Keys whose non-empty string value makes an event a content event (text, chat content,
#: reasoning text of reasoning models).
CONTENT_KEYS: tuple[bytes, ...] = (
    b'"text":',
    b'"content":',
    b'"reasoning_content":',
    b'"reasoning":',
)
_QUOTE = 34  # ord('"')
_WHITESPACE = b" \t\r\n"


def event(payload: bytes) -> bytes:
    """One SSE event carrying ``payload`` (a JSON document, or ``[DONE]``) on one line."""
    return b"data: " + payload + b"\n\n"


def json_event(obj: Any) -> bytes:
    """One SSE event carrying ``obj`` as compact JSON."""
    return event(json.dumps(obj, separators=(",", ":")).encode())


def json_string_body(text: str) -> bytes:
    """``text`` as the inside of a JSON string (escaped, without the quotes), as UTF-8: what
    :meth:`ChunkTemplate.content` splices between its fragments."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


class CachedTokens(TypedDict):
    cached_tokens: int


class Usage(TypedDict):
    """The ``usage`` object of a response."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: NotRequired[CachedTokens]


class ErrorBody(TypedDict):
    """An HTTP error response's body, as SGLang and vLLM write it."""

    object: str
    message: str
    type: str
    param: None
    code: int


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: None
    code: int


class ErrorEvent(TypedDict):
    """An error inside a 200 response or a stream."""

    error: ErrorDetail


def usage(prompt_tokens: int, completion_tokens: int,
          cached_tokens: int | None = None) -> Usage:
    """The ``usage`` object: token counts of one request; ``cached_tokens`` (prompt tokens
    served from a prefix cache) goes in ``prompt_tokens_details`` as OpenAI and vLLM put it."""
    out: Usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


class ChunkTemplate:
    """Pre-encoded fragments of the streamed chunks of one response.

    ``rid`` is the response ``id``, ``created`` epoch seconds, ``chat`` picks the chat chunk
    shape. The methods return whole SSE events (``data: ...`` and the blank line).
    """

    __slots__ = ("_close", "_head", "_open", "chat")

    def __init__(self, rid: str, model: str, *, chat: bool, created: int) -> None:
        self.chat = chat
        obj = CHAT_CHUNK_OBJECT if chat else COMPLETION_OBJECT
        self._head = (
            f'data: {{"id":{json.dumps(rid)},"object":"{obj}","created":{int(created)},'
            f'"model":{json.dumps(model)},'
        ).encode()
        if chat:
            self._open = self._head + b'"choices":[{"index":0,"delta":{"content":"'
            self._close = b'"},"logprobs":null,"finish_reason":'
        else:
            self._open = self._head + b'"choices":[{"index":0,"text":"'
            self._close = b'","logprobs":null,"finish_reason":'

    def role(self) -> bytes:
        """The first chunk of a chat stream: the assistant role, empty content (not content);
        empty for a completion stream."""
        if not self.chat:
            return b""
        return self._head + (
            b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def content(self, text: bytes, finish_reason: str | None = None) -> bytes:
        """A content chunk; ``text`` is the inside of a JSON string (see
        :func:`json_string_body`), ``finish_reason`` is set on the last one."""
        end = b"null}]}\n\n" if finish_reason is None else f'"{finish_reason}"}}]}}\n\n'.encode()
        return self._open + text + self._close + end

    def usage(self, prompt_tokens: int, completion_tokens: int,
              cached_tokens: int | None = None) -> bytes:
        """The usage chunk (``"choices": []``) sent after the last content chunk."""
        counts = json.dumps(usage(prompt_tokens, completion_tokens, cached_tokens),
                            separators=(",", ":"))
        return self._head + b'"choices":[],"usage":' + counts.encode() + b"}\n\n"


def whole_response(
    rid: str,
    model: str,
    *,
    chat: bool,
    created: int,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """The JSON body of a non-streamed completion or chat completion."""
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = finish_reason
    return {
        "id": rid,
        "object": CHAT_OBJECT if chat else COMPLETION_OBJECT,
        "created": int(created),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }


def models_body(entries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The body of ``GET /v1/models``; each entry needs an ``id`` (``object`` is added)."""
    return {"object": "list", "data": [{"object": "model", **e} for e in entries]}


def http_error_body(status: int, message: str, kind: str = "BadRequestError") -> ErrorBody:
    """The JSON body of an HTTP error response (status >= 400)."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def error_event_body(message: str, kind: str = "InternalServerError", code: int = 500
                     ) -> ErrorEvent:
    """An error reported inside a 200 response or as a stream event."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def has_content(payload: bytes) -> bool:
    """True when a JSON event payload holds a non-empty text / content string (a key of
    :data:`CONTENT_KEYS` followed by a string that is not ``""``)."""
    for key in CONTENT_KEYS:
        i = payload.find(key)
        while i != -1:
            j = i + len(key)
            n = len(payload)
            while j < n and payload[j] in _WHITESPACE:
                j += 1
            if j + 1 < n and payload[j] == _QUOTE and payload[j + 1] != _QUOTE:
                return True
            i = payload.find(key, j)
    return False


def extract_text(payloads: Iterable[bytes]) -> str:
    """The generated text of a stream's content event payloads (completions or chat deltas),
    or of a whole response (its chat ``message``)."""
    parts: list[str] = []
    for payload in payloads:
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            text = choice.get("text")
            if text is None:
                delta = choice.get("delta") or choice.get("message") or {}
                if not isinstance(delta, dict):
                    continue
                text = (
                    delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                )
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)
