"""The bases of the frozen pydantic models that cross a room's boundary.

:class:`Frozen` is immutable and reads fields it does not know (``extra="ignore"``, pydantic's
default: a stored record must read the rows an older or newer version wrote);
:class:`FrozenStrict` refuses them (``extra="forbid"``: a value built in this process, or a
document that must match its schema exactly). :data:`Port` is the one TCP port type.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """An immutable model that ignores unknown fields."""

    model_config = ConfigDict(frozen=True)


class FrozenStrict(BaseModel):
    """An immutable model that refuses unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


#: A TCP port: 1 to 65535.
Port = Annotated[int, Field(ge=1, le=65535)]


__all__ = ["Frozen", "FrozenStrict", "Port"]
