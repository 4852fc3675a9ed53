"""Exports: one CSV row per trial, or one JSON document with every record of the studies."""

from __future__ import annotations

import csv
import io
import json
import math
import re

from cleanslate.report._bench import LEVEL_HEAD, BenchReport, level_row, observed_fields
from cleanslate.report._bounds import bound_cell, moved, moved_text, trial_bounds
from cleanslate.report._capacity import CSV_COLUMNS, capacity_document, csv_fields
from cleanslate.report._data import (
    LEVEL_COLUMNS,
    Effect,
    StudyReport,
    TrialView,
    comparable,
    shared_configs,
)
from cleanslate.report._documents import (
    BestDocument,
    ComparisonDocument,
    ExportDocument,
    MovedDocument,
    StudyDocument,
    StudyStatisticsDocument,
)
from cleanslate.report._guided import guided_documents

#: CSV columns before the parameters (``param.<flag>``) and the best level's metrics:
#: ``crash`` where the server crashed and why (``crashed at c=256 (python_exception)``),
#: ``ci_low``/``ci_high`` the value's interval (empty with one measurement), ``n_replicates``
#: the measurements it is the mean of, ``standing`` best, tied or undecided (against the best).
_HEAD = ("study", "number", "status", "crash", "cause", "detail", "value", "ci_low",
         "ci_high", "n_replicates", "standing", "best_level")
_TAIL = ("verdict_before", "verdict_after", "run_id", "launch_command")
#: What bound the trial (``report._bounds``): ``bound_by`` the cell the table shows, the
#: verdict and confidence at its best level, and at ``limit_level`` (its first miss).
_BOUND = ("bound_by", "best_bottleneck", "best_confidence", "limit_level", "limit_bottleneck",
          "limit_confidence")
#: The observer columns of a trial's best level (:func:`trial_row`).
_OBSERVED = re.compile(r"(server_metrics|gpu\d+)\.")


#: What a spreadsheet reads as the start of a formula (OWASP's "CSV injection"): a text cell
#: starting with one of these gets a leading ``'`` and is read as text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> str | int | float:
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


def trial_row(report: StudyReport, trial: TrialView) -> dict[str, object]:
    """One trial as a flat row, column to value (each made a cell by :func:`csv_cell`):
    parameters as ``param.<flag>``, metrics of its best level and what its observers saw
    there (:func:`~cleanslate.report._bench.observed_fields`: ``server_metrics.*``,
    ``gpu<index>.*``)."""
    r = trial.record
    found = trial.interval(report.confidence)
    row: dict[str, object] = {"study": report.name, "number": r.number, "status": r.status,
                              "crash": trial.crash_text, "cause": r.cause,
                              "detail": r.detail, "value": r.value,
                              "ci_low": found.low if found else None,
                              "ci_high": found.high if found else None,
                              "n_replicates": found.n if found else None,
                              "standing": report.mark(trial) or None,
                              "best_level": r.best_level}
    if report.capacity:
        row.update(csv_fields(trial.capacity))
    for name in report.factors:
        row[f"param.{name}"] = r.params.get(name)
    for key, _, _ in LEVEL_COLUMNS:
        row[key] = trial.metric(key)
    best = trial.best
    if best is not None:
        row.update(observed_fields(best))
    best_bound, limit = trial_bounds(r)
    row.update({"bound_by": bound_cell(r),
                "best_bottleneck": best_bound.bottleneck.verdict if best_bound else None,
                "best_confidence": best_bound.bottleneck.confidence if best_bound else None,
                "limit_level": limit.label if limit else None,
                "limit_bottleneck": limit.bottleneck.verdict if limit else None,
                "limit_confidence": limit.bottleneck.confidence if limit else None})
    row.update({"verdict_before": r.verdict_before, "verdict_after": r.verdict_after,
                "run_id": r.run_id, "launch_command": trial.launch_command})
    return row


def to_csv(reports: list[StudyReport]) -> str:
    """Trials of every study, sorted by each study's objective; the parameter columns are the
    union of the studies' flags."""
    params: list[str] = []
    for report in reports:
        params += [f"param.{n}" for n in report.factors if f"param.{n}" not in params]
    capacity = list(CSV_COLUMNS) if any(r.capacity for r in reports) else []
    rows = [trial_row(report, trial) for report in reports for trial in report.sorted_trials()]
    observed: list[str] = []
    for row in rows:  # the best level's observer summaries, only when some trial has them
        observed += [k for k in row if _OBSERVED.match(k) and k not in observed]
    columns = [*_HEAD, *capacity, *params, *(k for k, _, _ in LEVEL_COLUMNS), *observed,
               *_BOUND, *_TAIL]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writerow({k: csv_cell(k) for k in columns})  # a flag's name is text too
    for row in rows:
        writer.writerow({k: csv_cell(row.get(k)) for k in columns})
    return out.getvalue()


def bench_csv(report: BenchReport) -> str:
    """A bench run's levels, one CSV row each (:func:`~cleanslate.report._bench.level_row`):
    the headline figures, then the observer summaries flattened (the union over the
    levels)."""
    return rows_csv([level_row(lv) for lv in report.result.levels], list(LEVEL_HEAD))


def rows_csv(rows: list[dict[str, object]], head: list[str]) -> str:
    """``rows`` as CSV: the columns ``head``, then every other key in the order first seen;
    each cell through :func:`csv_cell` (a formula-looking text is quoted)."""
    columns = list(head)
    for row in rows:
        columns += [k for k in row if k not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: csv_cell(row.get(k)) for k in columns})
    return out.getvalue()


def best_document(report: StudyReport) -> BestDocument | None:
    """The study's best: its number, parameters, value with its interval (``ci_low``,
    ``ci_high``: ``None`` with one measurement) and ``n_replicates``, the trials tied with it
    (``tied_with``) and undecided against it (``undecided_with``), its level and launch
    command."""
    best = report.best
    if best is None:
        return None
    found = best.interval(report.confidence)
    standing = report.standing
    return {"number": best.number, "params": best.record.params, "value": best.record.value,
            "ci_low": found.low if found else None, "ci_high": found.high if found else None,
            "n_replicates": found.n if found else None, "confidence": report.confidence,
            "tied_with": list(standing.tied), "undecided_with": list(standing.undecided),
            "best_level": best.record.best_level, "launch_command": best.launch_command,
            "capacity": capacity_document(best.capacity) if best.capacity else None}


def _trial_document(report: StudyReport, trial: TrialView) -> dict[str, object]:
    """A trial record as JSON with its launch command, its standing against the best, its
    comparison with the best (``vs_best``: the race or the paired comparison; ``None`` for
    the best and a trial not compared), ``crash`` and ``crashed_at`` (``crashed at c=256
    (python_exception)`` and the level, ``None`` when its server did not crash), and for a
    capacity search ``capacity_summary``
    (:func:`~cleanslate.report._capacity.capacity_document`: the bracket as text and the
    probes' figures; the record's own ``capacity`` holds the whole answer)."""
    comp = report.standing.comparisons.get(trial.number)
    return {**trial.record.model_dump(mode="json"), "launch_command": trial.launch_command,
            "crash": trial.crash_text, "crashed_at": trial.record.crashed_at,
            "standing": report.mark(trial) or None,
            "vs_best": comp.document() if comp is not None else None,
            "statistics_gpu_s": trial.statistics_gpu_s,
            "capacity_summary": capacity_document(trial.capacity) if trial.capacity else None}


def _statistics_document(report: StudyReport) -> StudyStatisticsDocument:
    """The study's ``statistics:`` block (every key of :class:`~cleanslate.tune.study.
    Statistics`), what the statistics ran and cost, and each slot's host effect."""
    stats = report.statistics
    standing = report.standing
    return {"replicates": stats.replicates, "tie_margin": stats.tie_margin,
            "confidence": stats.confidence, "max_replicates": stats.max_replicates,
            "max_error_rate": stats.max_error_rate,
            "replicates_run": standing.replicates, "gpu_s": standing.statistics_gpu_s,
            "total_gpu_s": standing.total_gpu_s, "share": standing.share,
            "host_effects": {slot: {"effect": found.mean, "ci_low": found.low,
                                    "ci_high": found.high, "n": found.n}
                             for slot, found in sorted(report.host_effects.items())}}


def study_document(report: StudyReport) -> StudyDocument:
    """A study as JSON: its spec, its best trial (with its interval and tie set), every trial
    record (levels, phases, verdicts, log tail, interval, replicates, races) with its launch
    command, the ablation effects with their intervals, what the statistics cost, per slot its
    trials, infrastructure failures and state (quarantined and why), and per host its doctor
    snapshot with a one-line summary; a guided study's lab notebook as ``guided``
    (:func:`~cleanslate.report._guided.guided_documents`)."""
    document: StudyDocument = {
        "study": report.name,
        "status": report.status,
        "engine": report.engine,
        "simulated": report.simulated,
        "objective": {report.direction: report.metric},
        "spec": report.spec,
        "elapsed_s": report.elapsed_s,
        "best": best_document(report),
        "statistics": _statistics_document(report),
        "trials": [_trial_document(report, t) for t in report.sorted_trials()],
        "ablation": [{"factor": e.factor, "baseline": e.baseline_value, "value": e.value,
                      "trial": e.trial.number, "change_pct": e.change_pct,
                      "better": e.better, "cause": e.cause,
                      "significant": e.significant,
                      "difference": e.difference.document() if e.difference else None,
                      **_moved_document(e)}
                     for e in report.ablation_effects()],
        "slots": [slot.document() for slot in report.slots],
        "hosts": [{**h.snapshot.model_dump(mode="json"), "host": h.host, "machine": h.machine,
                   "label": h.label, "summary": h.snapshot.summary()} for h in report.hosts],
    }
    if report.strategy == "guided":
        document["guided"] = guided_documents(report)
    return document


def _moved_document(effect: Effect) -> MovedDocument:
    """What bound the baseline and the change (their verdicts at their best level, else
    where they missed) and the line that says it (:func:`~cleanslate.report._bounds.
    moved_text`)."""
    before, after = moved(effect)
    return {"bottleneck_before": before.bottleneck.verdict if before else None,
            "bottleneck_after": after.bottleneck.verdict if after else None,
            "moved": moved_text(effect)}


def comparisons_document(reports: list[StudyReport]) -> list[ComparisonDocument]:
    """Each study after the first against the first: the configurations both ran, each with
    ``b`` against ``a`` (``diff``, ``ci_low``, ``ci_high``, ``method``, ``verdict``)."""
    if len(reports) < 2:
        return []
    a = reports[0]
    return [{"a": a.name, "b": b.name, "note": comparable(a, b),
             "configurations": [c.document() for c in shared_configs(a, b)]}
            for b in reports[1:]]


def to_json(reports: list[StudyReport]) -> str:
    """``{"studies": [...]}``: one :func:`study_document` per study; with several,
    ``comparisons``: each later study's shared configurations against the first's."""
    doc: ExportDocument = {"studies": [study_document(r) for r in reports]}
    if len(reports) > 1:
        doc["comparisons"] = comparisons_document(reports)
    return json.dumps(doc, indent=2, default=str) + "\n"
