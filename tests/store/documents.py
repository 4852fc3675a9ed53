"""Real documents for record tests: a check report, a teardown report and a benchmark level as a
real ``cleanslate tune`` run stored them (``tests/report/data/stores.json``), with the changes a
test asks for."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

STORES = Path(__file__).parent.parent / "report" / "data" / "stores.json"


@cache
def _recorded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(STORES.read_text())
    return data


def recorded_run() -> dict[str, Any]:
    """The first run of the first recorded study, as the store held it."""
    return copy.deepcopy(_recorded()["studies"][0]["runs"][0])


def recorded_trial() -> dict[str, Any]:
    """The first (feasible) trial of the first recorded study, as the store held it."""
    return copy.deepcopy(_recorded()["studies"][0]["trials"][0])


def check_report(verdict: str = "clean", *findings: dict[str, Any]) -> dict[str, Any]:
    """A check report of one host with this verdict and these findings added (each a
    :class:`~cleanslate.verdict.findings.Finding` document)."""
    doc = recorded_run()["verdict_after"]
    doc["verdict"] = verdict
    doc["hosts"][0]["verdict"] = verdict
    doc["hosts"][0]["findings"] += [{"gpu": None, "pid": None, "port": None, "evidence": {},
                                     **f} for f in findings]
    return doc


def finding(message: str, *, kind: str = "stray_process", severity: str = "error",
            **extra: Any) -> dict[str, Any]:
    """A finding document."""
    return {"kind": kind, "severity": severity, "message": message, **extra}


def teardown_report(*commands: str) -> dict[str, Any]:
    """A teardown report whose targets run these commands (the recorded ones without any)."""
    doc = recorded_run()["teardown"]
    if commands:
        first = doc["targets"][0]
        doc["targets"] = [{**first, "pid": 1000 + i, "command": c}
                          for i, c in enumerate(commands)]
    return doc


def level(label: str = "c=8", **values: Any) -> dict[str, Any]:
    """A benchmark level (the flat JSON of :class:`~cleanslate.bench.LevelResult`)."""
    doc = copy.deepcopy(recorded_trial()["levels"][0])
    concurrency = int(label[2:]) if label.startswith("c=") else 1
    doc.update({"label": label, "load": {"kind": "closed", "concurrency": concurrency}})
    doc.update(values)
    return doc
