"""SQLAlchemy tables of the project (prefixed ``cs_`` to live beside Optuna's)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, Index, Integer, String, Text, text
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


class LeaseRow(Base):
    """One claim of a configuration by a worker on a slot (``store/_leases.py``). At most one
    ``active`` lease per configuration of a study: a partial unique index, on SQLite and
    PostgreSQL alike, besides the lock the claim takes."""

    __tablename__ = "cs_leases"
    __table_args__ = (
        Index("cs_leases_one_active", "study", "key", unique=True,
              sqlite_where=text("state = 'active'"), postgresql_where=text("state = 'active'")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str] = mapped_column(String(255), index=True)
    key: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16), index=True)
    worker: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    slot: Mapped[str] = mapped_column(String(512))
    trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    acquired_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class SlotRow(Base):
    """A slot of a study that is suspect or quarantined, with the evidence."""

    __tablename__ = "cs_slots"

    study: Mapped[str] = mapped_column(String(255), primary_key=True)
    slot: Mapped[str] = mapped_column(String(512), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Float)


class HostRow(Base):
    """A doctor snapshot of a host (``store/_hosts.py``): one per host of a study (``study``
    set; a partial unique index on study, host and machine, on SQLite and PostgreSQL alike),
    or one per ``serve`` run (``run_id`` set)."""

    __tablename__ = "cs_hosts"
    __table_args__ = (
        Index("cs_hosts_one_per_study", "study", "host", "machine", unique=True,
              sqlite_where=text("study IS NOT NULL"),
              postgresql_where=text("study IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str | None] = mapped_column(String(255), nullable=True, index=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    host: Mapped[str] = mapped_column(String(255))
    machine: Mapped[str] = mapped_column(String(255), default="")
    taken_at: Mapped[float] = mapped_column(Float)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class BenchRow(Base):
    """One ``cleanslate bench`` (``store/_benches.py``): its result and options, linked to the
    run it measured (``run_id``; ``None`` for a bench of a bare URL)."""

    __tablename__ = "cs_benches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    model: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
