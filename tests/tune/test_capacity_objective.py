"""A study whose objective is a capacity (``maximize: max_concurrency_under_slo`` or
``max_goodput``): each trial runs the capacity search (:mod:`cleanslate.bench._capacity`) on its
server, so its levels are the search's probes; a crash at a probe ends the search with the
capacity below it; a replicate runs the whole search again on a new server; the study file's
capacity keys are validated at their line (exit 2).

The sim study: two configurations of the quick start's space (CUDA graphs on or off) with
``cuda-graph-max-bs: 16``, so that the graphs' configuration crashes at the first decode batch
above 16 (c=32: the sim's eager-path AttributeError), while the eager one is bounded by its
p90 TPOT SLO (c=60 [60, 64) on this machine, one run)."""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench import (
    CapacityResult,
    CapacitySearch,
    CapacitySLO,
    Probe,
    ProbeVerdict,
    StopReason,
)
from cleanslate.errors import InputError
from cleanslate.stats import Outcome
from cleanslate.store._trials import Replicate, TrialRecord, TrialStatus
from cleanslate.tune._systemic import systemic_failure
from cleanslate.tune.race import compare, grid_noise, summarize, tie_set
from cleanslate.tune.study import StudySpec, load_study
from cleanslate.tune.trial import PROBE_LEVEL_VERDICTS, capacity_fields
from tests._kit import alive, free_port
from tests.conftest import Processes, run_cli

ROOT = Path(__file__).resolve().parents[2]

STUDY = """\
name: capacity-sim
engine: sim
model: sim
port: {port}
gpus: [0]
fixed: {{tp-size: 1, time-scale: 0.1, cuda-graph-max-bs: 16, max-running-requests: 512}}
space:
  disable-cuda-graph: [true, false]
strategy: grid
workload: {{kind: random, input_len: 128, output_len: 16}}
objective: {{maximize: max_concurrency_under_slo}}
slo: {{tpot_p90_ms: 5}}
capacity: {{start: 8, max_probes: 12, max_extensions: 1}}
statistics: {{replicates: 2}}
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
"""


def _rows(db: Path, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(r[0]) for r in conn.execute(f"select data from {table} order by id")]


@pytest.mark.slow  # one whole study: two configurations, each measured twice (four cycles)
def test_a_capacity_study_on_the_sim(tmp_path: Path) -> None:
    study = tmp_path / "capacity.yaml"
    study.write_text(STUDY.format(port=free_port()))
    db = tmp_path / "s.db"
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    res = run_cli("tune", str(study), "--store", f"sqlite:///{db}",
                  env={"CLEANSLATE_SIM_GPU_DIR": str(gpus)}, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    spec, _ = load_study(study)
    trials = [TrialRecord.model_validate(t) for t in _rows(db, "cs_trials")]
    by_graphs = {t.params["disable-cuda-graph"]: t for t in trials}
    eager, graphs = by_graphs[True], by_graphs[False]
    for t in trials:
        cap = t.capacity
        assert cap is not None and t.status == TrialStatus.FEASIBLE, t
        # The levels are the probes, in probe order, each with its verdict.
        assert [lv.label for lv in t.levels] == [p.label for p in cap.probes]
        assert t.level_verdicts == {p.label: PROBE_LEVEL_VERDICTS[p.verdict]
                                    for p in cap.probes}
        assert all(p.level is None for p in cap.probes)  # kept once, as the trial's levels
        assert cap.probes[0].load == spec.capacity.start
        # Each probe's level carries its bottleneck verdict, read with the run record's
        # configuration (the flags asked are known: not a bare URL's read).
        assert all(lv.bottleneck is not None for lv in t.levels)
        assert cap.server_config is not None and cap.server_config.requested_known
        assert t.detail == cap.summary()
        assert t.verdict_before == "clean" and t.verdict_after == "clean", t
        # Two measurements, each a whole search on a new server, the same seeds for both
        # configurations; the trial's value is their mean.
        assert [r.seed for r in t.replicates] == [0, 1]
        assert t.replicates[0].capacity == cap  # the first measurement's own search
        later = t.replicates[1]
        assert later.capacity is not None and later.capacity.probes[0].load == 8
        assert later.value == later.capacity.capacity
        assert later.run_id != t.run_id
        assert t.value == pytest.approx(sum(r.value or 0 for r in t.replicates) / 2)
    # The graphs' configuration: crashed at c=32 with its cause, the capacity below it.
    for cap, verdicts in ((graphs.capacity, graphs.level_verdicts),
                          *((r.capacity, r.level_verdicts) for r in graphs.replicates[1:])):
        assert cap is not None
        assert cap.stopped_by == "crashed" and cap.capacity == 16 and cap.upper == 32
        assert cap.crash is not None and cap.crash.startswith(
            "crashed at c=32 (python_exception: AttributeError")
        assert verdicts["c=32"] == "crashed"
        crashed = [lv.bottleneck for lv in graphs.levels if lv.label == "c=32"]
        assert cap is not graphs.capacity or [b.verdict for b in crashed if b] == ["crashed"]
        assert not any(p.passed for p in cap.probes if p.load >= 32)
    assert graphs.cause == "python_exception" and graphs.best_level == "c=16"
    assert "crashed at c=32 (python_exception" in (graphs.detail or "")
    # the crash first, the answer below it standing (issue 38 item 3)
    assert graphs.crash_text == "crashed at c=32 (python_exception)"
    assert "crashed at c=32 (python_exception); feasible c=16 [16, 32)" in res.stdout
    runs = {r["id"]: r for r in _rows(db, "cs_runs")}
    assert runs[graphs.run_id]["status"] == "crashed"
    assert "page_table_1_flattened" in (graphs.log_tail or "")
    # The eager configuration: bounded by its SLO, the bracket within the tolerance.
    cap = eager.capacity
    assert cap is not None
    assert cap.stopped_by == "tolerance" and cap.crash is None, cap.summary() + " ".join(
        f"{p.label}:{p.verdict.value}" for p in cap.probes)
    assert cap.capacity is not None and cap.upper is not None and cap.capacity > 16
    assert cap.upper - cap.capacity <= max(1.0, spec.capacity.tolerance * cap.capacity)
    assert eager.best_level == f"c={int(cap.capacity)}" and eager.cause is None
    assert runs[eager.run_id]["status"] == "stopped"
    # The best is the configuration with the most capacity.
    best = tie_set(trials, spec).best
    assert best is not None and best.number == max(trials, key=lambda t: t.value or 0).number
    assert best.number == eager.number


INTERRUPTED = """\
name: capacity-stop
engine: sim
model: sim
port: {port}
gpus: [0]
fixed: {{tp-size: 1, time-scale: 0.1, disable-cuda-graph: true}}
space:
  max-running-requests: [512]
strategy: grid
workload: {{kind: random, input_len: 128, output_len: 64}}
objective: {{maximize: max_concurrency_under_slo}}
slo: {{tpot_p90_ms: 1000}}
capacity: {{start: 8, max_load: 4096}}
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
"""


@pytest.mark.slow  # a study stopped during its search: one cycle and its teardown
def test_a_stop_during_the_search_ends_it_and_tears_down(tmp_path: Path,
                                                         procs: Processes) -> None:
    """SIGTERM to ``tune`` while a trial's search probes (an SLO nothing misses, so it would
    double up to c=4096): the search ends at once, the server is torn down and verified, and
    the trial is ``infra_failed`` (``interrupted``), not a result."""
    study = tmp_path / "stop.yaml"
    study.write_text(INTERRUPTED.format(port=free_port()))
    db = tmp_path / "s.db"
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    log = tmp_path / "tune.out"
    with log.open("wb") as out:
        controller = procs.start([sys.executable, "-m", "cleanslate", "tune", str(study),
                                  "--store", f"sqlite:///{db}"], stdout=out,
                                 env={**os.environ, "CLEANSLATE_SIM_GPU_DIR": str(gpus)})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "c=16: pass" not in log.read_text():
        time.sleep(0.1)
    assert "c=16: pass" in log.read_text(), log.read_text()  # two probes decided
    stopped_at = time.monotonic()
    controller.send_signal(signal.SIGTERM)
    controller.wait(timeout=60)
    assert time.monotonic() - stopped_at < 30
    (trial,) = [TrialRecord.model_validate(t) for t in _rows(db, "cs_trials")]
    assert (trial.status, trial.cause) == (TrialStatus.INFRA_FAILED, "interrupted"), \
        (trial.cause, trial.detail)
    assert trial.value is None and trial.verdict_after == "clean"
    assert {"level_c=8_s", "level_c=16_s"} <= set(trial.phases)
    assert not any(k.startswith("level_c=4096") for k in trial.phases)
    (run,) = _rows(db, "cs_runs")
    assert run["status"] == "stopped" and run["verdict_after"]["verdict"] == "clean", \
        (run["status"], trial.detail)
    assert not alive(run["pid"])


# --- the study file ------------------------------------------------------------------------

BASE = """\
name: v
engine: sim
model: sim
port: 31999
gpus: [0]
space:
  disable-cuda-graph: [true, false]
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
objective: {maximize: max_concurrency_under_slo}
slo: {tpot_p90_ms: 5}
"""


def _load(tmp_path: Path, text: str) -> StudySpec:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return load_study(path)[0]


def _refused(tmp_path: Path, text: str) -> tuple[str, int]:
    """The message of the study's refusal and the line it names."""
    path = tmp_path / "study.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_study(path)
    where = caught.value.where or ""
    assert where.startswith(f"{path}:"), where
    return caught.value.message, int(where.rsplit(":", 1)[1])


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_a_capacity_study_loads_with_the_search_s_defaults(tmp_path: Path) -> None:
    spec = _load(tmp_path, BASE)
    assert spec.objective.capacity and spec.concurrency == []
    c = spec.capacity
    assert (c.start, c.max_load, c.tolerance, c.attainment, c.max_probes, c.max_extensions,
            c.cliff) == (8, 4096, 0.10, None, 16, 3, 0.2)
    assert spec.capacity_slo().limits == {"p90_tpot_ms": 5.0}
    assert spec.warmup_requests() == 8  # one per slot of the start, at least 8
    search = spec.capacity_search()
    assert (search.next_load(), search.max_load, search.tolerance) == (8.0, 4096.0, 0.1)
    spec = _load(tmp_path, BASE.replace("slo: {tpot_p90_ms: 5}",
                                        "slo: {tpot_p99_ms: 50, ttft_p99_ms: 900}\n"
                                        "capacity: {start: 32, attainment: 0.95}"))
    assert spec.capacity_slo().limits == {"tpot_ms": 50.0, "ttft_ms": 900.0}
    assert spec.capacity_slo().attainment == 0.95 and spec.warmup_requests() == 32
    goodput = _load(tmp_path, BASE.replace("max_concurrency_under_slo", "max_goodput"))
    assert goodput.objective.capacity


@pytest.mark.parametrize(("change", "needle", "message"), [
    (("slo: {tpot_p90_ms: 5}\n", ""), "objective:", "give slo:"),
    (("maximize: max_concurrency_under_slo", "minimize: max_concurrency_under_slo"),
     "objective:", "it is maximized"),
    (("maximize: max_concurrency_under_slo", "minimize: max_goodput"),
     "objective:", "it is maximized"),
    (("slo:", "concurrency: [8, 16]\nslo:"), "concurrency:", "searches the load itself"),
    (("slo:", "capacity: {startt: 4}\nslo:"), "capacity:", "startt"),
    (("slo:", "capacity: {start: 100, max_load: 10}\nslo:"), "capacity:", "above max_load"),
    (("slo:", "capacity: {tolerance: 1.5}\nslo:"), "capacity:", "tolerance"),
    (("slo:", "capacity: {max_probes: 0}\nslo:"), "capacity:", "max_probes"),
    (("slo: {tpot_p90_ms: 5}", "slo: {itl_p90_ms: 5}\ncapacity: {attainment: 0.9}"),
     "slo:", "ITL has none"),
    (("maximize: max_concurrency_under_slo", "maximize: output_throughput"),
     "objective:", "give the levels of every trial"),
])
def test_capacity_mistakes_are_refused_at_their_line(tmp_path: Path, change: tuple[str, str],
                                                     needle: str, message: str) -> None:
    text = BASE.replace(*change)
    found, line = _refused(tmp_path, text)
    assert message in found, found
    assert line == _line(text, needle), (found, line)


def test_the_command_line_exits_2_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(BASE.replace("slo: {tpot_p90_ms: 5}\n", ""))
    res = run_cli("tune", str(path), "--check")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{path}:{_line(BASE, 'objective:')}" in res.stderr and "give slo:" in res.stderr
    assert "Traceback" not in res.stderr


def test_the_example_study_loads_and_its_plan_names_the_search() -> None:
    spec, _ = load_study(ROOT / "examples" / "capacity.yaml")
    assert spec.objective.metric == "max_concurrency_under_slo" and spec.slo
    assert spec.planned_count() == 4
    res = run_cli("tune", str(ROOT / "examples" / "capacity.yaml"), "--check")
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert (f"capacity search from c={spec.capacity.start} up to c={spec.capacity.max_load} "
            f"(tolerance 10%, at most {spec.capacity.max_probes} probes)") in out, out


# --- a trial's result from its search ------------------------------------------------------


def _probe(index: int, load: float, verdict: ProbeVerdict, goodput: float | None = None,
           cause: str | None = None) -> Probe:
    return Probe(index=index, load=load, label=f"c={int(load)}", verdict=verdict,
                 request_goodput=goodput, cause=cause)


def _result(*probes: Probe) -> Any:
    search = CapacitySearch("concurrency", CapacitySLO(limits={"p90_tpot_ms": 5.0}), start=8)
    for p in probes:
        assert search.next_load() == p.load
        search.record(p)
    return search.result()


def test_capacity_fields_of_a_feasible_and_an_infeasible_search() -> None:
    spec = StudySpec.model_validate({
        "name": "v", "engine": "sim", "model": "sim", "space": {"x": [1]},
        "objective": {"maximize": "max_goodput"}, "slo": {"tpot_p90_ms": 5}})
    ok = _result(_probe(0, 8, ProbeVerdict.PASS, 10.0), _probe(1, 16, ProbeVerdict.PASS, 19.0),
                 _probe(2, 32, ProbeVerdict.FAIL), _probe(3, 24, ProbeVerdict.PASS, 21.0),
                 _probe(4, 28, ProbeVerdict.UNRESOLVED), _probe(5, 26, ProbeVerdict.PASS, 20.0))
    fields = capacity_fields(spec, ok, None)
    assert fields["status"] == TrialStatus.FEASIBLE and fields["cause"] is None
    assert fields["value"] == 21.0  # max_goodput: the most goodput of a passing probe
    assert fields["best_level"] == "c=26"  # the capacity probe
    assert fields["capacity"].capacity == 26 and fields["capacity"].upper == 28
    assert "unresolved (never counted as passing): c=28" in fields["detail"]
    none = _result(_probe(0, 8, ProbeVerdict.FAIL), _probe(1, 4, ProbeVerdict.FAIL),
                   _probe(2, 2, ProbeVerdict.FAIL), _probe(3, 1, ProbeVerdict.FAIL))
    fields = capacity_fields(spec, none, None)
    assert (fields["status"], fields["cause"], fields["value"]) == (
        TrialStatus.INFEASIBLE, "nothing_passes", None)
    errors = _result(_probe(0, 8, ProbeVerdict.FAIL), _probe(1, 4, ProbeVerdict.FAIL),
                     _probe(2, 2, ProbeVerdict.FAIL),
                     _probe(3, 1, ProbeVerdict.ERRORS, cause="request_errors"))
    assert capacity_fields(spec, errors, None)["cause"] == "request_errors"
    crash = _result(_probe(0, 8, ProbeVerdict.CRASHED, cause="python_exception"))
    fields = capacity_fields(spec, crash, "python_exception")
    assert (fields["status"], fields["cause"]) == (TrialStatus.INFEASIBLE, "python_exception")


# --- racing on capacities ------------------------------------------------------------------


def _measured(number: int, values: Sequence[float]) -> TrialRecord:
    return TrialRecord(study="v", number=number, params={"x": number},
                       status=TrialStatus.FEASIBLE, value=values[0], replicates=tuple(
                           Replicate(index=i, seed=i, status=TrialStatus.FEASIBLE, value=v,
                                     slot="s") for i, v in enumerate(values)))


def _spec(objective: str) -> StudySpec:
    extra: dict[str, Any] = {"slo": {"tpot_p90_ms": 5}} if objective in (
        "max_concurrency_under_slo", "max_goodput") else {"concurrency": [8]}
    return StudySpec.model_validate({
        "name": "v", "engine": "sim", "model": "sim", "space": {"x": [1]},
        "objective": {"maximize": objective},
        "statistics": {"replicates": "auto", "max_replicates": 5, "tie_margin": 0.05},
        **extra})


def test_races_on_capacity_values() -> None:
    """Capacities move in the search's steps (about the tolerance, 10 %), so two measurements
    of a configuration often agree exactly and a race's pairs can have no spread at all. The
    grid's own noise (:func:`grid_noise`: a value anywhere in a bracket one step wide) is one
    degree of freedom of a capacity race's pooled noise: two pairs of 60 against 64 are no
    longer a win with an interval of zero width, four are; four equal answers tie (three do
    not yet); a step that comes and goes is never a win. (A throughput objective's two exact
    pairs were such a win too, until the spread's prior, ``tune.race.noise_prior``, gave every
    comparison an assumed spread.)"""
    capacity, throughput = _spec("max_concurrency_under_slo"), _spec("output_throughput")
    step = math.log1p(0.10)
    assert grid_noise(capacity) == pytest.approx((2 * step * step / 12, 1))
    assert grid_noise(throughput) is None
    a, b = _measured(0, [60, 60]), _measured(1, [64, 64])
    raw = compare(a, b, throughput)
    assert raw is not None and raw.outcome is None and raw.low is not None
    assert raw.low < 0 < (raw.high or 0)
    found = compare(a, b, capacity)
    assert found is not None and found.outcome is None  # measure another pair
    assert found.low is not None and found.low < 0 < (found.high or 0)
    four = compare(_measured(0, [60] * 4), _measured(1, [64] * 4), capacity)
    assert four is not None and four.outcome == Outcome.WIN
    assert four.diff == pytest.approx(64 / 60 - 1) and (four.low or 0) > 0
    three = compare(_measured(0, [38] * 3), _measured(1, [38] * 3), capacity)
    assert three is not None and three.outcome is None
    tie = compare(_measured(0, [38] * 4), _measured(1, [38] * 4), capacity)
    assert tie is not None and tie.outcome == Outcome.TIE
    mixed = [compare(_measured(0, [38, 36, 38, 40, 38][:n]),
                     _measured(1, [40, 38, 36, 38, 38][:n]), capacity) for n in range(2, 6)]
    assert all(m is not None and m.outcome != Outcome.WIN for m in mixed)


def test_equal_capacities_get_the_bracket_as_their_interval_not_zero_width() -> None:
    """Three searches that each answered c=136 [136, 144): the mean is 136 and its interval
    reaches the brackets' upper end (the boundaries measured lie anywhere up to 144), not
    "136 +- 0"; a throughput objective's equal values keep their Student-t interval."""
    def search(capacity: float, upper: float) -> CapacityResult:
        return CapacityResult(dimension="concurrency", slo=CapacitySLO(
            limits={"p90_tpot_ms": 5.0}), tolerance=0.1, start=8, max_load=4096,
            capacity=capacity, upper=upper, stopped_by=StopReason.TOLERANCE)

    trial = TrialRecord(study="v", number=0, params={"x": 0}, status=TrialStatus.FEASIBLE,
                        value=136, replicates=tuple(
                            Replicate(index=i, seed=i, status=TrialStatus.FEASIBLE, value=136,
                                      slot="s", capacity=search(136, 144)) for i in range(3)))
    found = summarize(trial, 0.95)
    assert (found.value, found.ci_low, found.ci_high) == (136, 136, 144)
    plain = summarize(_measured(0, [136, 136, 136]), 0.95)
    assert (plain.ci_low, plain.ci_high) == (136, 136)


def test_three_searches_where_nothing_passes_do_not_stop_the_study() -> None:
    """``nothing_passes`` is a flags' result like ``slo_miss`` (every configuration too slow
    for the SLOs): three in a row with the same summary are not taken for a failure that is
    not the configuration's (:mod:`cleanslate.tune._systemic`), while another cause still is."""
    def record(number: int, cause: str) -> TrialRecord:
        return TrialRecord(study="v", number=number, params={"x": number},
                           status=TrialStatus.INFEASIBLE, cause=cause,
                           detail="max concurrency within the SLOs: none (not even c=1) "
                                  f"({4 + number} probes, stopped: nothing_passes)")

    trials = [record(0, "nothing_passes"), record(1, "nothing_passes")]
    assert systemic_failure(trials, record(2, "nothing_passes")) is None
    other = [record(0, "exited"), record(1, "exited")]
    assert systemic_failure(other, record(2, "exited")) is not None
