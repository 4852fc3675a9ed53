"""Bounds of ``cleanslate bench``: a request deadline (a server that streams forever ends a
level), a response size cap, documented size caps, URL checks, unreadable datasets and outputs,
and the server's error bodies shown (a 422 naming ignore_eos says to use --no-ignore-eos)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench._limits import (
    DEADLINE_FLOOR_S,
    MAX_CONCURRENCY,
    request_deadline_s,
    response_byte_cap,
)
from tests.bench.conftest import start_fake_server_process

SMALL = ["--workload", "random:input_len=8,output_len=4"]


def test_the_default_deadline_grows_with_the_output_asked_for() -> None:
    assert request_deadline_s(128) == DEADLINE_FLOOR_S + 128
    assert request_deadline_s(128, 2.5) == 2.5
    assert response_byte_cap(1) < response_byte_cap(1000)


def test_a_server_that_streams_forever_ends_the_level_at_the_deadline(cli: Any,
                                                                      procs: Any) -> None:
    _proc, url = start_fake_server_process(procs, "--fault", "endless", "--itl-ms", "5")
    t0 = time.monotonic()
    res = cli("bench", "--url", url, "--model", "m", "--concurrency", "2", "--num-prompts", "2",
              *SMALL, "--request-timeout", "2", "--json", "-", timeout=120)
    elapsed = time.monotonic() - t0
    assert res.returncode == 1, res.stderr
    level = res.json()["levels"][0]
    assert level["errors"] == {"deadline": 2}
    assert "deadline" in level["error_details"]["deadline"]
    assert elapsed < 60
    assert "first deadline: no end 2 s after the send" in res.stderr


def test_a_response_far_larger_than_asked_for_is_cut(cli: Any, procs: Any) -> None:
    _proc, url = start_fake_server_process(procs, "--fault", "endless")
    res = cli("bench", "--url", url, "--model", "m", "--num-prompts", "1",
              "--workload", "random:input_len=8,output_len=1", "--json", "-", timeout=120)
    assert res.returncode == 1, res.stderr
    assert res.json()["levels"][0]["errors"] == {"response_too_large": 1}


def test_422_naming_ignore_eos_shows_the_body_and_says_no_ignore_eos(cli: Any,
                                                                      procs: Any) -> None:
    _proc, url = start_fake_server_process(
        procs, "--fault", "reject-fields=ignore_eos,min_tokens"
    )
    res = cli("bench", "--url", url, "--model", "m", "--num-prompts", "3", *SMALL,
              "--json", "-")
    assert res.returncode == 1, res.stderr
    level = res.json()["levels"][0]
    assert level["errors"] == {"http_422": 3}
    body = level["error_details"]["http_422"]
    assert json.loads(body) == {"detail": "Unexpected fields: ignore_eos, min_tokens"}
    assert any("--no-ignore-eos" in w for w in level["warnings"])
    assert "--no-ignore-eos" in res.stderr
    assert "Unexpected fields: ignore_eos" in res.stderr
    res = cli("bench", "--url", url, "--model", "m", "--num-prompts", "3", *SMALL,
              "--no-ignore-eos", "--json", "-")
    assert res.returncode == 0, res.stderr
    assert res.json()["levels"][0]["completed"] == 3


def test_the_summary_table_is_not_cut_in_a_pipe(cli: Any, procs: Any) -> None:
    _proc, url = start_fake_server_process(procs, "--itl-ms", "1")
    model = "a-model-name-[/x]-long-enough-to-widen-the-title-" + "x" * 80
    res = cli("bench", "--url", url, "--model", model, "--concurrency", "1,2",
              "--num-prompts", "4", *SMALL, "--slo", "ttft_ms=5000,tpot_ms=500")
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout, res.stdout
    assert "a-model-name-[/x]-long" in res.stdout  # external text printed as text, not markup
    header = next(line for line in res.stdout.splitlines() if "TTFT ms p50/p99" in line)
    assert "TPOT ms p50/p99" in header and "goodput/s" in header
    # the table's rows (the verdict lines under it start with the label too, not with a border)
    rows = [line for line in res.stdout.splitlines()
            if line.startswith("│") and line.lstrip("│ ").startswith("c=")]
    assert len(rows) == 2
    for row in rows:  # every figure on one line, e.g. 1.2/3.4
        assert row.count("/") >= 2, row


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--concurrency", "100000000"], "--concurrency"),
        (["--concurrency", f"{MAX_CONCURRENCY + 1}"], "--concurrency"),
        (["--rate", "2", "--max-concurrency", "100000000"], "--max-concurrency"),
        (["--rate", "0.00001"], "--rate"),
        (["--rate", "2", "--arrival", "gamma", "--burstiness", "1e-9"], "--burstiness"),
        (["--num-prompts", "1000000000"], "--num-prompts"),
        (["--warmup", "1000000000"], "--warmup"),
        (["--duration", "1e12"], "--duration"),
        (["--duration", "nan"], "--duration"),
        (["--request-timeout", "0"], "--request-timeout"),
        (["--request-timeout", "inf"], "--request-timeout"),
        (["--read-timeout", "-1"], "--read-timeout"),
        (["--workload", "random:input_len=100000000"], "--workload"),
        (["--workload", "random:output_len=100000000"], "--workload"),
        (["--workload", "shared-prefix:num_prefixes=100000000"], "--workload"),
        (["--workload", "random:input_len=1000000", "--num-prompts", "1000"],
         "--num-prompts/--workload"),
        (["--concurrency", ",".join(["1"] * 300)], "--concurrency"),
    ],
)
def test_sizes_are_capped(cli: Any, args: list[str], where: str) -> None:
    t0 = time.monotonic()
    res = cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", *args)
    assert res.returncode == 2, res.stderr
    assert f"{where}:" in res.stderr and "Traceback" not in res.stderr
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:99999", "http://127.0.0.1:0", "http://127.0.0.1:port", "ftp://host:21",
     "http://", "http://host:8000/v1?x=1", "http://ho st:8000", "localhost:8000"],
)
def test_bad_urls_exit_2(cli: Any, url: str) -> None:
    res = cli("bench", "--url", url, "--model", "m")
    assert res.returncode == 2, res.stderr
    assert "--url:" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'[{"conversations": [{"value": "caf\xe9"}]}]', "not UTF-8"),
        (b"{not json", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        (b"[" + b"9" * 5000 + b"]", "not a usable JSON document"),
        (b"[]", "no conversation"),
    ],
    ids=["not-utf8", "not-json", "deep", "huge-int", "empty"],
)
def test_unusable_datasets_exit_2(cli: Any, tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "data.json"
    path.write_bytes(content)
    res = cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--dataset", str(path),
              "--num-prompts", "2")
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("target", ["missing-folder/out.json", "."])
def test_an_unwritable_json_output_exits_2_before_the_run(cli: Any, tmp_path: Path,
                                                           target: str) -> None:
    # Port 9 refuses connections: the run would fail (exit 1) if it were started.
    res = cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--json",
              str(tmp_path / target))
    assert res.returncode == 2, res.stderr
    assert "--json:" in res.stderr and "Traceback" not in res.stderr
