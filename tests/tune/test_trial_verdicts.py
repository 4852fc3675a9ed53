"""Missing verdicts are never clean: a check that did not run reads as ``unknown``, a stored check
document that is not a check report is an invalid record (never a verdict), and
:func:`recover_host` stops again every run that may be running or whose verdict is not clean."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from cleanslate.errors import InputError
from cleanslate.store import RunRecord, Store
from cleanslate.store._tables import RunRow
from cleanslate.tune import trial as trial_mod
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import _summary, recover_host, verdict_of
from cleanslate.verdict.check import CheckReport
from cleanslate.verdict.findings import Verdict
from tests.store.documents import check_report, finding


def _spec() -> StudySpec:
    return StudySpec.model_validate({
        "name": "v", "engine": "sim", "model": "sim", "space": {"fault": [None]},
        "concurrency": [1]})


def _run(run_id: str, **fields: Any) -> RunRecord:
    return RunRecord(id=run_id, host="local", engine="sim", model="sim", argv=("x",),
                     marker=f"m-{run_id}", port=1, url="http://127.0.0.1:1",
                     log_path="/nonexistent/log", artifacts_dir="/nonexistent", study="v",
                     **fields)


def test_a_check_that_did_not_run_is_unknown() -> None:
    assert verdict_of(None) == Verdict.UNKNOWN
    assert _summary(None) == (Verdict.UNKNOWN, ())


def test_a_verdict_and_its_error_and_unknown_findings() -> None:
    report = CheckReport.model_validate(check_report(
        "dirty", finding("a"), finding("b", severity="info"),
        finding("c", severity="unknown", kind="unreadable"), finding("d", severity="warning")))
    verdict, findings = _summary(report)
    assert verdict == Verdict.DIRTY and [f.message for f in findings] == ["a", "c"]
    assert verdict_of(CheckReport.model_validate(check_report("clean"))) == Verdict.CLEAN


@pytest.mark.parametrize("document", [
    {}, {"hosts": []}, {"verdict": None}, {"verdict": "CLEANISH"}, {"verdict": 1}, "clean", [],
    {"verdict": "clean"},
])
def test_an_unreadable_check_document_is_never_read_as_a_verdict(tmp_path: Path,
                                                                  document: Any) -> None:
    """A run row whose check document is not a check report (no cleanslate writes one) is an
    invalid record: an input error, never a verdict."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    row = {**_run("r").to_document(), "verdict_after": document}
    with Session(store.engine) as session, session.begin():
        session.add(RunRow(id="r", host="local", engine="sim", model="sim", status="stopped",
                           data=row, started_at=1.0, updated_at=1.0, study="v"))
    with pytest.raises(InputError, match="not valid"):
        store.runs(study="v")


def test_recover_host_stops_again_runs_whose_verdict_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    store.save_run(_run("clean", status="stopped", verdict_after=check_report("clean")))
    store.save_run(_run("missing", status="stopped", verdict_after=None))
    store.save_run(_run("unknown", status="stopped", verdict_after=check_report("unknown")))
    store.save_run(_run("dirty", status="stopped", verdict_after=check_report("dirty")))
    store.save_run(_run("ready", status="ready", verdict_after=None))
    store.save_run(_run("ready-clean", status="ready", verdict_after=check_report("clean")))
    stopped: list[str] = []

    async def fake_stop(_executor: Any, _store: Any, run: RunRecord, **_kw: Any) -> None:
        stopped.append(run.id)

    monkeypatch.setattr(trial_mod, "stop_server", fake_stop)

    class Local:
        name = "local"

    count = asyncio.run(recover_host(Local(), store, _spec(), lambda _m: None))  # type: ignore[arg-type]
    assert sorted(stopped) == ["dirty", "missing", "ready", "ready-clean", "unknown"]
    assert count == 5
