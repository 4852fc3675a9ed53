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


class StudyRow(Base):
    """One study: its validated spec and when it ran."""

    __tablename__ = "cs_studies"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    elapsed_s: Mapped[float] = mapped_column(Float, default=0.0)


class TrialRow(Base):
    """One trial of a study: a configuration, its full cycle, and its result."""

    __tablename__ = "cs_trials"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(String(255), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    started_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
