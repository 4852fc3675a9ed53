"""Hostile answers of a Prometheus metrics endpoint, served by the fake OpenAI server.

One list, :data:`METRICS_CASES`, shared by the observer's tests (one scrape at a time) and the
level's tests (a whole benchmark level watched by its observers): each case is a raw HTTP
answer to ``GET .../metrics`` built to break a scraper (an error status, a redirect, HTML, a
body of 50 MB, a gzip bomb, an answer that never comes or never ends, a connection reset,
text that is not Prometheus, NaN, infinities, negative counters, a counter that restarts,
duplicated series, escape sequences and megabyte labels), with what the observer must make of
it: the words its unreadable reason contains, or a readable summary whose bad values were
skipped and counted.

The fake server (:mod:`cleanslate.testing.fake_openai`) answers ``GET /<case>/metrics`` with
case ``<case>`` (and ``POST /<case>/v1/...`` as its plain completions, so a benchmark pointed at
``http://host:port/<case>`` meets that case's metrics), and ``GET /metrics`` with the answers
set by :meth:`~cleanslate.testing.fake_openai.FakeServer.set_metrics`, in turn. A case is a
generator of actions for :class:`cleanslate.testing._hostile.Pump` (bytes, seconds to wait,
close, reset), so a 50 MB body is written as it is read and never held whole.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from cleanslate.testing._hostile import CLOSE, PIECE, RESET, Action, _bomb

if TYPE_CHECKING:
    from cleanslate.bench import ServerMetrics

#: A well-formed vLLM answer (new names): 2 running, 6 waiting, KV 0.5, 100 tokens generated.
GOOD: Final = ('vllm:num_requests_running{engine="0"} 2\n'
               'vllm:num_requests_waiting{engine="0"} 6\n'
               'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
               'vllm:generation_tokens_total{engine="0"} 100\n')
MIB: Final = 1024 * 1024
#: Seconds the slow cases wait before (or between) what they send: longer than any scrape
#: timeout a test sets, shorter than a test's own deadline.
SLOW_S: Final = 5.0
#: Where the ``redirect-trap`` case points: the fake server records every GET, so a test can
#: show that this path was never asked for (the redirect was not followed).
TRAP_PATH: Final = "/redirect-target/metrics"

#: Makes one answer; the argument is how many times this case was asked for before on this
#: server (a counter that restarts answers differently each time).
Answer = Callable[[int], Iterator[Action]]

_STATUS = {200: "OK", 204: "No Content", 301: "Moved Permanently", 302: "Found",
           307: "Temporary Redirect", 404: "Not Found", 500: "Internal Server Error"}


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_STATUS.get(status, 'Unknown')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _pieces(data: bytes) -> Iterator[Action]:
    for i in range(0, len(data), PIECE):
        yield data[i:i + PIECE]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def text(body: str | bytes, status: int = 200, ctype: str | None = "text/plain",
         **headers: str) -> Answer:
    """A whole answer with a ``Content-Length`` (none for 204)."""
    raw = body.encode() if isinstance(body, str) else body
    head: dict[str, str] = {}
    if ctype is not None:
        head["Content-Type"] = ctype
    head.update({name.replace("_", "-"): value for name, value in headers.items()})
    if status != 204:
        head["Content-Length"] = str(len(raw))
    else:
        raw = b""

    def answer(nth: int) -> Iterator[Action]:
        yield _head(status, head)
        yield from _pieces(raw)
    return answer


def streamed(piece: bytes, count: int, *, delay_s: float = 0.0,
             length: int | None = None) -> Answer:
    """``piece`` written ``count`` times (``delay_s`` apart): with a ``Content-Length`` of
    ``length``, else chunked."""
    def answer(nth: int) -> Iterator[Action]:
        if length is not None:
            yield _head(200, {"Content-Type": "text/plain", "Content-Length": str(length)})
        else:
            yield _head(200, {"Content-Type": "text/plain", "Transfer-Encoding": "chunked"})
        one = piece if length is not None else _chunk(piece)
        for _ in range(count):
            yield from _pieces(one)
            if delay_s:
                yield delay_s
        if length is None:
            yield b"0\r\n\r\n"
    return answer


def _slow_headers(nth: int) -> Iterator[Action]:
    yield SLOW_S
    yield from text(GOOD)(nth)


def _chunked_forever(nth: int) -> Iterator[Action]:
    """A comment line every 10 ms, never an end."""
    yield _head(200, {"Content-Type": "text/plain", "Transfer-Encoding": "chunked"})
    while True:
        yield _chunk(b"# still here\n")
        yield 0.01


def _cut_short(nth: int) -> Iterator[Action]:
    yield _head(200, {"Content-Type": "text/plain", "Content-Length": "10000"}) + GOOD.encode()
    yield 0.01
    yield CLOSE


def _close_at_once(nth: int) -> Iterator[Action]:
    yield CLOSE


def _reset(nth: int) -> Iterator[Action]:
    yield RESET


def _length_short(nth: int) -> Iterator[Action]:
    """A ``Content-Length`` of 10 and the whole text after it, at once."""
    yield _head(200, {"Content-Type": "text/plain", "Content-Length": "10"}) + GOOD.encode()


def _length_short_late(nth: int) -> Iterator[Action]:
    """A ``Content-Length`` of 10, and the rest of the text 50 ms later: on a connection back
    in a pool by then, it would be read as the answer to whatever request took it next."""
    data = GOOD.encode()
    yield _head(200, {"Content-Type": "text/plain", "Content-Length": "10"}) + data[:10]
    yield 0.05
    yield b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nfake" + data[10:]


def _resetting(nth: int) -> Iterator[Action]:
    """A counter that restarts mid-level: 100, 200, 5, 50, ... (then 90 for ever)."""
    values = (100, 200, 5, 50, 60, 70, 80, 90)
    v = values[nth] if nth < len(values) else values[-1]
    yield from text(f'vllm:generation_tokens_total{{engine="0"}} {v}\n'
                    f'vllm:num_requests_running{{engine="0"}} 1\n')(nth)


def _gzip_bomb(nth: int) -> Iterator[Action]:
    body = _bomb()
    yield _head(200, {"Content-Type": "text/plain", "Content-Encoding": "gzip",
                      "Content-Length": str(len(body))})
    yield from _pieces(body)


def _gzip_small(nth: int) -> Iterator[Action]:
    """A well-formed answer, gzip-compressed although the scraper asked for ``identity``."""
    body = gzip.compress(GOOD.encode())
    yield _head(200, {"Content-Type": "text/plain", "Content-Encoding": "gzip",
                      "Content-Length": str(len(body))}) + body


@dataclass(frozen=True)
class MetricsCase:
    """One hostile answer and what an observer must make of it.

    ``reason``: words the unreadable reason contains (``None``: the observation is readable).
    ``bad_values``: readable, with values skipped and counted (``skipped_values`` > 0).
    ``check``: what a readable summary of one observation of exactly a baseline, one sample and
    a final scrape shows (the observer's test; a level's scrape count varies). ``slow``: the
    answer outlasts any scrape timeout (a test bounds it with a short one). ``inflated``: the
    reason (``None``: readable) where the scraping session inflates compressed bodies itself,
    as the benchmark's pool does (``"same"``: as ``reason``).
    """

    answer: Answer
    reason: str | None
    bad_values: bool = False
    check: Callable[[ServerMetrics], bool] = lambda s: True
    slow: bool = False
    inflated: str | None = "same"

    def reason_for(self, *, inflating: bool) -> str | None:
        """The reason expected of a session that inflates compressed bodies, or not."""
        return self.inflated if inflating and self.inflated != "same" else self.reason


def _running_is(n: float) -> Callable[[ServerMetrics], bool]:
    return lambda s: s.running is not None and s.running.max == n


_MANY_RANKS = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(10_000))
_ANSI = "\x1b[31m\x1b]0;owned\x07"
_BIDI = "\u202eevil\u200b\u2066"

#: Every hostile answer by name (``GET /<name>/metrics`` on the fake server).
METRICS_CASES: dict[str, MetricsCase] = {
    "garbage": MetricsCase(text("hello \x00 world {{{ ###\n"), "none of the metric names"),
    "http-404": MetricsCase(text("no", status=404), "HTTP 404"),
    "http-500": MetricsCase(text("boom", status=500), "HTTP 500"),
    "http-204": MetricsCase(text(b"", status=204, ctype=None), "HTTP 204"),
    "html": MetricsCase(text("<html><body>hi</body></html>", ctype="text/html"),
                        "content-type"),
    "html-as-text": MetricsCase(text("<html>vllm:num_requests_running</html>\n"),
                                "none of the metric names"),
    "html-name-first": MetricsCase(text("vllm:num_requests_running<html></html>\n"),
                                   "not Prometheus text"),
    "json-as-text": MetricsCase(text('{"vllm:num_requests_running": 3}'),
                                "none of the metric names"),
    "wrong-type-json": MetricsCase(text(GOOD, ctype="application/json"), "content-type"),
    "wrong-type-binary": MetricsCase(text(GOOD, ctype="application/octet-stream"),
                                     "content-type"),
    "binary-body": MetricsCase(text(bytes(range(256)) * 64), "not UTF-8"),
    "empty-body": MetricsCase(text(""), "none of the metric names"),
    "help-only": MetricsCase(text("# HELP vllm:num_requests_running running\n"
                                  "# TYPE vllm:num_requests_running gauge\n"),
                             "none of the metric names"),
    "other-names-only": MetricsCase(text("python_gc_objects_collected_total 3\nup 1\n"),
                                    "none of the metric names"),
    "not-utf8": MetricsCase(text(b"vllm:num_requests_running 1\n\xff\xfe\xfa\n"), "not UTF-8"),
    "50mb-with-length": MetricsCase(streamed(b"#" * MIB, 50, length=50 * MIB), "body over"),
    "50mb-chunked": MetricsCase(streamed(b"x" * MIB, 50), "body over"),
    "slow-headers": MetricsCase(_slow_headers, "no answer within", slow=True),
    "slow-body": MetricsCase(streamed(b"vllm:num_requests_running 1\n", 100, delay_s=0.05),
                             "no answer within", slow=True),
    "chunked-forever": MetricsCase(_chunked_forever, "no answer within", slow=True),
    "cut-short": MetricsCase(_cut_short, "Error"),
    "close-at-once": MetricsCase(_close_at_once, "Disconnected"),
    "connection-reset": MetricsCase(_reset, "Error"),
    "length-short": MetricsCase(_length_short, "Error"),
    "length-short-late": MetricsCase(_length_short_late, "none of the metric names"),
    "not-http": MetricsCase(lambda nth: iter([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"]), "Error"),
    "bad-status": MetricsCase(lambda nth: iter([b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n"]),
                              "Error"),
    "header-1mib": MetricsCase(lambda nth: iter([b"HTTP/1.1 200 OK\r\nX-Junk: "
                                                 + b"j" * MIB + b"\r\n\r\n"]), "Error"),
    "redirect-elsewhere": MetricsCase(text("", status=302,
                                           Location="http://169.254.169.254/metrics"),
                                      "not followed"),
    "redirect-trap": MetricsCase(text("", status=301, Location=TRAP_PATH), "not followed"),
    "redirect-loop": MetricsCase(text("", status=307, Location="/metrics"), "not followed"),
    "gzip-bomb": MetricsCase(_gzip_bomb, "compressed body", inflated="body over"),
    "gzip-unasked": MetricsCase(_gzip_small, "compressed body", inflated=None),
    "nan-value": MetricsCase(text(GOOD + 'vllm:num_requests_waiting{engine="1"} NaN\n'), None,
                             True, lambda s: s.waiting is not None and s.waiting.max == 6),
    "inf-value": MetricsCase(text(GOOD.replace("} 2\n", "} +Inf\n", 1)), None, True,
                             lambda s: s.running is None),
    "minus-inf": MetricsCase(text(GOOD.replace("} 0.5\n", "} -Inf\n")), None, True,
                             lambda s: s.kv_usage is None),
    "negative-counter": MetricsCase(text(GOOD.replace("} 100\n", "} -100\n")), None, True,
                                    lambda s: s.generation_tokens is None),
    "negative-gauge": MetricsCase(text(GOOD.replace("} 6\n", "} -6\n")), None, True,
                                  lambda s: s.waiting is None),
    "kv-over-one": MetricsCase(text(GOOD.replace("} 0.5\n", "} 75\n")), None, True,
                               lambda s: s.kv_usage is None),
    "huge-value": MetricsCase(text(GOOD.replace("} 2\n", "} 1e308\n", 1)), None, True,
                              lambda s: s.running is None),
    "duplicate-series": MetricsCase(text(GOOD + 'vllm:num_requests_running{engine="0"} 99\n'),
                                    None, True, _running_is(2)),
    "ansi-label": MetricsCase(text(f'vllm:num_requests_running{{engine="{_ANSI}"}} 3\n'), None,
                              check=lambda s: _running_is(3)(s) and all(
                                  k.isprintable() for k in s.per_rank["running"])),
    "bidi-label": MetricsCase(text(f'vllm:num_requests_running{{engine="{_BIDI}"}} 3\n'), None,
                              check=lambda s: _running_is(3)(s) and all(
                                  k.isprintable() for k in s.per_rank["running"])),
    "long-label": MetricsCase(text(f'vllm:num_requests_running{{engine="{"a" * 3000}"}} 4\n'),
                              None, check=lambda s: _running_is(4)(s) and all(
                                  len(k) <= 80 for k in s.per_rank["running"])),
    "1mb-label": MetricsCase(text(f'vllm:num_requests_running{{engine="{"a" * MIB}"}} 4\n'
                                  + GOOD.replace('"0"', '"1"')), None, True, _running_is(2)),
    "1mb-label-alone": MetricsCase(text(f'vllm:num_requests_running{{engine="{"a" * MIB}"}} 4\n'),
                                   "over the parse limits"),
    "1mb-name": MetricsCase(text("vllm:num_requests_running" + "z" * MIB + " 1\n" + GOOD), None,
                            True, _running_is(2)),
    "many-series": MetricsCase(text(_MANY_RANKS), None, True,
                               lambda s: _running_is(64)(s) and s.skipped_values >= 9_000),
    "broken-quote": MetricsCase(text('vllm:num_requests_running{engine="0} 1\n'),
                                "not Prometheus text"),
    "bad-number": MetricsCase(text('vllm:num_requests_running{engine="0"} 0x1F\n'),
                              "not Prometheus text"),
    "counter-reset": MetricsCase(_resetting, None,
                                 check=lambda s: s.counter_resets == 1
                                 and s.generation_tokens == 100 + 5 and _running_is(1)(s)),
    "openmetrics": MetricsCase(text(GOOD + "# EOF\n", ctype="application/openmetrics-text"),
                               None, check=_running_is(2)),
    "crlf": MetricsCase(text(GOOD.replace("\n", "\r\n")), None),
}

#: What ``GET /ok/metrics`` and :data:`TRAP_PATH` answer: :data:`GOOD`.
OK_ANSWER: Final = text(GOOD)


__all__ = ["GOOD", "METRICS_CASES", "MIB", "OK_ANSWER", "SLOW_S", "TRAP_PATH", "Answer",
           "MetricsCase", "streamed", "text"]
