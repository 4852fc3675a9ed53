"""Engines that do not say they died (issue 28): a server that exits 0 by itself mid-level (vLLM's
API server after its engine core died, vllm PR #52178) is ``crashed``, never ``stopped``, and a
server whose ``/health`` stays 200 while it writes only ``!`` (vllm#53480) is bad output; both
name the level. Real simulated servers through :func:`run_trial`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.hosts import executor_for
from cleanslate.store import RunRecord, Store, TrialRecord
from cleanslate.tune import trial as trial_mod
from cleanslate.tune.study import StudySpec, load_study
from tests._kit import study_yaml

#: Requests the server gets before the first level: the smoke test's, two prompts to each of
#: the sim's two endpoints, plain and streamed (the study has no warm-up; checked below).
BEFORE_LEVELS = 8
PER_LEVEL = 8


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Store]]:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    yield tmp_path, store
    for run in store.runs():  # a failing test does not leave its server behind
        if run.status in ("starting", "ready"):
            asyncio.run(trial_mod.stop_server(executor_for(None), store, run, grace_s=2,
                                              verify_deadline_s=10))


def _trial(lab: tuple[Path, Store], fault: str, monkeypatch: pytest.MonkeyPatch, **study: Any
           ) -> tuple[TrialRecord, RunRecord, StudySpec]:
    root, store = lab
    smoke: list[int] = []
    real_start = trial_mod.start_server

    async def start_server(*args: Any, **kwargs: Any) -> Any:
        outcome = await real_start(*args, **kwargs)
        smoke.append(len(outcome.smoke.outputs) if outcome.smoke is not None else 0)
        return outcome

    monkeypatch.setattr(trial_mod, "start_server", start_server)
    path = root / "study.yaml"
    path.write_text(study_yaml(**{
        "name": "exits", "space": {"fault": [fault]}, "concurrency": [2, 4],
        "requests_per_level": PER_LEVEL, "warmup": 0,
        "workload": {"kind": "random", "input_len": 32, "output_len": 16}, **study}))
    spec, _root = load_study(path)
    lines: list[str] = []
    record = asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0,
                                             {"fault": fault}, gpu_backend="sim",
                                             say=lines.append))
    print("\n".join(lines))
    assert smoke == [BEFORE_LEVELS], "the smoke test sent another number of requests"
    (run,) = store.runs(study=spec.name)
    print(f"trial: {record.status} {record.cause} {record.level_verdicts} {record.detail}")
    print(f"run: {run.status} {run.cause} {run.detail}")
    return record, run, spec


def test_a_server_that_exits_0_mid_level_is_crashed_at_that_level(
        lab: tuple[Path, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    # The first level's requests and 3 of the second's are served; the 4th ends the server.
    record, run, _spec = _trial(lab, f"exit-after={BEFORE_LEVELS + PER_LEVEL + 3}",
                                monkeypatch)
    assert record.level_verdicts == {"c=2": "ok", "c=4": "crashed"}
    # decided by its crash (issue 38): infeasible, the value of the level below it kept
    assert record.status == "infeasible" and record.best_level == "c=2"
    assert record.value is not None and record.crash_text == "crashed at c=4 (exited)"
    assert record.cause == "exited"
    assert record.detail is not None
    assert record.detail.startswith("c=4: the server exited with status 0 (server unreachable")
    assert run.status == "crashed", run
    assert run.cause == "exited" and run.detail == record.detail
    assert run.verdict_after is not None and run.verdict_after.verdict == "clean"


def test_a_server_that_answers_only_bangs_while_healthy_is_bad_output_at_that_level(
        lab: tuple[Path, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    record, run, _spec = _trial(lab, f"degenerate-after={BEFORE_LEVELS + PER_LEVEL}",
                                monkeypatch)
    assert record.level_verdicts == {"c=2": "ok", "c=4": "bad_output"}
    assert record.status == "feasible" and record.best_level == "c=2"
    assert record.cause == "bad_output"
    assert record.detail is not None
    (low, high) = record.levels
    assert low.bad_output is None and low.output_samples > 0 and not low.output_issues
    assert high.bad_output == "degenerate" and high.failed == 0
    n = high.output_samples
    assert n > 0 and high.output_issues == {"degenerate": n}
    assert record.detail.startswith(f"{n} of {n} sampled responses at c=4 show degenerate: "
                                    "degenerate: output is degenerate repetition: '!!!!")
    # The server was asked to stop: it did not end by itself.
    assert run.status == "stopped" and run.cause == "bad_output"
