"""CSV and JSON exports, through the library and the command line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from cleanslate.report import load_report, to_csv, to_json
from cleanslate.store import Store
from tests.report.conftest import StudyStore


def test_csv_has_one_row_per_trial_sorted_by_objective(recorded_store: StudyStore) -> None:
    report = load_report(Store(recorded_store.url), "quickstart")
    rows = list(csv.DictReader(io.StringIO(to_csv([report]))))
    assert [int(r["number"]) for r in rows] == [t.number for t in report.sorted_trials()]
    assert {f"param.{f}" for f in report.factors} <= set(rows[0])
    best = rows[0]
    assert best["status"] == "feasible"
    assert float(best["output_throughput"]) == report.best.metric("output_throughput")  # type: ignore[union-attr]
    assert best["launch_command"].startswith("/")
    oom = rows[-1]
    assert oom["status"] == "infeasible" and oom["cause"] == "oom"
    assert oom["output_throughput"] == ""


def test_json_holds_every_record_and_the_best(recorded_store: StudyStore) -> None:
    reports = [load_report(Store(recorded_store.url), n) for n in recorded_store.studies]
    doc = json.loads(to_json(reports))
    assert [s["study"] for s in doc["studies"]] == list(recorded_store.studies)
    for study, report in zip(doc["studies"], reports, strict=True):
        assert study["simulated"] is True
        assert len(study["trials"]) == len(report.trials)
        assert study["best"]["number"] == report.best.number  # type: ignore[union-attr]
        oom = [t for t in study["trials"] if t["cause"] == "oom"]
        assert oom and "OutOfMemoryError" in oom[0]["log_tail"]


def test_cli_export_to_stdout_is_pure(cli: Any, recorded_store: StudyStore) -> None:
    done = cli("report", "report-tiny", "--store", recorded_store.url, "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert sorted(int(r["number"]) for r in rows) == [0, 1, 2]
    done = cli("report", "report-tiny", "--store", recorded_store.url, "--format", "json",
               "--compare", "quickstart")
    assert done.returncode == 0, done.stderr
    assert [s["study"] for s in done.json()["studies"]] == ["report-tiny", "quickstart"]


def test_cli_export_to_file_infers_the_format(cli: Any, recorded_store: StudyStore,
                                              tmp_path: Path) -> None:
    out = tmp_path / "trials.json"
    done = cli("report", "quickstart", "--store", recorded_store.url, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "best configuration" in done.stdout  # the table still goes to the screen
    assert len(json.loads(out.read_text())["studies"][0]["trials"]) == 7
    done = cli("report", "quickstart", "--store", recorded_store.url, "--out",
               str(tmp_path / "trials.txt"))
    assert done.returncode == 2 and "--format" in done.stderr
