"""``tune --check`` says what a study will cost before it runs (issue 38, item 7): its launches,
races included (the most and a typical figure), and its wall time, from the study's settings or
from the launches of its earlier trials in the store. Nothing is launched and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanslate.store import Replicate, Store, TrialRecord, TrialStatus
from cleanslate.tune.estimate import estimate_study, launch_seconds
from cleanslate.tune.study import StudySpec
from tests._kit import study_yaml
from tests.cli.inproc import run_main

RACED = {"name": "raced", "space": {"max-running-requests": [32, 64, 128]},
         "concurrency": [2, 4], "requests_per_level": None, "duration_s_per_level": 2,
         "statistics": {"replicates": "auto", "max_replicates": 3}}


def _spec(**overrides: object) -> StudySpec:
    import yaml

    return StudySpec.model_validate(yaml.safe_load(study_yaml(**{**RACED, **overrides})))


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
           store: str) -> str:
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml(**RACED))
    done = run_main(capsys, monkeypatch, "tune", str(study), "--check", "--store", store)
    assert done.code == 0, done.out + done.err
    return " ".join(done.out.split())


def test_the_launches_count_the_races_and_the_time_the_levels_and_timeouts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "none.db"
    text = _check(tmp_path, capsys, monkeypatch, f"sqlite:///{store}")
    # 3 once each; at most the 2 after the first raced for 3 pairs (2 more pairs, 4 launches)
    # each: 3 + 2 x 4 = 11; typically 1.43-2.35 x 3. The levels: 2 levels of 2 s; the timeouts
    # of study_yaml: ready 30 + smoke 10 + grace 5 + verify 20 = 65 s more a launch at most:
    # 3 x 4 s = 12 s to 11 x 69 s = 12.65 min.
    assert ("3 configurations; 3-11 launches (races included; about 5-8 typically); 12 s to "
            "13 min (the levels take 4 s a launch; its start, smoke test and teardown up to the "
            "study's timeouts); an estimate") in text
    assert "nothing was launched (--check)" in text
    assert not store.exists()  # --check writes nothing, and makes no store


def test_earlier_launches_of_the_study_in_the_store_give_the_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/cs.db"
    store = Store(url)
    t0 = 1_000_000.0
    store.save_trial(TrialRecord(
        study="raced", number=0, params={}, status=TrialStatus.FEASIBLE, run_id="r-1",
        started_at=t0, finished_at=t0 + 20, replicates=(
            # the first measurement is replicate 0 too (the same run): counted once
            Replicate(index=0, seed=0, status=TrialStatus.FEASIBLE, run_id="r-1",
                      started_at=t0, finished_at=t0 + 20),
            Replicate(index=1, seed=1, status=TrialStatus.FEASIBLE, run_id="r-2",
                      started_at=t0 + 20, finished_at=t0 + 50),)))
    # refused by a host that was not clean: nothing launched, not a launch's time
    store.save_trial(TrialRecord(study="raced", number=1, params={},
                                 status=TrialStatus.INFRA_FAILED, started_at=t0 + 50,
                                 finished_at=t0 + 51))
    store.close()
    text = _check(tmp_path, capsys, monkeypatch, url)
    # 20 s and 30 s: 25 s a launch, 3 to 11 launches
    assert ("3-11 launches (races included; about 5-8 typically); about 1 min 20 s to 4 min 40 "
            "s (at 25 s a launch, the mean of 2 earlier launches of this study); an estimate"
            ) in text


def test_fixed_replicates_are_counted_exactly_and_unknown_levels_say_so() -> None:
    fixed = estimate_study(_spec(statistics={"replicates": 3}))
    assert (fixed.launches_min, fixed.launches_max, fixed.launches_typical) == (9, 9, None)
    by_requests = estimate_study(_spec(duration_s_per_level=None, requests_per_level=40))
    assert by_requests.wall_s_low is None and by_requests.wall_s_high is None
    measured = estimate_study(_spec(duration_s_per_level=None, requests_per_level=40),
                              [10.0, 30.0])
    assert (measured.launch_s, measured.wall_s_low, measured.wall_s_high) == (20.0, 60.0, 220.0)


def test_launch_seconds_are_those_of_launches_that_gave_a_result() -> None:
    done = TrialRecord(study="s", number=0, params={}, status=TrialStatus.INFEASIBLE,
                       run_id="r-1", started_at=100.0, finished_at=112.5)
    running = TrialRecord(study="s", number=1, params={}, run_id="r-2", started_at=100.0)
    assert launch_seconds([done, running]) == [12.5]
