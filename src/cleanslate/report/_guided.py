"""A guided study's path in a report (``strategy: guided``): the lab notebook as lines (the
console), as a timeline (HTML) and as documents (JSON). The entries are the trials' own
(``TrialRecord.guided``); the lines are :mod:`cleanslate.tune.notebook`'s, as ``tune`` printed
them."""

from __future__ import annotations

from html import escape as _e

from pydantic import ValidationError

from cleanslate.report._data import StudyReport
from cleanslate.store import GuidedStep, TrialRecord
from cleanslate.tune.notebook import change_text, effect_text, notebook_lines, step_line
from cleanslate.tune.study import StudySpec


def guided_entries(report: StudyReport) -> list[tuple[TrialRecord, GuidedStep]]:
    """The notebook's entries with their trials, in step order (empty for another
    strategy)."""
    if report.strategy != "guided":
        return []
    found = [(t.record, t.record.guided) for t in report.trials if t.record.guided is not None]
    return sorted(((r, g) for r, g in found if g is not None), key=lambda p: (p[1].step,
                                                                             p[0].number))


def _line(record: TrialRecord, entry: GuidedStep) -> str:
    return step_line(entry, record.params if entry.sampler else None)


def guided_lines(report: StudyReport) -> list[str]:
    """``the guided path (lab notebook):`` then the notebook's lines as ``tune`` prints them
    at its end (the flags not guided, each step with its trial, where the path ended, the
    incumbent); empty for another strategy."""
    if report.strategy != "guided":
        return []
    try:
        spec = StudySpec.model_validate(report.spec)
    except ValidationError:  # a stored definition this cleanslate cannot read: entries only
        lines = [f"{_line(r, g)} (trial {r.number})" for r, g in guided_entries(report)]
    else:
        lines = notebook_lines(spec, [t.record for t in report.trials])
    return ["the guided path (lab notebook):", *(f"  {line}" for line in lines)]


def guided_documents(report: StudyReport) -> list[dict[str, object]]:
    """Each notebook entry as JSON: its fields, the trial, its parameters and the line."""
    return [{"trial": record.number, "params": record.params, "line": _line(record, entry),
             **entry.model_dump(mode="json")} for record, entry in guided_entries(report)]


def guided_timeline(report: StudyReport) -> str:
    """The path as an HTML timeline: one row per step, the verdict that led to it with its
    evidence, the change, the effect with its interval, kept or reverted."""
    entries = guided_entries(report)
    if not entries:
        return "<p>No step of the guided path has finished yet.</p>"
    rows = []
    for record, entry in entries:
        where = f" at {entry.level}" if entry.level else ""
        of = f" of trial #{entry.base}" if entry.base is not None else ""
        verdict = (f"<b>{_e(entry.verdict or '-')}</b>{_e(where + of)}"
                   + (f'<br><span class="meta">{_e(entry.evidence)}</span>'
                      if entry.evidence else ""))
        if entry.step == 0:
            change = "the baseline"
        elif entry.sampler:
            change = "the sampler: " + _e(", ".join(f"{k}={v}" for k, v in
                                                   record.params.items()))
        else:
            change = f"<code>{_e(change_text(entry))}</code>"
        if entry.why and entry.step:
            change += f'<br><span class="meta">{_e(entry.why)}</span>'
        effect = _e(effect_text(entry)) or "-"
        css = {"kept": "up", "reverted": "down"}.get(entry.outcome, "meta")
        outcome = f'<span class="{css}">{_e(entry.outcome)}</span>'
        if entry.note and entry.step:
            outcome += f'<br><span class="meta">{_e(entry.note)}</span>'
        rows.append(f"<tr><td>{entry.step}</td><td>#{record.number}</td><td>{verdict}</td>"
                    f"<td>{change}</td><td>{effect}</td><td>{outcome}</td></tr>")
    lines = guided_lines(report)[1:]
    tail = "".join(f"<li>{_e(line.strip())}</li>" for line in lines
                   if line.strip().startswith(("not guided", "the path ended", "incumbent")))
    return ("<p>Each step read the incumbent's verdict at the level that decided its "
            "objective, changed the flag that relaxes it, and was raced against the "
            "incumbent: <b>kept</b> on a win or a tie with fewer flags changed, else "
            "<b>reverted</b>.</p>"
            "<table><thead><tr><th>step</th><th>trial</th><th>verdict (evidence)</th>"
            "<th>change (why)</th><th>effect</th><th>kept?</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>" + (f"<ul>{tail}</ul>" if tail else ""))


__all__ = ["guided_documents", "guided_entries", "guided_lines", "guided_timeline"]
