"""``cleanslate bench --repeats / --target-ci / --max-error-rate`` as a user runs it: bad values
are exit 2 naming the option; repeated levels print ``mean ± half-width``; a level above the
error-rate gate is printed as no throughput result and exits 1 (issue 24)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.bench.conftest import start_fake_server_process
from tests.cli.inproc import run_main

SMALL = ["--workload", "random:input_len=8,output_len=6", "--no-live"]


@pytest.mark.parametrize(
    ("args", "where", "needle"),
    [
        (["--repeats", "0"], "--repeats", "at least 1"),
        (["--target-ci", "5", "--repeats", "2"], "--repeats", "at least 3 times"),
        (["--target-ci", "0"], "--target-ci", "must be more than 0"),
        (["--max-error-rate", "1.5"], "--max-error-rate", "at most 1"),
    ],
)
def test_bad_repeat_options_are_exit_2_naming_the_option(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        args: list[str], where: str, needle: str) -> None:
    res = run_main(capsys, monkeypatch, "bench", "--url", "http://127.0.0.1:9", "--model", "m",
                   *args)
    assert res.code == 2, res.err
    assert where in res.err and needle in res.err
    assert "Traceback" not in res.err


def test_repeated_levels_print_intervals_and_an_invalid_level_exits_1(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        procs: Any) -> None:
    # every 50th request the server sees fails: 2 of each repeat's 100
    _proc, url = start_fake_server_process(procs, "--itl-ms", "1", "--fault", "http-500=50")
    res = run_main(capsys, monkeypatch, "bench", "--url", url, "--model", "m", "--concurrency",
                   "2", "--num-prompts", "100", "--repeats", "3", *SMALL, "--json", "-")
    assert res.code == 1, res.err
    level = json.loads(res.out)["levels"][0]
    assert level["n_repeats"] == 3 and [r["seed"] for r in level["repeats"]] == [0, 1, 2]
    assert [r["failed"] for r in level["repeats"]] == [2, 2, 2]
    assert level["output_throughput_ci_low"] <= level["output_throughput"]
    assert level["valid"] is False and level["error_rate"] == pytest.approx(0.02)
    # the table (on stderr with --json -) shows mean ± half-width and the verdict
    assert " ± " in res.err and "(invalid)" in res.err
    assert "c=2: not a throughput result: 2.0% of requests failed (6 of 300)" in res.err
    assert "ERRORS" in res.err
