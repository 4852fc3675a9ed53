"""The H200 capacity validation's recorded searches (docs/validation/h200-capacity.md), replayed.

Four `cleanslate bench --find-max concurrency --slo p99_tpot_ms=200` runs against `transformers
serve` on one H200, two on each of two machines, each on a new server: the JSON they wrote is
checked against the search's core, so the page's claims hold for the data kept beside it and for
the code as it is now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench._capacity import (
    CapacityResult,
    CapacitySearch,
    ProbeVerdict,
    StopReason,
    judge,
)

DATA = Path(__file__).resolve().parents[2] / "docs" / "validation"
# Per machine (A, then B: another fresh machine, another session), its two searches.
SESSIONS = (("h200-capacity-s1.json", "h200-capacity-s2.json"),
            ("h200-capacity-m2-s1.json", "h200-capacity-m2-s2.json"))
RUNS = tuple(name for session in SESSIONS for name in session)
RECORDS = ("h200-capacity-run.json", "h200-capacity-m2-run.json")


def _doc(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DATA / name).read_text(encoding="utf-8"))
    return doc


def _result(name: str) -> CapacityResult:
    return CapacityResult.model_validate(_doc(name)["find_max"])


@pytest.mark.parametrize("name", RUNS)
def test_each_probe_verdict_is_the_cores_verdict_on_its_level(name: str) -> None:
    result = _result(name)
    assert result.slo.limits == {"p99_tpot_ms": 200.0} and result.slo.attainment is None
    assert len(result.probes) == 4
    for probe in result.probes:
        assert probe.level is not None
        assert probe.requests >= result.slo.min_requests() == 381
        verdict, checks = judge(probe.level, result.slo)
        assert verdict == probe.verdict
        assert [(c.met, c.n, c.decision) for c in checks] == [
            (c.met, c.n, c.decision) for c in probe.checks]
        # The verdict agrees with the statistic itself: a pass had every request's TPOT under
        # the limit (so its p99 too), a fail a p99 above it.
        p99 = probe.level.model_dump()["p99_tpot_ms"]
        assert (p99 <= 200.0) == (probe.verdict == ProbeVerdict.PASS)


@pytest.mark.parametrize("name", RUNS)
def test_replaying_the_verdicts_gives_the_same_probes_and_bracket(name: str) -> None:
    recorded = _result(name)
    search = CapacitySearch("concurrency", recorded.slo, start=recorded.start,
                            max_load=recorded.max_load, tolerance=recorded.tolerance)
    loads = []
    for probe in recorded.probes:
        load = search.next_load()
        assert load == probe.load
        loads.append(load)
        search.record(probe)
    assert search.next_load() is None
    replayed = search.result()
    assert loads == [128.0, 256.0, 192.0, 224.0]
    assert (replayed.capacity, replayed.upper, replayed.stopped_by) == (
        recorded.capacity, recorded.upper, StopReason.TOLERANCE)
    assert not replayed.unresolved and replayed.crash is None and not replayed.cliffs
    # No load above the capacity passed.
    assert recorded.capacity is not None
    assert all(not p.passed for p in recorded.probes if p.load > recorded.capacity)


@pytest.mark.parametrize("session", SESSIONS)
def test_the_two_searches_of_one_session_overlap(session: tuple[str, str]) -> None:
    first, second = (_result(name) for name in session)
    assert (first.capacity, first.upper) == (second.capacity, second.upper) == (224.0, 256.0)
    assert first.upper is not None and second.upper is not None
    assert first.capacity is not None and second.capacity is not None
    assert max(first.capacity, second.capacity) < min(first.upper, second.upper)
    seeds = {_doc(name)["seed"] for name in session}
    assert seeds == {0, 100000}  # other prompts in the second search


def test_the_second_machines_brackets_overlap_the_first_machines() -> None:
    results = [_result(name) for name in RUNS]
    lows = [r.capacity for r in results]
    highs = [r.upper for r in results]
    assert all(x is not None for x in lows) and all(x is not None for x in highs)
    assert max(x for x in lows if x is not None) < min(x for x in highs if x is not None)
    # Two machines: each session's record names its own commit and servers.
    records = [_doc(name) for name in RECORDS]
    assert len({r["commit"] for r in records}) == 2
    assert not ({c["serve"]["run_id"] for c in records[0]["cycles"]}
                & {c["serve"]["run_id"] for c in records[1]["cycles"]})


@pytest.mark.parametrize("record", RECORDS)
def test_the_run_record_names_the_commit_and_two_clean_cycles(record: str) -> None:
    run = _doc(record)
    assert len(run["commit"]) == 40
    assert any(run["commit"] in line for line in run["env"])
    serves = [c["serve"] for c in run["cycles"]]
    stops = [c["stop"] for c in run["cycles"]]
    assert len({s["run_id"] for s in serves}) == 2  # two servers
    for serve, stop in zip(serves, stops, strict=True):
        assert serve["verdict_before"]["verdict"] == "clean"
        assert "--cb-max-memory-percent" in serve["argv"] and "0.3" in serve["argv"]
        assert "--cb-use-cuda-graph" in serve["argv"]
        assert stop["verify"]["verdict"] == "clean" and not stop["survivors"]
