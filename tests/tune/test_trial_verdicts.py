"""Missing verdicts are never clean: a trial or run without a readable check document reads as
``unknown``, and :func:`recover_host` stops again every run whose verdict is not clean."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cleanslate.store import RunRecord, Store
from cleanslate.tune import trial as trial_mod
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import _summary, recover_host, verdict_of


def _spec() -> StudySpec:
    return StudySpec.model_validate({
        "name": "v", "engine": "sim", "model": "sim", "space": {"fault": [None]},
        "concurrency": [1]})


def _run(run_id: str, **fields: Any) -> RunRecord:
    return RunRecord(id=run_id, host="local", engine="sim", model="sim", argv=("x",),
                     marker=f"m-{run_id}", port=1, url="http://127.0.0.1:1",
                     log_path="/nonexistent/log", artifacts_dir="/nonexistent", study="v",
                     **fields)


@pytest.mark.parametrize("document", [
    None, {}, {"hosts": []}, {"verdict": None}, {"verdict": "CLEANISH"}, {"verdict": 1},
    "clean", [],
])
def test_missing_or_unreadable_verdict_is_unknown(document: Any) -> None:
    assert verdict_of(document) == "unknown"
    verdict, findings = _summary(document)
    assert verdict == "unknown" and findings == ()


def test_a_readable_verdict_and_its_findings() -> None:
    doc = {"verdict": "dirty", "hosts": [{"findings": [
        {"severity": "error", "message": "a"}, {"severity": "info", "message": "b"},
        "not a finding"]}, "not a host"]}
    verdict, findings = _summary(doc)
    assert verdict == "dirty" and [f["message"] for f in findings] == ["a"]
    assert verdict_of({"verdict": "clean"}) == "clean"


def test_recover_host_stops_again_runs_whose_verdict_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.save_run(_run("clean", status="stopped", verdict_after={"verdict": "clean"}))
    store.save_run(_run("missing", status="stopped", verdict_after=None))
    store.save_run(_run("empty", status="stopped", verdict_after={}))
    store.save_run(_run("dirty", status="stopped", verdict_after={"verdict": "dirty"}))
    store.save_run(_run("ready", status="ready", verdict_after=None))
    stopped: list[str] = []

    async def fake_stop(_executor: Any, _store: Any, run: RunRecord, **_kw: Any) -> None:
        stopped.append(run.id)

    monkeypatch.setattr(trial_mod, "stop_server", fake_stop)

    class Local:
        name = "local"

    count = asyncio.run(recover_host(Local(), store, _spec(), lambda _m: None))  # type: ignore[arg-type]
    assert sorted(stopped) == ["dirty", "empty", "missing", "ready"]
    assert count == 4
