"""The wire format: what the servers write is what the client reads (written, then parsed)."""

from __future__ import annotations

import json

from cleanslate import wire
from cleanslate.bench._sse import parse_stream


def events(data: bytes) -> list[dict[str, object]]:
    out = []
    for block in data.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: "), block
            payload = block[6:]
            out.append({"done": True} if payload == wire.DONE_PAYLOAD else json.loads(payload))
    return out


def test_completion_chunks_round_trip_through_the_client_parser() -> None:
    t = wire.ChunkTemplate("cmpl-1", 'a "model"', chat=False, created=7)
    words = [wire.json_string_body(w) for w in (" one", ' "two"', " tr\u00e9s")]
    body = (
        t.role()
        + b"".join(t.content(w) for w in words[:-1])
        + t.content(words[-1], "length")
        + t.usage(5, 3)
        + wire.DONE_EVENT
    )
    parsed = events(body)
    assert parsed[0] == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": 'a "model"',
        "choices": [{"index": 0, "text": " one", "logprobs": None, "finish_reason": None}],
    }
    assert parsed[2]["choices"] == [
        {"index": 0, "text": " tr\u00e9s", "logprobs": None, "finish_reason": "length"}
    ]
    assert parsed[3]["choices"] == [] and parsed[3]["usage"] == wire.usage(5, 3)
    assert parsed[4] == {"done": True}
    out = parse_stream([1.0, 2.0], [body[:40], body[40:]], keep_payloads=True)
    assert out.done and out.malformed == 0 and out.error is None
    assert out.content_times == [1.0, 2.0, 2.0]
    assert out.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert out.payloads is not None
    assert wire.extract_text(out.payloads) == ' one "two" tr\u00e9s'


def test_chat_chunks_start_with_a_role_chunk_that_is_not_content() -> None:
    t = wire.ChunkTemplate("chatcmpl-1", "m", chat=True, created=0)
    body = t.role() + t.content(b" hi", "stop") + wire.DONE_EVENT
    parsed = events(body)
    assert parsed[0]["choices"][0]["delta"] == {  # type: ignore[index]
        "role": "assistant",
        "content": "",
    }
    assert parsed[1]["object"] == "chat.completion.chunk"
    assert parsed[1]["choices"][0]["delta"] == {"content": " hi"}  # type: ignore[index]
    assert parsed[1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    out = parse_stream([1.0], [body])
    assert out.content_times == [1.0] and out.done


def test_whole_responses_errors_and_models() -> None:
    chat = wire.whole_response(
        "c", "m", chat=True, created=1, text="hi", finish_reason="length",
        prompt_tokens=2, completion_tokens=1,
    )  # fmt: skip
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert chat["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    plain = wire.whole_response(
        "c", "m", chat=False, created=1, text="hi", finish_reason=None,
        prompt_tokens=2, completion_tokens=1,
    )  # fmt: skip
    assert plain["object"] == "text_completion" and plain["choices"][0]["text"] == "hi"
    assert wire.http_error_body(404, "no such model", "NotFoundError") == {
        "object": "error", "message": "no such model", "type": "NotFoundError", "param": None,
        "code": 404,
    }  # fmt: skip
    # An error event is what the client reports as the server's error.
    body = wire.json_event(wire.error_event_body("model crashed")) + wire.DONE_EVENT
    out = parse_stream([1.0], [body])
    assert out.error == "model crashed" and out.content_times == []
    assert wire.models_body([{"id": "m"}]) == {
        "object": "list",
        "data": [{"object": "model", "id": "m"}],
    }
