"""What relaxes a bottleneck, in an engine's own flags: the rows a guided study reads.

Each engine adapter keeps a table of :class:`Relaxer` rows (``EngineAdapter.relaxers``),
registered with :func:`register_relaxers` when the adapter is (as its advice book is with the
bench's ``register_advice``). A row says: when the level that decides the objective has this
verdict (and, for ``crashed``, this crash cause), move this flag this way, because of ``why``.
The table's order is the order in which a guided study tries the rows
(``cleanslate.tune.guided.next_steps``).

Directions: ``up`` and ``down`` move a number to the next larger or smaller value of the
space; ``on`` and ``off`` are the value of the flag *as written* (``true`` / ``false``), never
of the feature it names: CUDA graphs on is ``disable-cuda-graph`` ``off``, and vLLM's
``enforce-eager`` ``off``; ``set`` gives the flag ``value``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from cleanslate.bench import BOTTLENECK_KINDS
from cleanslate.engines._crash import CRASH_CAUSES
from cleanslate.engines._flags import FlagScalar

RelaxDirection = Literal["up", "down", "on", "off", "set"]
RELAX_DIRECTIONS: tuple[str, ...] = get_args(RelaxDirection)


@dataclass(frozen=True)
class Relaxer:
    """One row of an engine's relax table.

    ``verdict``: a bottleneck verdict (``running_cap``, ``kv_capacity``, ``compute``,
    ``crashed``...); ``flag``: the flag as a study's space writes it, without dashes
    (``max-running-requests``); ``aliases``: other spellings of the same flag (llama.cpp's
    short ``np`` for ``parallel``); ``direction``: see the module docstring; ``why``: the
    reason said in the notebook (``requests queue behind the cap``); ``value``: the value of a
    ``set`` row (``fp8_e5m2``), else ``None``; ``cause``: for ``crashed`` only, the crash cause
    (``oom``, ``python_exception``) the row answers, ``None`` for any; ``needs``: flag values
    (as written, without dashes) the configuration must have for the row to matter (the graph
    capture limit only matters with CUDA graphs on: ``(("disable-cuda-graph", False),)``); a
    flag the configuration does not set is not known, and does not hold the row back;
    ``batch_limit``: the flag is a limit on the running batch (the largest captured graph), so
    raising it matters only when the deciding level's batch reached it: a guided step skips
    the row when the level's largest running batch (``running_max``, else ``batch``, of the
    verdict's figures) is at or below the value in effect.

    A row that breaks these rules is a :class:`ValueError` when it is built (a mistake in an
    adapter, found when the package imports).
    """

    verdict: str
    flag: str
    direction: RelaxDirection
    why: str
    value: FlagScalar = None
    cause: str | None = None
    aliases: tuple[str, ...] = ()
    needs: tuple[tuple[str, FlagScalar], ...] = ()
    batch_limit: bool = False

    def __post_init__(self) -> None:
        where = f"relax row {self.verdict}/{self.flag}"
        if self.verdict not in BOTTLENECK_KINDS:
            raise ValueError(f"{where}: not a bottleneck verdict")
        if not self.flag or self.flag.startswith("-"):
            raise ValueError(f"{where}: write the flag without dashes, as a space does")
        if self.direction not in RELAX_DIRECTIONS:
            raise ValueError(f"{where}: direction {self.direction!r} is not one of "
                             f"{', '.join(RELAX_DIRECTIONS)}")
        if (self.direction == "set") != (self.value is not None):
            raise ValueError(f"{where}: a value goes with direction 'set', and only with it")
        if self.cause is not None and (self.verdict != "crashed"
                                       or self.cause not in CRASH_CAUSES):
            raise ValueError(f"{where}: a cause is a crash cause, for verdict 'crashed' only")
        if not self.why:
            raise ValueError(f"{where}: say why")
        if any(not name or name.startswith("-") for name, _ in self.needs):
            raise ValueError(f"{where}: write a needed flag without dashes")

    def names(self) -> tuple[str, ...]:
        """The spellings of the flag: ``flag`` and its ``aliases``."""
        return (self.flag, *self.aliases)

    def matches(self, verdict: str, cause: str | None) -> bool:
        """Whether the row answers ``verdict`` (with the crash's ``cause``, which a row that
        names one must equal)."""
        return self.verdict == verdict and (self.cause is None or self.cause == cause)


_TABLES: dict[str, tuple[Relaxer, ...]] = {}


def register_relaxers(engine: str, rows: Sequence[Relaxer]) -> None:
    """Make ``rows`` the relax table of ``engine`` (the engine registry calls this for every
    adapter that has one; a second registration of a name replaces the first, and no rows
    remove the table)."""
    if rows:
        _TABLES[engine] = tuple(rows)
    else:
        _TABLES.pop(engine, None)


def relaxers(engine: str) -> tuple[Relaxer, ...]:
    """The table registered for ``engine`` in its order; ``()`` for an engine without one or
    a name that is no engine."""
    return _TABLES.get(engine, ())


def relax_engines() -> list[str]:
    """The engines with a table, sorted."""
    return sorted(_TABLES)
