"""A level's counts add up to what it sent, for every load shape (issue 35).

``sent`` is counted as each request is sent; ``completed + failed`` from the records the level
keeps; the fake server counts what it was asked. The three agree for closed and open loops,
trace replays, concurrency and rate ramps and conversations, when requests fail, when a
level is ended early with requests in flight (``aborted``), and on the command line, where a
run that completes nothing exits 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cleanslate.bench import BenchConfig, Harness, LevelResult, run_benchmark
from cleanslate.bench._client import RequestRecord
from cleanslate.bench._summary import LOST, LevelRun, level_result
from cleanslate.testing.fake_openai import fake_openai_thread
from tests.bench.conftest import fake_server
from tests.cli.inproc import run_main

SMALL = {"kind": "random", "input_len": 8, "output_len": 4}


def _trace(tmp_path: Path, rows: int = 6, gap_ms: int = 20) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": gap_ms * i, "input_length": 8,
                                        "output_length": 4}) + "\n" for i in range(rows)))
    return str(path)


def _shape(name: str, tmp_path: Path, *, slow: bool = False) -> dict[str, Any]:
    """The BenchConfig fields of one load shape (a small level of each); ``slow``: a
    schedule still sending after 0.5 s."""
    rate = 10.0 if slow else 200.0
    if name == "closed":
        return {"loads": [{"kind": "closed", "concurrency": 2}], "num_prompts": 6}
    if name == "open":
        return {"loads": [{"kind": "open", "rate": rate, "arrival": "constant"}],
                "num_prompts": 6 * (1 + 3 * slow)}
    if name == "replay":
        return {"loads": [{"kind": "replay"}], "workload": {
            "kind": "trace", "path": _trace(tmp_path, 10 if slow else 6, 100 if slow else 20)}}
    if name == "ramp":
        return {"loads": [{"kind": "ramp", "start": 1, "end": 3, "duration_s": 0.4}]}
    if name == "rate-ramp":
        return {"loads": [{"kind": "ramp", "of": "rate", "start": 10, "end": 30,
                           "duration_s": 0.4}]}
    if name == "conversation":
        return {"loads": [{"kind": "closed", "concurrency": 2}], "num_prompts": 6,
                "workload": {"kind": "conversation", "turns": 3, "input_len": 8,
                             "output_len": 4}, "endpoint": "chat"}
    assert name == "open-conversation"
    return {"loads": [{"kind": "open", "rate": rate / 2, "arrival": "constant"}],
            "num_prompts": 6 * (1 + 3 * slow),
            "workload": {"kind": "conversation", "turns": 3, "input_len": 8, "output_len": 4},
            "endpoint": "chat"}


SHAPES = ["closed", "open", "replay", "ramp", "rate-ramp", "conversation",
          "open-conversation"]


def _config(url: str, fields: dict[str, Any]) -> BenchConfig:
    return BenchConfig.model_validate({"url": url, "model": "m", "workload": SMALL,
                                       "request_timeout_s": 5.0, **fields})


def _assert_counted(level: LevelResult, asked: int, *, cut: bool = False) -> None:
    """``asked``: requests the server received; ``cut``: the level was ended early (a request
    cancelled on its way is sent and aborted, never received)."""
    assert level.sent == level.completed + level.failed, level
    assert (asked <= level.sent) if cut else (asked == level.sent), (asked, level.sent)
    assert sum(level.errors.values()) == level.failed
    assert LOST not in level.errors, level.error_details
    for window in level.windows:
        assert window.sent == window.completed + window.failed
    assert sum(w.sent for w in level.windows) in (0, level.sent)
    for turn in level.turns:
        assert turn.requests >= 0 and turn.failed >= 0
    assert sum(t.requests + t.failed for t in level.turns) in (0, level.sent)


@pytest.mark.parametrize("shape", SHAPES)
def test_counts_add_up_when_requests_fail(shape: str, tmp_path: Path) -> None:
    async def run() -> tuple[LevelResult, int]:
        async with fake_server("http-500=3") as (url, stats):
            result = await run_benchmark(_config(url, _shape(shape, tmp_path)))
            return result.levels[0], stats.requests

    level, asked = asyncio.run(run())
    _assert_counted(level, asked)
    assert level.completed > 0 and level.errors.get("http_500", 0) > 0


@pytest.mark.parametrize("shape", SHAPES)
def test_requests_in_flight_when_a_level_ends_are_counted_as_aborted(
        shape: str, tmp_path: Path) -> None:
    """A server that never answers, and the level stopped (Ctrl-C) with requests in flight
    and more to send: every one is ``aborted`` before the level's result is made, none still
    runs after it (an open loop's sends in flight were left running, and uncounted, before
    issue 35)."""
    async def run() -> tuple[LevelResult, int, int]:
        async with fake_server("hang") as (url, stats):
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, stop.set)
            result = await run_benchmark(_config(url, _shape(shape, tmp_path, slow=True)),
                                         Harness(stop=stop))
            level = result.levels[0]
            await asyncio.sleep(0.1)  # a request still running would be sent or recorded now
            return level, stats.requests, len(asyncio.all_tasks()) - 1

    level, asked, tasks_left = asyncio.run(run())
    _assert_counted(level, asked, cut=True)
    assert level.partial and level.partial_reason == "interrupted"
    assert level.errors == {"aborted": level.sent} and level.sent > 0
    assert not level.valid
    assert tasks_left == 0


def _record(error: str | None) -> RequestRecord:
    rec = RequestRecord(t_send=1.0, input_tokens=8, input_source="approx", requested_output=4,
                        t_first=1.1, t_last=1.2, t_end=1.2, content_times=[1.1, 1.2],
                        output_tokens=2, output_source="server", error=error)
    return rec


def test_a_request_sent_without_a_record_is_failed_as_lost() -> None:
    config = BenchConfig(url="http://127.0.0.1:9", model="m")
    run = LevelRun(config=config, records=[_record(None), _record("timeout")], sent=5)
    level = level_result(run, config.loads[0], 0.1, 1.0, 5)
    assert (level.sent, level.completed, level.failed) == (5, 1, 4)
    assert level.errors == {LOST: 3, "timeout": 1}
    assert not level.valid and "3 of 5 requests sent ended without a record" in (
        level.invalid_reason or "")


def test_a_level_whose_counts_do_not_add_up_is_refused() -> None:
    config = BenchConfig(url="http://127.0.0.1:9", model="m")
    level = level_result(LevelRun(config=config, records=[_record(None)]),
                         config.loads[0], 0.1, 1.0, 1)
    data = level.model_dump()
    assert data["sent"] == 1
    with pytest.raises(ValidationError, match="every request sent is one or the other"):
        LevelResult.model_validate({**data, "sent": 3})
    old = {k: v for k, v in data.items() if k != "sent"}  # a level stored before `sent`
    assert LevelResult.model_validate(old).sent == 1


@pytest.mark.parametrize("shape", ["--ramp", "--rate", "--replay", "conversation"])
def test_every_load_shape_on_the_command_line_exits_1_when_requests_fail(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        shape: str) -> None:
    """The stream of ``hostile=deep-nesting`` makes the parser raise RecursionError: every
    request is ``client_error``, never lost, and no load shape exits 0."""
    load = {"--ramp": ["--ramp", "linear:start=1,end=2,duration=0.3"],
            "--rate": ["--rate", "100", "--num-prompts", "4"],
            "--replay": ["--workload", f"trace:path={_trace(tmp_path, 4)}", "--replay", "2"],
            "conversation": ["--workload", "conversation:turns=2,input_len=8,output_len=4",
                             "--num-prompts", "4", "--endpoint", "chat"]}[shape]
    with fake_openai_thread("hostile=deep-nesting") as server:
        res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "m",
                       *load, "--request-timeout", "2", "--json", "-")
        asked = server.stats.requests
    assert "Traceback" not in res.err
    assert res.code == 1, res.err
    (level,) = json.loads(res.out)["levels"]
    assert level["sent"] == level["failed"] == asked > 0
    assert level["errors"] == {"client_error": asked}
    assert "RecursionError" in level["error_details"]["client_error"]
    assert "ERRORS" in res.err and "no failed request" not in res.err


def test_a_run_that_sends_nothing_exits_1(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A level bounded by a duration too short for one send: nothing completed, nothing
    failed, and still not a result."""
    with fake_openai_thread("ok") as server:
        res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "m",
                       "--duration", "1e-9", "--json", "-")
    assert res.code == 1, res.err
    (level,) = json.loads(res.out)["levels"]
    assert level["sent"] == level["completed"] == level["failed"] == 0
    assert level["valid"] is False and level["invalid_reason"] == "no request completed"
    assert "NO RESULT" in res.err and "DONE" not in res.err


def test_find_max_against_a_server_that_completes_nothing_exits_1(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.perf_counter()
    with fake_openai_thread("hostile=deep-nesting") as server:
        res = run_main(capsys, monkeypatch, "bench", "--url", server.url, "--model", "m",
                       "--find-max", "concurrency", "--slo", "median_ttft_ms=1000",
                       "--start", "2", "--num-prompts", "4", "--request-timeout", "2",
                       "--json", "-")
        asked = server.stats.requests
    assert "Traceback" not in res.err
    assert res.code == 1, res.err
    probes = json.loads(res.out)["find_max"]["probes"]
    assert probes and all(p["verdict"] == "errors" for p in probes)
    counted = sum(p["level"]["sent"] for p in probes)
    assert counted == sum(p["level"]["failed"] for p in probes)
    assert counted <= asked  # the rest: the search's warm-up
    assert time.perf_counter() - t0 < 10
