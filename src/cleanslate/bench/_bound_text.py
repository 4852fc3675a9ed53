"""The bottleneck verdict as text, where the number is printed (``docs/bench.md``, "Why: the
bottleneck verdict"): the "bound by" cell of bench's table, of ``--find-max``'s probe table
and of a report's levels, and the line under a table with the evidence and the advice.

Plain strings (no rich markup): the evidence quotes the server's configuration, which the
callers print as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cleanslate.bench._bottleneck import Bottleneck
    from cleanslate.bench._models import LevelResult


def bound_by(bottleneck: Bottleneck | None) -> str:
    """The verdict in a cell: ``running_cap`` (clear), ``compute?`` (likely), ``unknown``;
    ``-`` for a level that was not diagnosed (recorded before verdicts were)."""
    if bottleneck is None:
        return "-"
    if bottleneck.verdict == "unknown" or bottleneck.confidence == "clear":
        return bottleneck.verdict
    return f"{bottleneck.verdict}?"


def bound_evidence(bottleneck: Bottleneck) -> str:
    """The evidence and the first advice in one sentence: ``running 64 of cap 64 ... ;
    waiting 12 at c=64 -> 188: raise --max-running-requests above 64: requests queue ...``;
    a verdict of ``unknown`` says what was missing; the other signatures seen follow
    (``also throttled``)."""
    text = "; ".join(bottleneck.evidence) or "no evidence recorded"
    if bottleneck.advice:
        text += f": {bottleneck.advice[0].text}"
    if bottleneck.also:
        text += f" (also {', '.join(bottleneck.also)})"
    return text


def bound_line(label: str, bottleneck: Bottleneck) -> str:
    """One level's line under a table: ``c=256 bound by running_cap: <evidence>: <advice>``."""
    return f"{label} bound by {bound_by(bottleneck)}: {bound_evidence(bottleneck)}"


def bound_lines(levels: Sequence[LevelResult | None]) -> list[str]:
    """:func:`bound_line` for every diagnosed level, in the order given."""
    return [bound_line(lv.label, lv.bottleneck) for lv in levels
            if lv is not None and lv.bottleneck is not None]


__all__ = ["bound_by", "bound_evidence", "bound_line", "bound_lines"]
