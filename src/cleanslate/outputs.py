"""Is this output text broken? The checks shared by the smoke test and every benchmark level.

A server can answer every request with HTTP 200 and still be broken: the tuning work this
project comes from had a server that produced NaN garbage in decode and crashed only at 512
concurrent requests, and SGLang has shipped NaN at concurrency 16 and above (sglang#1742). So the
smoke test after ready, *and* a sample of every benchmark level, go through :func:`judge_text`:

- ``nan``: a standalone NaN/inf word (``nan``, ``NaN``, ``inf``, ``Infinity``);
- ``empty``: nothing but whitespace;
- ``degenerate``: one short unit repeated (``!!!!!!!!``, ``by by by by``), or a single word
  making up 75 % or more of at least 6 words (:func:`is_degenerate`).

A benchmark level also counts ``error_finish`` (a ``finish_reason`` of ``error``) and
``short`` (fewer tokens than asked for with ``ignore_eos``). :func:`level_verdict` turns the
counts of a level's samples into a verdict: NaN or an error finish in any sample breaks the level;
empty, degenerate or short outputs break it only when most samples have them *and* the first
level of the run did not (greedy decoding of random or small weights repeats itself at any load;
what matters is output that goes bad as the load rises).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Literal

OutputIssue = Literal["nan", "empty", "degenerate", "error_finish", "short"]

_NAN_WORD = re.compile(
    r"(?<![\w.])(?:nan|NaN|NAN|[+-]?inf|[+-]?Inf|[+-]?INF|[+-]?Infinity|[+-]?infinity)(?![\w.])"
)
_REPEAT = re.compile(r"(.{1,16}?)\1{3,}(.{0,16})", re.S)
_ERROR_FINISH = re.compile(rb'"finish_reason"\s*:\s*"error"')

#: Issues that break a level whenever one sample shows them.
ALWAYS_BAD: frozenset[str] = frozenset({"nan", "error_finish"})
#: Share of a level's samples above which empty, degenerate or short outputs break it.
MAJORITY = 0.5
#: Share of the first level's samples under which it counts as a clean reference.
CLEAN_REFERENCE = 0.25


def has_nan_marker(text: str) -> bool:
    """True when ``text`` contains a standalone NaN/inf word."""
    return bool(_NAN_WORD.search(text))


def is_degenerate(text: str, *, min_chars: int = 12) -> bool:
    """True when ``text`` is degenerate repetition.

    Degenerate: at least ``min_chars`` non-space characters, and either one unit of up to 16
    characters repeated to make the whole text (``!!!!!!!!``, ``ababab``, `` by by by``), or at
    least 6 words of which one makes up 75 % or more.
    """
    body = text.strip()
    if len(body.replace(" ", "")) < min_chars:
        return False
    if len(set(body)) <= 2:
        return True
    unit = _REPEAT.fullmatch(body)
    if unit and unit.group(1).startswith(unit.group(2)):
        return True  # the unit repeated, then a prefix of it ("ab ab ab ab a")
    words = body.split()
    if len(words) >= 6:
        _, count = Counter(words).most_common(1)[0]
        if count / len(words) >= 0.75:
            return True
    return False


def judge_text(text: str) -> tuple[Literal["nan", "empty", "degenerate"], str] | None:
    """The content checks (nan, empty, degenerate) on one output, or ``None`` if it looks fine;
    the second element says what was seen, quoting the output."""
    if has_nan_marker(text):
        return "nan", f"output contains a NaN/inf marker: {text[:120]!r}"
    if not text.strip():
        return "empty", "output is empty"
    if is_degenerate(text):
        return "degenerate", f"output is degenerate repetition: {text[:120]!r}"
    return None


def has_error_finish(raw: bytes) -> bool:
    """Whether a raw response (JSON or SSE bytes) has a ``finish_reason`` of ``error``."""
    return bool(_ERROR_FINISH.search(raw))


def level_verdict(samples: int, issues: Mapping[str, int],
                  reference: Mapping[str, int] | None = None,
                  reference_samples: int = 0) -> str | None:
    """The issue that breaks a level, or ``None``: see the module docstring. ``reference`` is
    the first level's counts (``None`` when this is the first level, or the only one)."""
    if samples <= 0:
        return None
    for issue in ("nan", "error_finish"):
        if issues.get(issue):
            return issue
    for issue in ("empty", "degenerate", "short"):
        share = issues.get(issue, 0) / samples
        if share <= MAJORITY:
            continue
        if issue == "empty":
            return issue  # no text at all is never a property of the weights
        if reference is not None and reference_samples > 0 and \
                reference.get(issue, 0) / reference_samples < CLEAN_REFERENCE:
            return issue
    return None


__all__ = [
    "ALWAYS_BAD",
    "OutputIssue",
    "has_error_finish",
    "has_nan_marker",
    "is_degenerate",
    "judge_text",
    "level_verdict",
]
