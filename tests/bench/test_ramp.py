"""Ramps (``cleanslate.bench._ramp``): the target over time, each user's span, the windows,
and one ramp run against the in-process fake server."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from cleanslate.bench import BenchConfig, RampLoad, RandomWorkload, parse_ramp, run_level
from cleanslate.errors import InputError
from tests.bench.conftest import fake_server


def test_linear_and_steps_targets() -> None:
    linear = parse_ramp("linear:start=1,end=64,duration=60")
    assert (linear.target(0), linear.target(30), linear.target(60)) == (1, 32.5, 64)
    steps = parse_ramp("steps:start=1,end=64,duration=60,steps=4")
    assert [steps.target(t) for t in (0, 14.9, 15, 44, 59.9)] == [1, 1, 22, 43, 64]
    assert steps.windows() == [(0, 15), (15, 30), (30, 45), (45, 60)]
    assert len(linear.windows()) == 10
    assert parse_ramp("linear:start=1,end=4,duration=10,window=3").windows()[-1] == (9, 10)


def test_each_user_sends_while_the_target_is_above_it() -> None:
    up = parse_ramp("linear:start=1,end=4,duration=30")
    spans = [up.user_span(i) for i in range(4)]
    assert spans[0] == (0.0, 30.0)
    for i, span in enumerate(spans[1:], 1):
        assert span is not None and span[1] == 30.0
        assert span[0] == pytest.approx(30 * i / 3, abs=1e-6)
    down = parse_ramp("steps:start=4,end=1,duration=40,steps=4")
    assert down.user_span(3) == pytest.approx((0.0, 10.0), abs=1e-6)
    assert down.user_span(0) == (0.0, 40.0)
    assert up.user_span(4) is None


def test_a_rate_ramp_rises() -> None:
    ramp = parse_ramp("linear:start=10,end=100,duration=10,of=rate,arrival=constant")
    offsets = ramp.offsets(seed=0, limit=100_000)
    first, last = sum(1 for t in offsets if t < 1), sum(1 for t in offsets if t >= 9)
    assert 10 <= first <= 16 and 90 <= last <= 100
    assert ramp.expected_requests() == pytest.approx(len(offsets), rel=0.05)


@pytest.mark.parametrize(("text", "words"), [
    ("curve:start=1,end=2,duration=3", "unknown ramp"),
    ("linear:start=1,end=2", "needs duration"),
    ("linear:start=1,end=2,duration=3,speed=4", "unknown key 'speed'"),
    ("linear:start=0.5,end=2,duration=3", "start: a concurrency from 1"),
    ("linear:start=1,end=2,duration=3,steps=4", "steps= is for a steps ramp"),
    ("linear:start=1,end=2,duration=3,window=9", "longer than the ramp"),
    ("linear:start=1,end=x,duration=3", "end:"),
])
def test_bad_ramps_are_input_errors(text: str, words: str) -> None:
    with pytest.raises(InputError, match=words):
        parse_ramp(text)


def test_a_bad_ramp_on_the_command_line_exits_2() -> None:
    run = subprocess.run([sys.executable, "-m", "cleanslate", "bench", "--url",
                          "http://127.0.0.1:9", "--model", "m", "--ramp",
                          "linear:start=1,end=8", "--no-live"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and "--ramp: the ramp needs duration" in run.stderr
    assert "Traceback" not in run.stderr
    both = subprocess.run([sys.executable, "-m", "cleanslate", "bench", "--url",
                           "http://127.0.0.1:9", "--model", "m", "--ramp",
                           "linear:start=1,end=8,duration=2", "--concurrency", "4",
                           "--no-live"], capture_output=True, text=True, timeout=60, check=False)
    assert both.returncode == 2 and "--concurrency" in both.stderr


def test_a_concurrency_ramp_reports_its_windows() -> None:
    ramp = RampLoad(start=1, end=8, duration_s=1.2, shape="steps", steps=4)

    async def go() -> object:
        async with fake_server(itl_s=0.002) as (url, _stats):
            config = BenchConfig(url=url, model="m", loads=(ramp,),
                                 workload=RandomWorkload(input_len=16, output_len=8))
            return await run_level(config, ramp)

    level = asyncio.run(go())
    windows = level.windows  # type: ignore[attr-defined]
    assert [w.target for w in windows] == pytest.approx([1, 3 + 1 / 3, 5 + 2 / 3, 8])
    assert windows[0].in_flight == pytest.approx(1, abs=0.3)
    assert windows[-1].in_flight == pytest.approx(8, abs=1.5)
    assert all(w.failed == 0 for w in windows) and all(w.sent > 0 for w in windows)
    assert windows[-1].output_throughput > 3 * windows[0].output_throughput
    assert level.duration == pytest.approx(1.2, abs=0.3)  # type: ignore[attr-defined]
    assert level.steady_share is None  # type: ignore[attr-defined]
