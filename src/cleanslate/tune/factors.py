"""A factor of a study's search space, and its Optuna distribution.

Both the study file (:mod:`cleanslate.tune.study`, which checks every distribution when the file
loads) and the strategies (:mod:`cleanslate.tune.space`) need these; they live here so that
neither of the two imports the other's module back.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:  # Optuna is imported when a distribution is built
    from optuna.distributions import BaseDistribution

Scalar = bool | int | float | str | None

#: Values of one factor: the ``points`` of a range, or the items of a list.
MAX_POINTS = 1_000

#: Strategies that sample ranges as ranges (the others need discrete values).
SAMPLED_STRATEGIES = frozenset({"tpe", "random"})


class Range(BaseModel):
    """A numeric factor: ``{int: [low, high], log: true}`` or ``{float: [low, high], step: .05}``.

    Grid and ablation studies need discrete values: ``values`` if given, else ``points``
    values spread from low to high (geometrically with ``log``).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    int_: tuple[int, int] | None = Field(default=None, alias="int")
    float_: tuple[float, float] | None = Field(default=None, alias="float")
    log: bool = False
    step: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    points: int = Field(default=3, ge=2, le=MAX_POINTS)

    @model_validator(mode="after")
    def _one_kind(self) -> Range:
        if (self.int_ is None) == (self.float_ is None):
            raise ValueError("a range is {int: [low, high]} or {float: [low, high]}")
        low, high = self.bounds
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError("range bounds must be finite numbers")
        if low >= high:
            raise ValueError(f"range low {low} must be below high {high}")
        if self.log and low <= 0:
            raise ValueError("a log range needs low > 0")
        return self

    @property
    def is_int(self) -> bool:
        return self.int_ is not None

    @property
    def bounds(self) -> tuple[float, float]:
        pair = self.int_ if self.int_ is not None else self.float_
        assert pair is not None
        return float(pair[0]), float(pair[1])

    def discrete(self) -> list[Scalar]:
        low, high = self.bounds
        n = self.points
        if self.log:
            raw = [low * (high / low) ** (i / (n - 1)) for i in range(n)]
        else:
            raw = [low + (high - low) * i / (n - 1) for i in range(n)]
        if self.is_int:
            return list(dict.fromkeys(round(v) for v in raw))
        return [round(v, 6) for v in raw]


Factor = list[Scalar] | Range


def distribution(factor: Factor, values: list[Scalar], *, sampled: bool) -> BaseDistribution:
    """The Optuna distribution of one factor: a range as an int or float distribution when it
    is ``sampled`` (TPE, random), else categorical over ``values`` (its discrete values).
    Raises ``ValueError`` where Optuna refuses the range (checked when the study loads)."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(factor, Range) and sampled:
        low, high = factor.bounds
        if factor.is_int:
            if factor.step is not None and factor.step != int(factor.step):
                raise ValueError(f"the step of an integer range is an integer, not "
                                 f"{factor.step:g}")
            return IntDistribution(int(low), int(high), log=factor.log,
                                   step=int(factor.step) if factor.step else 1)
        return FloatDistribution(low, high, log=factor.log, step=factor.step)
    return CategoricalDistribution(values)


__all__ = ["MAX_POINTS", "SAMPLED_STRATEGIES", "Factor", "Range", "Scalar", "distribution"]
