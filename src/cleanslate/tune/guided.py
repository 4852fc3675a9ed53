"""The guided step's choice: which flag of the space to change next, and to what.

A guided study (``strategy: guided``, ``docs/study.md``) reads the verdict of the level that
decides its objective and asks the engine's relax table (:class:`Relaxer` rows, kept by each
engine adapter and registered with :func:`register_relaxers`) which flags of the space relax
that bottleneck. :func:`next_steps` turns the rows into :class:`Step` candidates: for each row
that answers the verdict, in the table's order, the *nearest* value of the space in the row's
direction from the value in effect. The functions here are pure: they read the registry, the
space and the current configuration, and decide nothing about racing or keeping a step.

How a value is chosen (the flag's values as the space lists them, ``space_values``):

- ``up`` / ``down``: the next larger / smaller number of the space than the current value.
  A flag with no current value (not set: the engine's default, which is not known here) has
  no nearest value and gives no step; a non-number has none either.
- ``on`` / ``off``: the flag's own value ``true`` / ``false``, as written, never the feature
  it names (CUDA graphs on is ``disable-cuda-graph`` ``off``): a row in the table says so. A
  boolean flag that is not set is off (a ``false`` flag is not passed), so ``off`` gives no
  step for it. The step's sentence reads the feature too: a flag named ``disable-X`` or
  ``no-X`` that turns off says ``X on``.
- ``set``: the row's value, when the space lists it.

A candidate is skipped when it equals the current value, when it was tried already
(``tried``: ``(flag, value)`` pairs), or when an earlier row gave the same change. ``True`` and
``1`` are different values here, as they are different flags on a command line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cleanslate.engines import Relaxer, register_relaxers, relax_engines, relaxers
from cleanslate.tune.factors import Scalar

if TYPE_CHECKING:
    from cleanslate.tune.study import StudySpec

#: The prefixes of a flag that turns a feature off when it is on (``disable-cuda-graph``).
NEGATIVE_PREFIXES = ("disable-", "no-", "disable_", "no_")


@dataclass(frozen=True)
class Step:
    """One change a guided study may try: ``flag`` (as the space writes it) from ``old`` (the
    value in effect, ``None`` when the flag is not set) to ``new``, because the deciding level's
    verdict was ``verdict``; ``why``: the sentence for the notebook, the row's reason with the
    values (``raise max-running-requests 64 -> 128: requests queue behind the cap...``)."""

    flag: str
    old: Scalar | None
    new: Scalar
    verdict: str
    why: str
    bound: Bound | None = None


@dataclass(frozen=True)
class Bound:
    """The most a step that lets the batch grow can add to throughput, from the deciding
    verdict's figures: the batch's room (``batch`` now, ``to`` at most) times the marginal gain
    measured between the levels (what one more running request adds, as a share of what an
    average one carries; ``bench._bottleneck.MARGINAL_GAIN``). ``gain``: that product, a
    share (0.031 is +3.1 %); ``limit``: what stops the batch at ``to``."""

    batch: float
    to: float
    marginal: float
    limit: str

    @property
    def gain(self) -> float:
        return max(0.0, self.to / self.batch - 1) * self.marginal

    def text(self) -> str:
        return (f"at most {self.gain * 100:+.1f} %: the batch can grow {self.batch:.0f} -> "
                f"{self.to:.0f} ({self.limit}) at a marginal gain of {self.marginal:.2f}")


def batch_bound(verdict: str, row: Relaxer, old: Scalar | None, new: Scalar,
                figures: Mapping[str, float]) -> Bound | None:
    """The :class:`Bound` of a row that lets the batch grow: under ``running_cap`` any row
    (a larger cap, or another limit on admission: the batch still stops where the KV cache is
    full, at ``running_max / kv_usage_max``, the room as large as it can be: SGLang's usage
    stops short of 1 when full, ``bench._bottleneck.KV_FULL``; the cap's own row also at its
    new value), under ``kv_capacity`` a row that does not lower a value (more memory, a smaller KV
    dtype: the batch still stops at the cap). ``None`` without the figures to say (a marginal
    gain needs a level before with a smaller batch) or for another row: it is not deferred."""
    marginal = figures.get("marginal_gain")
    batch = figures.get("running_mean", figures.get("batch"))
    if marginal is None or batch is None or batch <= 0:
        return None
    cap = figures.get("cap")
    if verdict == "running_cap":
        kv, top = figures.get("kv_usage_max"), figures.get("running_max", batch)
        limits: list[tuple[float, str]] = []
        if kv is not None and kv > 0:
            limits.append((top / min(kv, 1.0), f"the KV cache {kv:.0%} full at {top:.0f}"))
        at, to = _number(old), _number(new)
        if at is not None and to is not None and cap is not None and at == cap and to > at:
            limits.append((to, f"the new cap {to:.0f}"))
        if not limits:
            return None
        to_, limit = min(limits)
        return Bound(batch=batch, to=to_, marginal=marginal, limit=limit)
    if verdict == "kv_capacity" and row.direction != "down" and cap is not None:
        return Bound(batch=batch, to=cap, marginal=marginal, limit=f"the cap {cap:.0f}")
    return None


def space_values(spec: StudySpec) -> dict[str, list[Scalar]]:
    """The values of every factor of the study's space, in the space's order: a list's items,
    or a range's discrete points (``StudySpec.factor_values``)."""
    return {name: spec.factor_values(name) for name in spec.space}


def _bare(flag: str) -> str:
    return flag.lstrip("-")


def _row_key(row: Relaxer, space: Mapping[str, Sequence[Scalar]]) -> str | None:
    """The key of ``space`` that is the row's flag (any of its spellings, with or without
    dashes), or ``None``."""
    names = set(row.names())
    return next((key for key in space if _bare(key) in names), None)


def _needs_hold(row: Relaxer, current: Mapping[str, Scalar]) -> bool:
    """Whether the configuration has the values the row needs (a flag it does not set, under
    any spelling, is not known and holds nothing back; an unset boolean is off)."""
    for name, value in row.needs:
        key = next((k for k in current if _bare(k) == name), None)
        if key is None:
            continue
        have = current[key]
        if not same_value(have if have is not None else False, value):
            return False
    return True


def _under_limit(limit: Scalar | None, figures: Mapping[str, float]) -> bool:
    """Whether the level's largest running batch is known and at or below ``limit``."""
    batch = figures.get("running_max", figures.get("batch"))
    at = _number(limit)
    return batch is not None and at is not None and batch <= at


def _number(value: object) -> float | None:
    """``value`` as a number, ``None`` for a boolean or a non-number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def same_value(a: object, b: object) -> bool:
    """Equal as flag values: booleans only equal booleans (``True`` is not ``1``), numbers
    compare as numbers (``64 == 64.0``), anything else by ``==``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _nearest(row: Relaxer, values: Sequence[Scalar], old: Scalar | None,
             skip: Sequence[Scalar]) -> Scalar | None:
    """The row's value among ``values`` (see the module docstring), not in ``skip``."""
    def free(v: Scalar) -> bool:
        return not any(same_value(v, s) for s in skip)

    if row.direction in ("up", "down"):
        at = _number(old)
        if at is None:
            return None
        numbers = [(n, v) for v in values if (n := _number(v)) is not None and free(v)]
        if row.direction == "up":
            above = [pair for pair in numbers if pair[0] > at]
            return min(above)[1] if above else None
        below = [pair for pair in numbers if pair[0] < at]
        return max(below)[1] if below else None
    if row.direction in ("on", "off"):
        want = row.direction == "on"
        if (old is True) == want:
            return None
        found = any(same_value(v, want) for v in values)
        return want if found and free(want) else None
    found_value = next((v for v in values if same_value(v, row.value)), None)
    if found_value is None or same_value(found_value, old) or not free(found_value):
        return None
    return found_value


def _show(value: Scalar | None) -> str:
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sentence(row: Relaxer, flag: str, old: Scalar | None, new: Scalar) -> str:
    """``raise max-running-requests 64 -> 128: <why>``; a negative boolean flag also says what
    it means for the feature: ``turn disable-cuda-graph off (true -> false: cuda-graph on)``."""
    change = f"{_show(old)} -> {_show(new)}"
    bare = _bare(flag)
    if row.direction in ("on", "off"):
        feature = next((bare[len(p):] for p in NEGATIVE_PREFIXES if bare.startswith(p)), None)
        if feature:
            change += f": {feature} {'off' if new is True else 'on'}"
        return f"turn {flag} {row.direction} ({change}): {row.why}"
    verb = {"up": "raise", "down": "lower", "set": "set"}[row.direction]
    return f"{verb} {flag} {change}: {row.why}"


def next_steps(verdict: str, cause: str | None, space: Mapping[str, Sequence[Scalar]],
               current: Mapping[str, Scalar], engine: str,
               tried: Collection[tuple[str, Scalar]] = (),
               figures: Mapping[str, float] | None = None) -> list[Step]:
    """The candidate changes for ``verdict`` (with the crash's ``cause`` for ``crashed``), in
    the order of ``engine``'s relax table: for each row that answers the verdict and whose flag
    is in ``space`` (flag -> its values), the nearest value in the row's direction from
    ``current[flag]`` that is not in ``tried`` (see the module docstring). ``[]`` when no row
    answers, no flag of the space is named, or every value in reach was tried. ``figures``:
    the deciding verdict's, for a ``batch_limit`` row (a limit the batch never reached is not
    raised)."""
    steps: list[Step] = []
    for row in relaxers(engine):
        if not row.matches(verdict, cause):
            continue
        key = _row_key(row, space)
        if key is None or not _needs_hold(row, current):
            continue
        skip = [v for f, v in tried if _bare(f) in row.names() or f == key]
        skip += [s.new for s in steps if s.flag == key]
        old = current.get(key)
        if row.batch_limit and _under_limit(old, figures or {}):
            continue
        new = _nearest(row, space[key], old, skip)
        if new is None:
            continue
        steps.append(Step(flag=key, old=old, new=new, verdict=verdict,
                          why=_sentence(row, key, old, new),
                          bound=batch_bound(verdict, row, old, new, figures or {})))
    return steps


def not_guided(space: Mapping[str, Sequence[Scalar]], engine: str) -> list[str]:
    """The flags of ``space``, in its order, that no row of ``engine``'s relax table names
    (for any verdict): a guided study says them as "not guided"."""
    named = {name for row in relaxers(engine) for name in row.names()}
    return [key for key in space if _bare(key) not in named]


#: Words for a row's direction in the rule table of ``docs/study.md``.
_DIRECTION_WORDS = {"up": "up", "down": "down", "on": "on (true)", "off": "off (false)"}


def rule_table(engine: str, *, title: str | None = None) -> str:
    """The engine's relax table as Markdown (verdict with the crash cause, the flag's
    spellings, the change, why), in the order a guided study tries the rows, under ``title``
    (default: the engine's name). ``docs/study.md`` holds these tables and a test checks that
    they match the registry."""
    lines = [f"**{title or engine}**", "", "| verdict | flag | change | why |",
             "|---|---|---|---|"]
    for row in relaxers(engine):
        verdict = row.verdict + (f" ({row.cause})" if row.cause else "")
        flag = "`" + "` / `".join(row.names()) + "`"
        change = (f"set `{_show(row.value)}`" if row.direction == "set"
                  else _DIRECTION_WORDS[row.direction])
        if row.needs:
            change += " (with " + ", ".join(f"`{name}` {_show(value)}"
                                            for name, value in row.needs) + ")"
        if row.batch_limit:
            change += ", if the batch reached it"
        lines.append(f"| {verdict} | {flag} | {change} | {row.why} |")
    return "\n".join(lines)


def rule_tables() -> str:
    """Every registered engine's :func:`rule_table`, by name, a blank line between; engines
    that share one table (SGLang and the sim) are shown once, under both names."""
    groups: dict[tuple[Relaxer, ...], list[str]] = {}
    for name in relax_engines():
        groups.setdefault(relaxers(name), []).append(name)
    return "\n\n".join(rule_table(names[0], title=", ".join(names))
                        for names in groups.values())


__all__ = [
    "NEGATIVE_PREFIXES",
    "Bound",
    "Relaxer",
    "Step",
    "batch_bound",
    "next_steps",
    "not_guided",
    "register_relaxers",
    "relaxers",
    "rule_table",
    "rule_tables",
    "same_value",
    "space_values",
]
