"""What bound each trial, and which flag moved it (``docs/study.md``, "What bound each
trial"; ``docs/report.md``): the bottleneck verdicts a trial records at its best level and at
the least load that missed an SLO or crashed, as a study's summary, its report and its exports
say them.

Plain text (no rich, no HTML): the console, the page and the exports escape it their way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cleanslate.bench import Bottleneck, bound_by, bound_evidence
from cleanslate.store import TrialRecord, trial_bottlenecks

if TYPE_CHECKING:
    from cleanslate.report._data import Effect


@dataclass(frozen=True)
class Bound:
    """A verdict where it was found: the level's ``label``, ``how`` the level went (``best``,
    or its level verdict: ``slo_miss``, ``crashed``...) and the ``bottleneck``."""

    label: str
    how: str
    bottleneck: Bottleneck

    @property
    def cell(self) -> str:
        """``running_cap at c=256``; ``kv_capacity? at c=512 (slo_miss)``."""
        where = self.label if self.how == "best" else f"{self.label} ({self.how})"
        return f"{bound_by(self.bottleneck)} at {where}"

    @property
    def line(self) -> str:
        """The cell with the evidence and the first advice."""
        return f"{self.cell}: {bound_evidence(self.bottleneck)}"


def trial_bounds(record: TrialRecord) -> tuple[Bound | None, Bound | None]:
    """The trial's verdict at its best level and at its limit (the least load that missed an
    SLO, failed or crashed): the record's own fields, else (a record written before they
    were) read from its levels; ``None`` where there is no such level or no verdict."""
    best_b, limit_label, limit_b = (record.best_bottleneck, record.limit_level,
                                    record.limit_bottleneck)
    if best_b is None and limit_b is None:
        found = trial_bottlenecks(record.levels, record.level_verdicts, record.best_level)
        best_b, limit_label, limit_b = (found["best_bottleneck"], found["limit_level"],
                                        found["limit_bottleneck"])
    best = (Bound(record.best_level, "best", best_b)
            if best_b is not None and record.best_level else None)
    limit = None
    if limit_b is not None and limit_label:
        how = record.level_verdicts.get(limit_label)
        limit = Bound(limit_label, str(how) if how is not None else "missed", limit_b)
    return best, limit


def bound_cell(record: TrialRecord) -> str:
    """A trial's verdicts in one cell: ``running_cap at c=256; crashed at c=512 (crashed)``;
    ``-`` when none was recorded."""
    return "; ".join(b.cell for b in trial_bounds(record) if b is not None) or "-"


def trial_bound_lines(record: TrialRecord) -> list[str]:
    """``bound by running_cap at c=256: <evidence>: <advice>``, then the limit's line."""
    best, limit = trial_bounds(record)
    out = []
    if best is not None:
        out.append(f"bound by {best.line}")
    if limit is not None:
        out.append(f"first miss: {limit.line}")
    return out


def _main(record: TrialRecord) -> Bound | None:
    """What bound a trial: at its best level, else (no level met the SLOs) at its limit."""
    best, limit = trial_bounds(record)
    return best or limit


def moved(effect: Effect) -> tuple[Bound | None, Bound | None]:
    """What bound the baseline and what bound the changed trial of an ablation ``effect``."""
    base = effect.baseline
    return (_main(base.record) if base is not None else None), _main(effect.trial.record)


def moved_text(effect: Effect) -> str:
    """``max-running-requests 64 -> 256: running_cap -> offered_load, +120.5 % [+110.2,
    +131.0]``: the flag, what bound each side (at its best level, else where it missed) and the
    objective's change with its interval (a change inside the noise says so: ``(no
    significant effect: a tie)``); ``(not moved)`` when the verdict stayed."""
    before, after = moved(effect)
    head = f"{effect.factor} {_show(effect.baseline_value)} -> {_show(effect.value)}"
    if before is None and after is None:
        return f"{head}: no verdict recorded, {effect.effect_text}"
    was = bound_by(before.bottleneck) if before is not None else "-"
    now = bound_by(after.bottleneck) if after is not None else "-"
    if after is not None and after.how != "best":
        now += f" at {after.label} ({after.how})"
    same = before is not None and after is not None and \
        before.bottleneck.verdict == after.bottleneck.verdict
    return f"{head}: {was} -> {now}{' (not moved)' if same else ''}, {effect.effect_text}"


def _show(value: object) -> str:
    return "unset" if value is None else str(value)


__all__ = ["Bound", "bound_cell", "moved", "moved_text", "trial_bound_lines", "trial_bounds"]
