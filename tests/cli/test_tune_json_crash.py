"""``tune --json`` says a trial's crash as the report's JSON does (issue 38 item 3):
``crashed_at`` and ``crash`` on every trial, derived from its level verdicts."""

from __future__ import annotations

import json

from cleanslate.cli._documents import TuneDone
from cleanslate.store import TrialRecord, TrialStatus


def test_every_trial_of_tune_json_carries_its_crash() -> None:
    crashed = TrialRecord(study="s", number=1, params={"disable-cuda-graph": False},
                          status=TrialStatus.INFEASIBLE, cause="python_exception",
                          level_verdicts={"c=16": "ok", "c=256": "crashed"})
    fine = TrialRecord(study="s", number=0, params={"disable-cuda-graph": True},
                       status=TrialStatus.FEASIBLE, value=10.0, level_verdicts={"c=16": "ok"})
    doc = json.loads(TuneDone(study="s", stopped_by="done", message="", new_trials=2,
                              best=fine, trials=[fine, crashed]).model_dump_json())
    first, second = doc["trials"]
    assert (first["crashed_at"], first["crash"]) == (None, None)
    assert second["crashed_at"] == "c=256"
    assert second["crash"] == "crashed at c=256 (python_exception)"
    assert "log_tail" not in second
