"""Exports: one CSV row per trial, or one JSON document with every record of the studies."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from cleanslate.report._data import LEVEL_COLUMNS, StudyReport, TrialView

#: CSV columns before the parameters (``param.<flag>``) and the best level's metrics.
_HEAD = ("study", "number", "status", "cause", "detail", "value", "best_level")
_TAIL = ("verdict_before", "verdict_after", "run_id", "launch_command")


#: What a spreadsheet reads as the start of a formula (OWASP's "CSV injection"): a text cell
#: starting with one of these gets a leading ``'`` and is read as text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: ``None`` empty; a finite number (that we measured or that the
    study's space holds) as the number it is, negative ones too; any other value as text, with
    a ``'`` before it when it starts like a formula (:data:`_FORMULA_START`), so that a
    spreadsheet shows ``=HYPERLINK(...)`` from an engine's error text or a flag value instead of
    evaluating it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def trial_row(report: StudyReport, trial: TrialView) -> dict[str, Any]:
    """One trial as a flat row: parameters as ``param.<flag>``, metrics of its best level."""
    r = trial.record
    row: dict[str, Any] = {"study": report.name, "number": r.number, "status": r.status,
                           "cause": r.cause, "detail": r.detail, "value": r.value,
                           "best_level": r.best_level}
    for name in report.factors:
        row[f"param.{name}"] = r.params.get(name)
    for key, _, _ in LEVEL_COLUMNS:
        row[key] = trial.metric(key)
    row.update({"verdict_before": r.verdict_before, "verdict_after": r.verdict_after,
                "run_id": r.run_id, "launch_command": trial.launch_command})
    return row


def to_csv(reports: list[StudyReport]) -> str:
    """Trials of every study, sorted by each study's objective; the parameter columns are the
    union of the studies' flags."""
    params: list[str] = []
    for report in reports:
        params += [f"param.{n}" for n in report.factors if f"param.{n}" not in params]
    columns = [*_HEAD, *params, *(k for k, _, _ in LEVEL_COLUMNS), *_TAIL]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writerow({k: csv_cell(k) for k in columns})  # a flag's name is text too
    for report in reports:
        for trial in report.sorted_trials():
            row = trial_row(report, trial)
            writer.writerow({k: csv_cell(row.get(k)) for k in columns})
    return out.getvalue()


def study_document(report: StudyReport) -> dict[str, Any]:
    """A study as JSON: its spec, its best trial, every trial record (levels, phases, verdicts,
    log tail) with its launch command, the ablation effects, per slot its trials,
    infrastructure failures and state (quarantined and why), and per host its doctor snapshot
    with a one-line summary."""
    best = report.best
    return {
        "study": report.name,
        "status": report.status,
        "engine": report.engine,
        "simulated": report.simulated,
        "objective": {report.direction: report.metric},
        "spec": report.spec,
        "elapsed_s": report.elapsed_s,
        "best": ({"number": best.number, "params": best.record.params,
                  "value": best.record.value, "best_level": best.record.best_level,
                  "launch_command": best.launch_command} if best else None),
        "trials": [{**t.record.model_dump(mode="json"), "launch_command": t.launch_command}
                   for t in report.sorted_trials()],
        "ablation": [{"factor": e.factor, "baseline": e.baseline_value, "value": e.value,
                      "trial": e.trial.number, "change_pct": e.change_pct,
                      "better": e.better, "cause": e.cause}
                     for e in report.ablation_effects()],
        "slots": [slot.document() for slot in report.slots],
        "hosts": [{**h.snapshot.model_dump(mode="json"), "host": h.host, "machine": h.machine,
                   "label": h.label, "summary": h.snapshot.summary()} for h in report.hosts],
    }


def to_json(reports: list[StudyReport]) -> str:
    """``{"studies": [...]}``: one :func:`study_document` per study."""
    return json.dumps({"studies": [study_document(r) for r in reports]}, indent=2,
                      default=str) + "\n"
