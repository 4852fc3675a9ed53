"""``cleanslate bench`` as a user runs it: success, and bad input -> exit 2 with a clear message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cleanslate.cli.bench import parse_slo
from cleanslate.errors import InputError
from tests.bench.conftest import start_fake_server_process


def test_parse_slo() -> None:
    slo = parse_slo("ttft_ms=500, tpot_ms=50,e2e_ms=1e4")
    assert (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms) == (500, 50, 10_000)
    assert parse_slo(None).is_empty() and parse_slo("").is_empty()
    for bad, needle in [
        ("ttft=5", "unknown SLO"),
        ("ttft_ms", "key=value"),
        ("ttft_ms=fast", "not a number"),
        ("ttft_ms=-1", "positive"),
        ("ttft_ms=nan", "positive"),
    ]:
        with pytest.raises(InputError, match=needle):
            parse_slo(bad)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--slo", "ttft_ms=abc"], "--slo ttft_ms: 'abc' is not a number"),
        (["--slo", "latency=3"], "unknown SLO"),
        (["--concurrency", "1,x"], "--concurrency: 'x' is not an integer"),
        (["--concurrency", "0"], "at least 1"),
        (["--rate", "fast"], "--rate"),
        (["--rate", "2", "--concurrency", "4"], "closed loop"),
        (["--max-concurrency", "4"], "caps an open loop"),
        (["--rate", "2", "--arrival", "bursty"], "unknown arrival"),
        (["--workload", "zipf:x=1"], "unknown workload"),
        (["--workload", "random:input_len=-5"], "input_len"),
        (["--dataset", "/nonexistent/sharegpt.json"], "is not a file"),
        (["--num-prompts", "5", "--duration", "3"], "not both"),
        (["--endpoint", "embeddings"], "unknown endpoint"),
        (["--tokenizer", "/nonexistent/tok"], "does not exist"),
    ],
)
def test_bad_input_exits_2_without_traceback(cli: Any, args: list[str], needle: str) -> None:
    res = cli("bench", "--url", "http://127.0.0.1:9", "--model", "m", *args)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""


def test_bad_url_exits_2(cli: Any) -> None:
    res = cli("bench", "--url", "127.0.0.1:8000", "--model", "m")
    assert res.returncode == 2 and "not an http(s) URL" in res.stderr


def test_success_json_to_stdout_and_file(cli: Any, procs: Any, tmp_path: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    res = cli(
        "bench",
        "--url",
        url,
        "--model",
        "m",
        "--concurrency",
        "1,4",
        "--num-prompts",
        "8",
        "--workload",
        "random:input_len=8,output_len=4",
        "--slo",
        "ttft_ms=5000",
        "--json",
        "-",
    )
    assert res.returncode == 0, res.stderr
    doc = res.json()  # stdout holds the JSON document and nothing else
    assert [lv["max_concurrency"] for lv in doc["levels"]] == [1, 4]
    assert doc["levels"][0]["completed"] == 8 and doc["levels"][0]["request_goodput"] > 0
    assert "DONE" in res.stderr
    out = tmp_path / "r.json"
    res = cli(
        "bench",
        "--url",
        url,
        "--model",
        "m",
        "--num-prompts",
        "3",
        "--json",
        str(out),
        "--rate",
        "100",
        "--arrival",
        "gamma",
        "--burstiness",
        "2",
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["levels"][0]["burstiness"] == 2.0
    assert "DONE" in res.stdout


def test_http_errors_exit_1(cli: Any, procs: Any) -> None:
    _proc, url = start_fake_server_process(procs, "--fault", "http-500=2")
    res = cli("bench", "--url", url, "--model", "m", "--num-prompts", "6", "--json", "-")
    assert res.returncode == 1
    assert res.json()["levels"][0]["errors"] == {"http_500": 3}
    assert "ERRORS" in res.stderr
