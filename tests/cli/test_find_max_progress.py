"""``bench --find-max``'s progress (issue 38, item 7): the search's bound on the probes still to
run, and each measurement's estimate from the probes measured before it (pure: no server)."""

from __future__ import annotations

import time

import pytest

from cleanslate.bench import CapacitySearch, CapacitySLO, Probe, ProbeStart, ProbeVerdict
from cleanslate.cli._find_max import ProbeClock
from cleanslate.cli._render import duration_text

SLO = CapacitySLO(limits={"p90_tpot_ms": 10.0})


def _probe(index: int, load: float, passed: bool, requests: int = 50) -> Probe:
    return Probe(index=index, load=load, label=f"c={load:g}", requests=requests,
                 measurements=1, verdict=ProbeVerdict.PASS if passed else ProbeVerdict.FAIL)


def _start(load: float, requests: int | None = 100, duration_s: float | None = None,
           left: int = 5) -> ProbeStart:
    return ProbeStart(index=1, extension=0, load=load, label=f"c={load:g}", requests=requests,
                      duration_s=duration_s, probes_left_at_most=left, max_extensions=3)


@pytest.mark.parametrize("boundary", [0, 1, 5, 8, 9, 40, 63, 64, 100])
def test_the_bound_on_probes_left_holds_at_every_step(boundary: int) -> None:
    search = CapacitySearch("concurrency", SLO, start=8, max_load=64, tolerance=0.1)
    # 8 -> 16 -> 32 -> 64 (3 doublings), then at most 4 bisections for 10 %: 8 with the first
    assert search.probes_left_at_most() == 8
    bounds, runs = [], 0
    while (load := search.next_load()) is not None:
        bounds.append(search.probes_left_at_most())
        search.record(_probe(runs, load, load <= boundary))
        runs += 1
    # before each probe, the bound held for every probe that came after (itself included)
    assert all(bound >= runs - i for i, bound in enumerate(bounds)), (bounds, runs)
    assert search.probes_left_at_most() == 0


def test_the_bound_never_passes_max_probes() -> None:
    search = CapacitySearch("concurrency", SLO, start=1, max_load=4096, max_probes=5)
    assert search.probes_left_at_most() == 5
    search.record(_probe(0, 1, True))
    assert search.probes_left_at_most() == 4


def test_an_estimate_comes_from_the_measured_seconds_per_request() -> None:
    clock = ProbeClock()
    assert clock.estimate(_start(16)) is None  # nothing measured yet
    clock.measured += [(8.0, 50, 1, 10.0), (32.0, 100, 1, 5.0)]  # 0.2 and 0.05 s a request
    # the highest measured load at or below: c=8 for c=16 (a higher load serves as fast)
    assert clock.estimate(_start(16)) == pytest.approx(100 * 0.2)
    assert clock.estimate(_start(64)) == pytest.approx(100 * 0.05)
    # below every measured load: the lowest's, slower by the loads' ratio
    assert clock.estimate(_start(4)) == pytest.approx(100 * 0.2 * 8 / 4)
    # a level of a fixed duration: the duration plus the overhead the probes showed
    clock.measured[:] = [(8.0, 50, 1, 12.0), (16.0, 90, 2, 26.0)]  # 2 s and 3 s over 10 s
    assert clock.estimate(_start(32, requests=None, duration_s=10)) == pytest.approx(13.0)


def test_the_line_says_where_the_search_is_and_that_it_estimates() -> None:
    clock = ProbeClock(started=time.monotonic() - 70)
    clock.measured.append((32.0, 64, 1, 16.0))  # 0.25 s a request
    line = clock.line(ProbeStart(index=2, extension=0, load=64, label="c=64", requests=100,
                                 duration_s=None, probes_left_at_most=5, max_extensions=3)).plain
    assert line == ("probe 3: c=64, 100 requests (about 25 s; 1 min 10 s so far, about 2 min "
                    "left at most; estimates from the probes so far)")
    again = clock.line(ProbeStart(index=2, extension=1, load=64, label="c=64", requests=100,
                                  duration_s=None, probes_left_at_most=5, max_extensions=3))
    assert again.plain.startswith("probe 3: c=64 measured again (2 of at most 4: its "
                                  "intervals straddle their targets), 100 more requests")


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration_text(s) for s in (0.2, 25, 59.6, 70, 442, 3599, 7500)] == [
        "under 1 s", "25 s", "1 min", "1 min 10 s", "7 min 20 s", "1 h", "2 h 5 min"]
