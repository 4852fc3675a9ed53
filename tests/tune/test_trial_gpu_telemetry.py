"""A study's trial samples its run's GPUs through the run's executor (issue 36 item 3): every
level of a trial of the simulated engine carries the GPU telemetry of the study's GPU, unless
the study turns GPU telemetry off. A real simulated server, one trial."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cleanslate.hosts import executor_for
from cleanslate.store import Store
from cleanslate.tune import trial as trial_mod
from cleanslate.tune.study import load_study
from tests._kit import study_yaml


def test_the_trial_harness_watches_the_runs_gpus(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(study_yaml(name="harness", gpus=[0, 1]))
    spec, _ = load_study(path)
    executor = executor_for(None)
    assert len(trial_mod.trial_harness(None, executor, spec).observers) == 1
    assert trial_mod.trial_harness(None).observers == ()  # no executor: nothing to watch
    off = spec.model_copy(update={"observe": spec.observe.model_copy(
        update={"gpu_source": "off"})})
    assert trial_mod.trial_harness(None, executor, off).observers == ()
    named = spec.model_copy(update={"observe": spec.observe.model_copy(update={"gpus": (0,)})})
    assert trial_mod.trial_harness(None, executor, named).observers == ()  # the options' own


@pytest.mark.slow  # one verified sim trial: about 4 s
def test_a_trials_levels_carry_its_gpu_telemetry(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    path = tmp_path / "study.yaml"
    path.write_text(study_yaml(name="gpu", concurrency=[4], requests_per_level=16,
                               observe={"interval_s": 0.05}))
    spec, _ = load_study(path)
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    record = asyncio.run(trial_mod.run_trial(executor_for(None), store, spec, 0,
                                             {"max-running-requests": 32}, gpu_backend="sim",
                                             stop=asyncio.Event()))
    assert record.status == "feasible", record
    (level,) = record.levels
    assert level.gpu is not None, level
    (gpu,) = level.gpu
    assert gpu.index == 0 and gpu.source == "sim" and gpu.unreadable is None, gpu
    assert gpu.samples >= 3 and gpu.energy_j is not None and gpu.energy_j > 0
    assert gpu.joules_per_output_token is not None and gpu.joules_per_output_token > 0
    # stored and read back with the trial
    (stored,) = store.trials(spec.name)
    assert stored.levels[0].gpu == level.gpu
