"""The bases of the frozen pydantic models that cross a room's boundary.

:class:`Frozen` is immutable and reads fields it does not know (``extra="ignore"``, pydantic's
default: a stored record must read the rows an older or newer version wrote);
:class:`FrozenStrict` refuses them (``extra="forbid"``: a value built in this process, or a
document that must match its schema exactly).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable model that ignores unknown fields."""

    model_config = ConfigDict(frozen=True)


class FrozenStrict(BaseModel):
    """An immutable model that refuses unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


__all__ = ["Frozen", "FrozenStrict"]
