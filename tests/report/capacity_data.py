"""Capacity studies built in code and saved to a real SQLite store: what a study whose objective
is ``max_concurrency_under_slo`` records (``TrialRecord.capacity``, the probes' levels in probe
order), without a server.

Each trial drives the real :class:`cleanslate.bench.CapacitySearch` (SLO ``p90_tpot_ms: 6``,
start 8, tolerance 10 %); each probe is a real :class:`LevelResult` (a recorded sim level with
its label, load, throughput and counts changed) judged by :func:`probe_from_level` on the
Wilson interval of its counts, so the verdicts, intervals and brackets are the core's own.

``cap`` (a grid over ``max-running-requests``):

- #0 (512): the lead's demonstration: c=8, 16, 32 pass; 64, 48, 40 fail; 36 passes; 38
  straddles, is extended once and passes: ``c=38 [38, 40)``, 8 probes;
- #1 (256): c=8 and 16 pass, the server crashes at c=32 (``cuda_error``): ``c=16 [16, 32)``;
- #2 (128): c=8, 16 pass, 32 passes with a throughput cliff, 64 stays unresolved after three
  extensions, 48 fails, 40 and 44 pass: ``c=44 [44, 48)``, the best;
- #3 (64): nothing passes down to c=1: infeasible (``nothing_passes``).

``cap-race`` (``replicates: 3``): two configurations, each searched three times on seeds
11-13 (every replicate a search of its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cleanslate.bench import CapacityResult, CapacitySearch, CapacitySLO, LevelResult
from cleanslate.bench._capacity import ProbeVerdict, probe_from_level
from cleanslate.store import Store, TrialRecord
from cleanslate.store._trials import LevelVerdict, Replicate, StudyStatus, TrialStatus
from cleanslate.tune.race import summarize

DATA = Path(__file__).parent / "data" / "stores.json"
SLO = CapacitySLO(limits={"p90_tpot_ms": 6.0})
KEY = "p90_tpot_ms"
N = 200  # requests of one measurement

#: A probe's outcome by its load: the requests within the limit in each measurement (one
#: entry per measurement: an extension adds one), its output tokens/s, and a crash.
Outcome = tuple[tuple[int, ...], float, tuple[str, str] | None]

VERDICT = {ProbeVerdict.PASS: LevelVerdict.OK, ProbeVerdict.FAIL: LevelVerdict.SLO_MISS,
           ProbeVerdict.UNRESOLVED: LevelVerdict.UNRESOLVED,
           ProbeVerdict.CRASHED: LevelVerdict.CRASHED, ProbeVerdict.ERRORS: LevelVerdict.ERRORS,
           ProbeVerdict.BAD_OUTPUT: LevelVerdict.BAD_OUTPUT,
           ProbeVerdict.INTERRUPTED: LevelVerdict.INTERRUPTED}

DEMO: dict[int, Outcome] = {
    8: ((200,), 1000.0, None), 16: ((199,), 1900.0, None), 32: ((192,), 3400.0, None),
    64: ((40,), 3600.0, None), 48: ((120,), 3550.0, None), 40: ((170,), 3500.0, None),
    36: ((190,), 3450.0, None), 38: ((186, 189), 3480.0, None),
}
CRASH: dict[int, Outcome] = {
    8: ((200,), 1000.0, None), 16: ((198,), 1850.0, None),
    32: ((120,), 900.0, ("cuda_error", "CUDA error: an illegal memory access was "
                                      "encountered")),
}
CLIFF: dict[int, Outcome] = {
    8: ((200,), 1000.0, None), 16: ((199,), 1900.0, None), 32: ((196,), 1200.0, None),
    64: ((182, 181, 180, 182), 1500.0, None), 48: ((150,), 1400.0, None),
    40: ((195,), 1300.0, None), 44: ((193,), 1350.0, None),
}
NOTHING: dict[int, Outcome] = {c: ((100,), 500.0, None) for c in (8, 4, 2, 1)}


def _base_level() -> dict[str, Any]:
    data = json.loads(DATA.read_text())
    return dict(data["studies"][0]["trials"][0]["levels"][1])


def level(load: int, met: int, n: int, throughput: float, *, partial: bool = False,
          seed: int = 0) -> LevelResult:
    """A recorded sim level as the probe at ``load``: ``met`` of ``n`` requests within the
    limit."""
    base = LevelResult.model_validate(_base_level())
    data = {**base.model_dump(), "label": f"c={load}", "completed": n,
            "sent": n + base.failed, "num_prompts": n,
            "output_throughput": throughput, "good_requests": met,
            "p90_tpot_ms": 5.0 if met >= 0.9 * n else 7.5, "max_concurrency": load,
            "partial": partial, "partial_reason": "the server closed the connection"
            if partial else None, "seed": seed}
    out = LevelResult.model_validate(data)
    return out.model_copy(update={"load": out.load.model_copy(update={"concurrency": load}),
                                  "limit_counts": {KEY: (met, n)}})


def search(outcomes: Callable[[int], Outcome], per: int = N
           ) -> tuple[CapacityResult, tuple[LevelResult, ...]]:
    """Drive the core's search to its end on ``outcomes`` (``per`` requests a measurement):
    its result (probes without their levels, as the store keeps them) and the probes' levels
    in probe order."""
    s = CapacitySearch("concurrency", SLO, start=8, max_load=4096, tolerance=0.1)
    levels: list[LevelResult] = []
    while (load := s.next_load()) is not None:
        mets, tput, crash = outcomes(int(load))
        n = per * len(mets)
        lv = level(int(load), sum(mets), n, tput, partial=crash is not None)
        probe = probe_from_level(len(s.probes), "concurrency", load, lv, SLO,
                                 measurements=len(mets), crash=crash)
        s.record(probe)
        levels.append(lv)
    return s.result().without_levels(), tuple(levels)


def capacity_trial(study: str, number: int, mrr: int,
                   outcomes: dict[int, Outcome] | Callable[[int], Outcome], *, per: int = N,
                   **extra: Any) -> TrialRecord:
    """A trial as a capacity objective records it: levels in probe order, a verdict per probe,
    the search's answer, the capacity as its value."""
    result, levels = search(outcomes if callable(outcomes) else outcomes.__getitem__, per)
    best = next((p.label for p in result.probes if p.passed and p.load == result.capacity),
                None)
    feasible = result.capacity is not None
    return TrialRecord(
        study=study, number=number, params={"max-running-requests": mrr},
        status=TrialStatus.FEASIBLE if feasible else TrialStatus.INFEASIBLE,
        cause=None if feasible else result.stopped_by.value, detail=result.summary(),
        value=result.capacity, best_level=best, levels=levels,
        level_verdicts={p.label: VERDICT[p.verdict] for p in result.probes},
        capacity=result, argv=("sim-server", "--max-running-requests", str(mrr)),
        gpu_s=60.0, finished_at=1.0, **extra)


def spec_of(name: str, space: list[int], statistics: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    data = json.loads(DATA.read_text())
    spec = dict(data["studies"][1]["study"]["spec"])
    spec.pop("concurrency")
    spec.pop("baseline")
    spec.update({"name": name, "strategy": "grid",
                 "space": {"max-running-requests": space},
                 "objective": {"maximize": "max_concurrency_under_slo"},
                 "slo": {"tpot_p90_ms": 6.0},
                 "capacity": {"start": 8, "tolerance": 0.1}})
    if statistics is not None:
        spec["statistics"] = statistics
    return spec


def cap_trials() -> list[TrialRecord]:
    return [capacity_trial("cap", 0, 512, DEMO), capacity_trial("cap", 1, 256, CRASH),
            capacity_trial("cap", 2, 128, CLIFF), capacity_trial("cap", 3, 64, NOTHING)]


def shifted(fail_from: int) -> Callable[[int], Outcome]:
    """Every load below ``fail_from`` passes (198 of 200), every other fails (100 of 200)."""
    def at(c: int) -> Outcome:
        return ((198,), 100.0 * c, None) if c < fail_from else ((100,), 90.0 * c, None)
    return at


#: ``cap-race``: per configuration, the load each replicate's server starts failing at.
RACE_BOUNDARIES = {0: [40, 38, 40], 1: [40, 40, 38]}
RACE_SEEDS = [11, 12, 13]


def race_trials() -> list[TrialRecord]:
    out = []
    for number, bounds in RACE_BOUNDARIES.items():
        reps = []
        first: tuple[CapacityResult, tuple[LevelResult, ...]] | None = None
        for i, (bound, seed) in enumerate(zip(bounds, RACE_SEEDS, strict=True)):
            result, levels = search(shifted(bound))
            first = first or (result, levels)
            reps.append(Replicate(
                index=i, seed=seed, status=TrialStatus.FEASIBLE, value=result.capacity,
                best_level=result.label(result.capacity), levels=() if i == 0 else levels,
                level_verdicts={p.label: VERDICT[p.verdict] for p in result.probes},
                capacity=result, gpu_s=60.0, slot="local/gpus=0/port=30000"))
        assert first is not None
        result, levels = first
        record = TrialRecord(
            study="cap-race", number=number, params={"max-running-requests": 128 * (number + 1)},
            status=TrialStatus.FEASIBLE, value=result.capacity,
            best_level=result.label(result.capacity), levels=levels,
            level_verdicts={p.label: VERDICT[p.verdict] for p in result.probes},
            capacity=result, replicates=tuple(reps), gpu_s=60.0,
            slot="local/gpus=0/port=30000", finished_at=1.0)
        out.append(summarize(record, 0.95))
    return out


def save(url: str) -> None:
    """Write ``cap`` and ``cap-race`` into the store at ``url``."""
    store = Store(url)
    try:
        store.save_study("cap", spec_of("cap", [512, 256, 128, 64]), StudyStatus.FINISHED)
        for record in cap_trials():
            store.save_trial(record)
        store.save_study("cap-race", spec_of("cap-race", [128, 256], {"replicates": 3}),
                         StudyStatus.FINISHED)
        for record in race_trials():
            store.save_trial(record)
    finally:
        store.close()
