"""``cleanslate bench --find-max`` as a user runs it (issue 25): the search against a server
whose latency grows with the requests in flight finds the boundary its model sets, the JSON
document reads back; against the sim with ``crash-at-concurrency`` the crash is part of the
answer; bad input is exit 2 naming the option."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from cleanslate import wire
from cleanslate.bench import CapacityResult, ProbeVerdict, StopReason
from cleanslate.cli._find_max import FindMaxDocument
from tests.cli.inproc import run_main
from tests.sim.conftest import SimServers

#: The slowing server's decode step: this many ms per request in flight, and a knee: past
#: KNEE requests in flight every step costs KNEE_MS more (as a server whose batch outgrew its
#: fast path), so the boundary stands clear of the timer noise of a loaded machine.
MS_PER_REQUEST = 2.0
KNEE = 6
KNEE_MS = 10.0
WORDS = [" alpha", " bravo", " charlie", " delta", " echo", " foxtrot", " golf", " hotel"]


class SlowingServer:
    """An OpenAI-compatible completions server (aiohttp, in a thread of its own) whose every
    decode step takes ``2 ms x`` the most requests in flight the request has seen (the batch it
    joined), 10 ms more past 6: at concurrency c
    a request of the steady state has TPOT ``2c`` ms up to c=6 (12 ms) and ``2c + 10`` above
    (c=7: 24 ms), so under ``median_tpot_ms=18`` the boundary is c=6."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the slowing server did not start"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/health", self._ok)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        self._ready.set()
        self._loop.run_forever()

    async def _ok(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens") or 16)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        peak = self.in_flight  # the most requests in flight this request has seen
        try:
            resp = web.StreamResponse(headers={"Content-Type": wire.EVENT_STREAM})
            await resp.prepare(request)
            chunks = wire.ChunkTemplate("cmpl-1", "m", chat=False, created=0)
            for i in range(tokens):
                if i:  # a decode step: longer the more requests are in flight now
                    peak = max(peak, self.in_flight)
                    await asyncio.sleep((MS_PER_REQUEST * peak + (KNEE_MS if peak > KNEE
                                                                   else 0)) / 1000)
                await resp.write(chunks.content(wire.json_string_body(WORDS[i % len(WORDS)]),
                                                "length" if i == tokens - 1 else None))
            prompt = len(str(body.get("prompt", "")).split())
            await resp.write(chunks.usage(prompt, tokens) + wire.DONE_EVENT)
            await resp.write_eof()
            return resp
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        async def down() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def slowing() -> Iterator[SlowingServer]:
    server = SlowingServer()
    try:
        yield server
    finally:
        server.close()



SMALL = ["--workload", "random:input_len=8,output_len=4", "--no-live"]


def test_the_search_finds_the_servers_boundary_and_its_json_reads_back(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        slowing: SlowingServer, tmp_path: Path) -> None:
    out = tmp_path / "find-max.json"
    res = run_main(capsys, monkeypatch, "bench", "--url", slowing.url, "--model", "m",
                   "--find-max", "concurrency", "--slo", "median_tpot_ms=18", "--start", "2",
                   "--num-prompts", "30", *SMALL, "--json", str(out))
    assert res.code == 0, res.err + res.out
    doc = FindMaxDocument.model_validate_json(out.read_text())
    result = doc.find_max
    # the model's boundary: c=6 (TPOT 12 ms) passes, c=7 (24 ms) does not
    assert (result.capacity, result.upper) == (6, 7), result.summary()
    assert result.stopped_by == StopReason.TOLERANCE
    assert [p.load for p in result.probes] == [2, 4, 8, 6, 7]
    assert [p.verdict for p in result.probes] == [ProbeVerdict.PASS, ProbeVerdict.PASS,
                                                  ProbeVerdict.FAIL, ProbeVerdict.PASS,
                                                  ProbeVerdict.FAIL]
    assert slowing.most_in_flight <= 8  # no probe went above the bracket's top
    # every probe keeps its measured level: 30 requests a measurement (a probe straddling
    # its target is measured again and decided on the pooled requests)
    for probe in result.probes:
        assert probe.level is not None and probe.requests == 30 * probe.measurements
        assert probe.level.label == probe.label
        assert probe.checks[0].key == "median_tpot_ms" and probe.checks[0].n == probe.requests
    passed = result.probes[3]
    assert passed.checks[0].value is not None and passed.checks[0].value < 18
    assert passed.attainment_low is not None and passed.attainment_low >= 0.5
    # the document's own fields, and the result as a CapacityResult of its own
    assert (doc.tool, doc.url, doc.model, doc.seed) == ("cleanslate bench --find-max",
                                                        slowing.url, "m", 0)
    assert doc.warmup == 8  # the start's concurrency (2), at least 8
    raw = json.loads(out.read_text())
    assert CapacityResult.model_validate(raw["find_max"]) == result
    assert raw["find_max"]["probes"][0]["level"]["completed"] == 30  # c=2: 30 of 30 met
    # a line per probe as it starts, with an estimate once one was measured (issue 38)
    assert "probe 1: c=2, 30 requests (" in res.err
    assert "no estimate until a probe has been measured; at most 16 probes)" in res.err
    fifth = next(ln for ln in res.err.splitlines() if ln.startswith("probe 5: c=7, 30 requests"))
    assert "so far, about " in fifth and fifth.endswith(
        "left at most; estimates from the probes so far)")
    # a line per probe as it was decided, in probe order, on stderr
    lines = [ln for ln in res.err.splitlines() if ln.startswith("c=")]
    assert [ln.split(":")[0] for ln in lines] == ["c=2", "c=4", "c=8", "c=6", "c=7"]
    assert "c=6: pass, " in res.err and "; median_tpot_ms " in res.err
    assert "c=7: fail" in res.err and "slo_miss" in res.err
    # the table in load order and the summary on stdout
    assert res.out.index("c=2 ") < res.out.index("c=6 ") < res.out.index("c=7 ") < res.out.index(
        "c=8 ")
    assert "max concurrency within the SLOs: c=6, boundary in [6, 7)" in res.out


def test_an_attainment_target_and_json_on_stdout(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        slowing: SlowingServer) -> None:
    # per request: TPOT at most 18 ms for half the requests: c=4 (8 ms) and 6 (12) pass, 8
    # (26) does not; 6 ms either side (a 10 ms bound, 2 ms from c=4's, failed 1 run in 3 on a
    # loaded machine: sleeps only get longer there)
    res = run_main(capsys, monkeypatch, "bench", "--url", slowing.url, "--model", "m",
                   "--find-max", "concurrency", "--slo", "tpot_ms=18", "--slo-attainment",
                   "0.5", "--start", "4", "--max-load", "8", "--tolerance", "0.5",
                   "--num-prompts", "40", "--warmup", "0", *SMALL, "--json", "-")
    assert res.code == 0, res.err
    doc = FindMaxDocument.model_validate_json(res.out)  # stdout holds the document alone
    result = doc.find_max
    assert doc.warmup == 0
    assert result.slo.attainment == 0.5 and result.slo.limits == {"tpot_ms": 18.0}
    assert [(p.load, p.verdict) for p in result.probes] == [(4, ProbeVerdict.PASS),
                                                           (8, ProbeVerdict.FAIL),
                                                           (6, ProbeVerdict.PASS)]
    assert result.probes[0].checks[0].key == "attainment"
    assert (result.capacity, result.upper) == (6, 8)
    # with --json -: no decided-probe lines; the table and the summary go to stderr, and a
    # line as each probe starts (a search can run for minutes with stdout redirected)
    assert "c=4: pass" not in res.err
    starts = [ln.split(",")[0] for ln in res.err.splitlines()
              if ln.startswith("probe ") and " measured again " not in ln]  # an extension
    assert starts == ["probe 1: c=4", "probe 2: c=8", "probe 3: c=6"]
    assert "boundary in [6, 8)" in res.err and "p99_tpot_ms" in res.err


def test_a_rate_search_probes_open_loops_shaped_by_the_options(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        slowing: SlowingServer) -> None:
    res = run_main(capsys, monkeypatch, "bench", "--url", slowing.url, "--model", "m",
                   "--find-max", "rate", "--slo", "p90_tpot_ms=1000", "--start", "200",
                   "--max-load", "400", "--arrival", "constant", "--max-concurrency", "3",
                   "--num-prompts", "40", *SMALL, "--json", "-")
    assert res.code == 0, res.err
    result = FindMaxDocument.model_validate_json(res.out).find_max
    assert result.dimension == "rate"
    assert FindMaxDocument.model_validate_json(res.out).warmup == 8  # the cap (3), at least 8
    assert [(p.label, p.verdict) for p in result.probes] == [("rate=200", ProbeVerdict.PASS),
                                                             ("rate=400", ProbeVerdict.PASS)]
    assert result.stopped_by == StopReason.MAX_LOAD and result.upper is None
    assert slowing.most_in_flight <= 3  # the open loop's cap held
    assert "max request rate within the SLOs: at least rate=400" in res.err


def test_a_crash_above_the_capacity_is_part_of_the_answer(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.05", "--fault", "crash-at-concurrency=20")
    res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model",
                   "cleanslate/sim-70b", "--find-max", "concurrency", "--slo",
                   "p90_tpot_ms=1000", "--start", "4", "--num-prompts", "40",
                   "--workload", "random:input_len=16,output_len=4", "--no-live",
                   "--server-log", str(server.log_path), "--engine", "sim", "--json", "-")
    assert res.code == 0, res.err  # the crash bounds the answer: it is one
    result = FindMaxDocument.model_validate_json(res.out).find_max
    assert result.stopped_by == StopReason.CRASHED
    crashed = [p for p in result.probes if p.verdict == ProbeVerdict.CRASHED]
    assert [p.load for p in crashed] == [32]
    # the cause as a study classifies it: the engine's crash patterns over its log
    assert result.crash == ("crashed at c=32 (python_exception: AttributeError: "
                            "'PrefillMetadata' object has no attribute "
                            "'page_table_1_flattened')"), result.crash
    assert (result.capacity, result.upper) == (16, 32)
    assert not any(p.passed and p.load > 20 for p in result.probes)
    assert "crashed at c=32 (python_exception: AttributeError" in res.err
    assert server.proc.wait(10) == 1  # the sim did crash


def test_without_its_log_a_crash_is_named_by_what_the_client_saw(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.05", "--fault", "crash-at-concurrency=6")
    res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model",
                   "cleanslate/sim-70b", "--find-max", "concurrency", "--slo",
                   "p90_tpot_ms=1000", "--start", "4", "--num-prompts", "20",
                   "--workload", "random:input_len=16,output_len=4", "--no-live")
    assert res.code == 0, res.err
    assert ("c=4, boundary in [4, 8) (2 probes, stopped: crashed); crashed at c=8 (crashed: "
            "server unreachable at 127.0.0.1:") in res.out


def test_nothing_passing_is_no_answer_exit_1(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        slowing: SlowingServer) -> None:
    res = run_main(capsys, monkeypatch, "bench", "--url", slowing.url, "--model", "m",
                   "--find-max", "concurrency", "--slo", "median_tpot_ms=1", "--start", "2",
                   "--num-prompts", "20", *SMALL)
    assert res.code == 1, res.err
    assert "NO ANSWER" in res.out and "none (not even c=1)" in res.out
    assert "stopped: nothing_passes" in res.out


def test_an_unreachable_server_is_no_answer_exit_1(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tests._kit import free_port

    res = run_main(capsys, monkeypatch, "bench", "--url", f"http://127.0.0.1:{free_port()}",
                   "--model", "m", "--find-max", "concurrency", "--slo", "p99_tpot_ms=200",
                   *SMALL)
    assert res.code == 1, res.err
    assert "server unreachable" in res.out and "Traceback" not in res.err
    assert "no request to http://127.0.0.1:" in res.err and "is the server running" in res.err


BASE = ["bench", "--url", "http://127.0.0.1:9", "--model", "m"]
FIND = [*BASE, "--find-max", "concurrency"]


@pytest.mark.parametrize(
    ("args", "where", "needle"),
    [
        ([*BASE, "--find-max", "tokens", "--slo", "p99_tpot_ms=200"], "--find-max",
         "not a dimension"),
        ([*FIND], "--slo", "needs the SLOs"),
        ([*FIND, "--slo", "tpot_ms=50"], "--slo", "--slo-attainment 0.99"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--slo-attainment", "0.9"], "--slo-attainment",
         "is a statistic"),
        ([*FIND, "--slo", "tpot_ms=50", "--slo-attainment", "1.5"], "--slo-attainment",
         "between 0 and 1"),
        ([*FIND, "--slo", "p99_foo_ms=200"], "--slo", "not a latency SLO"),
        ([*FIND, "--slo", "p99_tpot_ms=-1"], "--slo", "positive"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--concurrency", "1,2"], "--concurrency",
         "cannot go with it"),
        ([*BASE, "--find-max", "rate", "--slo", "p99_tpot_ms=200", "--rate", "1"], "--rate",
         "cannot go with it"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--repeats", "3"], "--repeats",
         "cannot go with it"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--target-ci", "5"], "--target-ci",
         "cannot go with it"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--start", "64", "--max-load", "32"], "--start",
         "above the most load"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--start", "2.5"], "--start", "whole number"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--start", "0"], "--start", "positive"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--max-load", "1000000"], "--max-load",
         "at most 100000"),
        ([*BASE, "--find-max", "rate", "--slo", "p99_tpot_ms=200", "--start", "0.0001"],
         "--start", "at least 0.001"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--tolerance", "0"], "--tolerance",
         "between 0 and 1"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--tolerance", "1"], "--tolerance",
         "between 0 and 1"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--max-probes", "0"], "--max-probes",
         "at least 1"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--max-extensions", "-1"], "--max-extensions",
         "at least 0"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--cliff", "2"], "--cliff", "between 0 and 1"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--confidence", "0.2"], "--confidence",
         "between 0.5"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--max-concurrency", "4"], "--max-concurrency",
         "--find-max rate"),
        ([*BASE, "--engine", "vlm"], "--engine", "unknown engine"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--server-log", "/nonexistent/log"],
         "--server-log", "is not a file"),
        ([*FIND, "--slo", "p99_tpot_ms=200", "--server-log", __file__, "--engine", "vlm"],
         "--engine", "unknown engine"),
        ([*BASE, "--start", "8"], "--start", "capacity search"),
        ([*BASE, "--slo-attainment", "0.9"], "--slo-attainment", "capacity search"),
        ([*BASE, "--slo", "p99_tpot_ms=200"], "--slo", "--find-max"),
    ],
)
def test_bad_find_max_input_is_exit_2_naming_the_option(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        args: list[str], where: str, needle: str) -> None:
    res = run_main(capsys, monkeypatch, *args)
    assert res.code == 2, res.err + res.out
    assert f"{where}:" in res.err and needle in res.err, res.err
    assert "Traceback" not in res.err


def test_help_lists_the_capacity_options(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    res = run_main(capsys, monkeypatch, "bench", "--help")
    assert res.code == 0
    for option in ("--find-max", "--slo-attainment", "--start", "--max-load", "--tolerance",
                   "--max-probes", "--max-extensions", "--cliff", "--confidence"):
        assert option in res.out, option


def test_the_server_log_is_read_as_a_run_file_never_through_a_fifo_or_a_link(
        tmp_path: Path) -> None:
    """--server-log is checked to be a file when the options are read; if it is then swapped
    for a FIFO (a read would block the search) or a link to another file, nothing is read."""
    import os

    from cleanslate.cli._find_max import read_tail

    log = tmp_path / "server.log"
    log.write_text("x" * 10 + "Traceback (most recent call last):\nAttributeError: boom\n")
    assert read_tail(log, limit=40).endswith("AttributeError: boom\n")
    assert len(read_tail(log, limit=40)) == 40
    secret = tmp_path / "other.txt"
    secret.write_text("not the server's log\n")
    log.unlink()
    log.symlink_to(secret)
    assert read_tail(log) == ""
    log.unlink()
    os.mkfifo(log)
    assert read_tail(log) == ""  # refused at once, not a blocked open
