"""Why this number: what limited a level, from its observations, the levels before it and the
configuration in effect (``docs/bench.md``, "Why: the bottleneck verdict").

:func:`diagnose` applies the rules of :data:`RULES` in their order; the first that matches
gives the verdict, those that match after it are listed in ``also`` (a throttled GPU beside a
compute-bound batch). Each rule is one pure function over a :class:`Seen` (the level, the
levels before it, the configuration in effect, the workload) that returns a :class:`Match`, or
``None`` with what it lacked to decide noted in :attr:`Seen.missing`. A verdict is never
guessed: no rule matching is ``unknown``, with ``missing`` saying what was not there.

``confidence``: ``clear`` only where the engine's own metrics show the signature (running at
its cap, KV usage, preemptions, per-rank counts) or the level's own record does (it ended
early, its requests failed); ``likely`` from the client's figures and GPU telemetry alone.

Advice names the engine's own flag: each engine adapter (``cleanslate.engines``) keeps an
:data:`AdviceBook` (verdict -> :class:`AdviceEntry`) and registers it with
:func:`register_advice`; ``bench`` never imports an engine. The text names the value in effect
when the configuration says it (``raise --max-running-requests above 64``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import Field

from cleanslate.models import Frozen

if TYPE_CHECKING:
    from cleanslate.bench._models import LevelResult
    from cleanslate.bench._server_config import ServerConfig
    from cleanslate.bench._workloads import WorkloadSpec

BottleneckKind = Literal["running_cap", "kv_capacity", "compute", "offered_load", "client",
                         "throttled", "cache_inflated", "dp_imbalance", "crashed", "errors",
                         "unknown"]
Confidence = Literal["clear", "likely", "unknown"]
Direction = Literal["raise", "lower", "set", "enable", "disable", "check"]

#: Every verdict, in the JSON's spelling.
BOTTLENECK_KINDS: tuple[str, ...] = get_args(BottleneckKind)


class Advice(Frozen):
    """One thing to try: the engine's ``flag`` (``--max-running-requests``), which way
    (``direction``) and the sentence to print (``text``)."""

    flag: str
    direction: Direction
    text: str


class Bottleneck(Frozen):
    """What limited a level.

    ``verdict``: one of :data:`BOTTLENECK_KINDS`; ``confidence``: ``clear`` (the engine's
    metrics or the level's own record show it), ``likely`` (client figures and telemetry
    only) or ``unknown``; ``evidence``: printable lines with the figures; ``figures``: the same
    figures as numbers by name (``running_max``, ``cap``, ``waiting_mean``...); ``advice``: the
    engine's flags to try; ``missing``: what was not there to decide (no engine metrics, no
    level before); ``rule``: the rule that decided; ``also``: verdicts of later rules that
    matched too."""

    verdict: BottleneckKind
    confidence: Confidence
    evidence: tuple[str, ...] = ()
    figures: dict[str, float] = Field(default_factory=dict)
    advice: tuple[Advice, ...] = ()
    missing: tuple[str, ...] = ()
    rule: str = ""
    also: tuple[BottleneckKind, ...] = ()

    def summary(self) -> str:
        """One line: ``running_cap (clear): <first evidence>; <first advice>``."""
        head = f"{self.verdict} ({self.confidence})"
        parts = [p for p in (self.evidence[:1] + tuple(a.text for a in self.advice[:1])) if p]
        if self.verdict == "unknown" and self.missing:
            parts = [f"missing: {', '.join(self.missing)}"]
        return head + (": " + "; ".join(parts) if parts else "")


# -- advice ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdviceEntry:
    """One entry of an engine's advice book: ``flag`` and ``direction``, why (``why``: the
    second half of the sentence), and ``setting``: the key of ``ServerConfig.in_effect`` whose
    value the text names (``max_running_requests``), when there is one."""

    flag: str
    direction: Direction
    why: str
    setting: str | None = None

    def render(self, config: ServerConfig | None) -> Advice:
        """The advice with the value in effect named where the configuration says it:
        ``raise --max-running-requests above 64: ...``."""
        value = None
        if self.setting is not None and config is not None:
            value = config.in_effect.get(self.setting)
        if value is None or isinstance(value, bool):
            head = f"{self.direction} {self.flag}"
        elif self.direction == "raise":
            head = f"raise {self.flag} above {_show(value)}"
        elif self.direction == "lower":
            head = f"lower {self.flag} below {_show(value)}"
        else:
            head = f"{self.direction} {self.flag} (now {_show(value)})"
        return Advice(flag=self.flag, direction=self.direction, text=f"{head}: {self.why}")


#: An engine's advice: per verdict, the entries to print, most useful first.
AdviceBook = Mapping[str, tuple[AdviceEntry, ...]]


def advice_book(entries: Mapping[str, Sequence[AdviceEntry]]) -> AdviceBook:
    """A read-only book; a key that is not a verdict is a ``ValueError`` (a mistake in an
    adapter)."""
    unknown = sorted(set(entries) - set(BOTTLENECK_KINDS))
    if unknown:
        raise ValueError(f"not a bottleneck verdict: {', '.join(unknown)}")
    return MappingProxyType({k: tuple(v) for k, v in entries.items()})


_BOOKS: dict[str, AdviceBook] = {}


def register_advice(engine: str, book: AdviceBook) -> None:
    """Make ``book`` the advice of ``engine`` (the engine registry calls this for every
    adapter that has one; a second registration of a name replaces the first)."""
    _BOOKS[engine] = book


def advice_for(engine: str | None) -> AdviceBook | None:
    """The book registered for ``engine``, or ``None``."""
    return _BOOKS.get(engine) if engine else None


def _show(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# -- what a rule sees ------------------------------------------------------------------------


@dataclass
class Seen:
    """What the rules read: the level, the levels before it (in order, oldest first), the
    configuration in effect and the workload; ``missing`` collects what a rule lacked (a
    rule notes it and returns ``None``)."""

    level: LevelResult
    before: tuple[LevelResult, ...] = ()
    config: ServerConfig | None = None
    workload: WorkloadSpec | None = None
    max_error_rate: float = 0.01
    missing: list[str] = field(default_factory=list)

    def lack(self, what: str) -> None:
        if what not in self.missing:
            self.missing.append(what)


@dataclass(frozen=True)
class Match:
    """A rule's finding: the verdict, how sure, the evidence lines and their figures."""

    verdict: BottleneckKind
    confidence: Confidence
    evidence: tuple[str, ...]
    figures: Mapping[str, float] = field(default_factory=dict)


Rule = Callable[[Seen], "Match | None"]


# -- the rules -------------------------------------------------------------------------------


def crashed(seen: Seen) -> Match | None:
    """The level ended before its requests or duration: the server was lost (or the run was
    interrupted). Clear: the level's own record says so."""
    lv = seen.level
    if not lv.partial:
        return None
    why = lv.partial_reason or "the level ended early"
    return Match("crashed", "clear",
                 (f"the level ended early after {lv.completed + lv.failed} of "
                  f"{lv.num_prompts} requests: {why}",),
                 {"completed": lv.completed, "failed": lv.failed})


def errors(seen: Seen) -> Match | None:
    """More requests failed than the level allows (``max_error_rate``), or none completed."""
    lv = seen.level
    if lv.failed == 0 or (lv.error_rate <= seen.max_error_rate and lv.completed > 0):
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(lv.errors.items(), key=lambda kv: -kv[1]))
    return Match("errors", "clear",
                 (f"{lv.failed} of {lv.failed + lv.completed} requests failed "
                  f"({lv.error_rate:.1%}, allowed {seen.max_error_rate:.1%})"
                  + (f": {kinds}" if kinds else ""),),
                 {"error_rate": lv.error_rate, "failed": lv.failed})


#: The rules in their order: the first match is the verdict.
RULES: tuple[tuple[str, Rule], ...] = (
    ("crashed", crashed),
    ("errors", errors),
)


def _figures(figures: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in figures.items() if math.isfinite(float(v))}


def diagnose(level: LevelResult, before: Sequence[LevelResult] = (),
             config: ServerConfig | None = None, engine: str | None = None, *,
             workload: WorkloadSpec | None = None,
             max_error_rate: float = 0.01) -> Bottleneck:
    """What limited ``level``, given the levels measured ``before`` it (oldest first), the
    configuration in effect (``config``) and the engine (``engine``: an adapter's name; else
    ``config.engine``, ``config.flavour`` or the metrics' flavour pick the advice book).
    ``workload``: what the run sent (the cache rule needs it); ``max_error_rate``: the run's
    (``BenchConfig.max_error_rate``). Pure: reads only its arguments and the advice books."""
    seen = Seen(level, tuple(before), config, workload, max_error_rate)
    matches: list[tuple[str, Match]] = []
    for name, rule in RULES:
        found = rule(seen)
        if found is not None:
            matches.append((name, found))
    if not matches:
        if not seen.missing:
            seen.lack("a signature: no rule matched")
        return Bottleneck(verdict="unknown", confidence="unknown",
                          evidence=(f"not enough to decide: {', '.join(seen.missing)}",),
                          missing=tuple(seen.missing), rule="unknown")
    name, first = matches[0]
    also: list[BottleneckKind] = []
    for _, m in matches[1:]:
        if m.verdict != first.verdict and m.verdict not in also:
            also.append(m.verdict)
    book = _book(engine, config, level)
    entries = book.get(first.verdict, ()) if book is not None else ()
    return Bottleneck(verdict=first.verdict, confidence=first.confidence,
                      evidence=first.evidence, figures=_figures(first.figures),
                      advice=tuple(e.render(config) for e in entries),
                      missing=tuple(seen.missing), rule=name, also=tuple(also))


def _book(engine: str | None, config: ServerConfig | None,
          level: LevelResult) -> AdviceBook | None:
    metrics = level.server_metrics
    for name in (engine, config.engine if config else None, config.flavour if config else None,
                 metrics.flavour if metrics else None):
        book = advice_for(name)
        if book is not None:
            return book
    return None


__all__ = [
    "BOTTLENECK_KINDS",
    "RULES",
    "Advice",
    "AdviceBook",
    "AdviceEntry",
    "Bottleneck",
    "BottleneckKind",
    "Confidence",
    "Direction",
    "Match",
    "Seen",
    "advice_book",
    "advice_for",
    "diagnose",
    "register_advice",
]
