"""SSE parsing: event timestamps, content detection, usage, malformed lines."""

from __future__ import annotations

from cleanslate.bench._sse import extract_text, has_content, parse_stream

EV = b'data: {"choices":[{"index":0,"text":"%s"}]}\n\n'


def ev(text: str) -> bytes:
    return EV % text.encode()


def test_one_event_per_chunk() -> None:
    chunks = [ev("a"), ev("b"), ev("c"), b"data: [DONE]\n\n"]
    out = parse_stream([1.0, 2.0, 3.0, 4.0], chunks)
    assert out.content_times == [1.0, 2.0, 3.0]
    assert out.done and out.malformed == 0


def test_event_split_across_reads_takes_the_time_of_its_first_byte() -> None:
    whole = ev("a") + ev("b")
    cut = len(ev("a")) + 10  # second event starts in the first read, ends in the second
    out = parse_stream([1.0, 2.0], [whole[:cut], whole[cut:]])
    assert out.content_times == [1.0, 1.0]
    # a read that holds only a partial line keeps the first byte's time
    data = ev("x")
    out = parse_stream([5.0, 6.0, 7.0], [data[:3], data[3:9], data[9:]])
    assert out.content_times == [5.0]


def test_several_events_in_one_read_share_its_time() -> None:
    out = parse_stream([1.0], [ev("a") + ev("b") + ev("c")])
    assert out.content_times == [1.0, 1.0, 1.0]


def test_empty_content_role_chunk_and_null_are_not_content() -> None:
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    null = b'data: {"choices":[{"delta":{"content":null}}]}\n\n'
    tok = b'data: {"choices":[{"delta":{"content":" hi"}}]}\n\n'
    out = parse_stream([1.0, 2.0, 3.0], [role, null, tok])
    assert out.content_times == [3.0]


def test_has_content_variants() -> None:
    assert has_content(b'{"text": "x"}')
    assert has_content(b'{"delta":{"reasoning_content":"think"}}')
    assert has_content(b'{"text":"\\"quoted\\""}')
    assert not has_content(b'{"text":""}')
    assert not has_content(b'{"usage":{"completion_tokens":3}}')


def test_usage_event_is_decoded() -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
    out = parse_stream([1.0, 2.0], [ev("a"), usage])
    assert out.usage == {"prompt_tokens": 7, "completion_tokens": 3}
    assert out.content_times == [1.0]


def test_malformed_lines_are_counted_not_fatal() -> None:
    chunks = [
        ev("a"),
        b"garbage line\n\n",
        b"data: {not json\n\n",
        b": keep-alive comment\n\nevent: message\nid: 3\nretry: 10\n\n",
        ev("b"),
        b"data: [DONE]\n\n",
    ]
    out = parse_stream([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], chunks)
    assert out.malformed == 2
    assert out.content_times == [1.0, 5.0]


def test_crlf_and_no_space_after_colon_and_no_final_blank_line() -> None:
    out = parse_stream([1.0, 2.0], [b'data:{"text":"a"}\r\n\r\n', b'data: {"text":"b"}'])
    assert out.content_times == [1.0, 2.0]


def test_multiline_data_event() -> None:
    out = parse_stream([1.0, 2.0], [b'data: {"text":\n', b'data: "a"}\n\n'])
    assert out.content_times == [1.0]
    assert out.malformed == 0


def test_error_event() -> None:
    out = parse_stream([1.0], [b'data: {"error": {"message": "boom", "code": 500}}\n\n'])
    assert out.error == "boom"
    assert out.content_times == []


def test_extract_text_from_completions_and_chat() -> None:
    out = parse_stream([1.0, 2.0], [ev("ab"), ev("cd")], keep_payloads=True)
    assert out.payloads is not None and extract_text(out.payloads) == "abcd"
    chat = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    out = parse_stream([1.0], [chat], keep_payloads=True)
    assert out.payloads is not None and extract_text(out.payloads) == "hi"
