"""SQLAlchemy tables of the project (prefixed ``cs_`` to live beside Optuna's)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    """One launched server: what was started, where, with which PIDs, and how it ended."""

    __tablename__ = "cs_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    engine: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(32), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    started_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    study: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
