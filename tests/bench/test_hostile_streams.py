"""Every request sent is counted, whatever the server sends (issue 35).

``cleanslate bench`` runs in this process (:func:`tests.cli.inproc.run_main`) against the fake
server's hostile streams (``hostile=KIND``, :data:`cleanslate.testing._hostile.HOSTILE_KINDS`)
and some of its other faults: each request the level sent is completed or failed by a named
class, the level's counts add up to what it sent and to what the server was asked, the exit
code says whether anything failed, nothing prints a traceback, and every run ends within its
request deadline and without holding the response in memory.
"""

from __future__ import annotations

import json
import resource
import time

import pytest

import cleanslate.bench  # noqa: F401  (the client stack loaded before a run's memory is read)
from cleanslate.testing._hostile import HOSTILE_KINDS
from cleanslate.testing.fake_openai import fake_openai_thread
from tests.cli.inproc import run_main

#: Requests per run, two at a time; seconds from a request's send to its last byte.
REQUESTS, CONCURRENCY, DEADLINE_S = 2, 2, 1.0

#: What each server gets from a request: its error classes (``None``: the request completed),
#: and whether the run exits 1.
EXPECTED: dict[str, tuple[frozenset[str | None], int]] = {
    "hostile=deep-nesting": (frozenset({"client_error"}), 1),
    "hostile=deep-error": (frozenset({"client_error"}), 1),
    # the text is not text: completed, and the sampled outputs are empty (bad output)
    "hostile=invalid-utf8": (frozenset({None}), 1),
    "hostile=nul-bytes": (frozenset({None}), 1),
    "hostile=not-json": (frozenset({"malformed_sse"}), 1),
    "hostile=json-list": (frozenset({"malformed_sse"}), 1),
    "hostile=json-number": (frozenset({"malformed_sse"}), 1),
    # a count no response could hold is not believed: tokens counted per event, completed
    "hostile=negative-usage": (frozenset({None}), 0),
    "hostile=huge-usage": (frozenset({None}), 0),
    "hostile=many-choices": (frozenset({None}), 0),
    # megabytes to read before the verdict: on a loaded machine the 1 s deadline may come first
    "hostile=huge-chunk": (frozenset({"response_too_large", "deadline"}), 1),
    "hostile=long-chunk-line": (frozenset({"protocol_error", "deadline"}), 1),
    "hostile=bad-chunk": (frozenset({"protocol_error"}), 1),
    "hostile=close-mid-event": (frozenset({"connection_reset"}), 1),
    "hostile=data-100mib": (frozenset({"response_too_large", "deadline"}), 1),
    "hostile=keepalive-comments": (frozenset({"deadline"}), 1),
    # at full speed a line that never ends reaches the byte cap or the deadline first
    "hostile=trickle-line": (frozenset({"deadline", "response_too_large"}), 1),
    "hostile=slow-bytes": (frozenset({"deadline"}), 1),
    "hostile=wrong-content-type": (frozenset({"malformed_sse"}), 1),
    "hostile=gzip-bomb": (frozenset({"response_too_large", "deadline"}), 1),
    "hostile=bad-status-line": (frozenset({"protocol_error"}), 1),
    "hostile=header-too-long": (frozenset({"protocol_error", "deadline"}), 1),
    "endless": (frozenset({"response_too_large", "deadline"}), 1),
    "hang": (frozenset({"timeout", "deadline"}), 1),
    "malformed-every=1": (frozenset({None}), 0),
    "error-body": (frozenset({"server_error"}), 1),
    "http-500": (frozenset({"http_500"}), 1),
}

#: Growth of this process's peak memory a run may cause (the server runs in it too; a client
#: holding the 100 MiB line or the inflated bomb would pass it).
MAX_RSS_GROWTH_MIB = 64


def test_every_hostile_kind_is_run() -> None:
    assert {f"hostile={k}" for k in HOSTILE_KINDS} <= set(EXPECTED)
    assert len(HOSTILE_KINDS) >= 20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("fault", list(EXPECTED))
def test_every_request_is_counted_against_a_hostile_server(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        fault: str) -> None:
    classes, code = EXPECTED[fault]
    rss0 = _peak_rss_mib()
    with fake_openai_thread(fault) as server:
        t0 = time.perf_counter()
        res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "m",
                       "--concurrency", str(CONCURRENCY), "--num-prompts", str(REQUESTS),
                       "--workload", "random:input_len=8,output_len=4",
                       "--request-timeout", str(DEADLINE_S), "--read-timeout", "0.5",
                       "--json", "-")
        took = time.perf_counter() - t0
        asked = server.stats.requests
    assert "Traceback" not in res.err, res.err
    assert res.code == code, res.err
    (level,) = json.loads(res.out)["levels"]
    assert level["sent"] == REQUESTS == asked
    assert level["completed"] + level["failed"] == level["sent"]
    assert sum(level["errors"].values()) == level["failed"]
    got = set(level["errors"]) | ({None} if level["completed"] else set())
    assert got and got <= classes, (got, level["error_details"])
    for kind in level["errors"]:
        assert level["error_details"][kind] or kind.startswith(("http_", "deadline",
                                                                "malformed", "response"))
        assert f"{kind}: " in res.err  # said on the way out, with its count
    if res.code == 0:
        assert "DONE" in res.err and "no failed request" in res.err
    else:
        assert "no failed request" not in res.err + res.out
    # two requests at a time, each within its deadline, and the client's own work after
    assert took < DEADLINE_S + 1.5, took
    assert _peak_rss_mib() - rss0 < MAX_RSS_GROWTH_MIB
