"""The :class:`Store` and the :class:`RunRecord` it keeps."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from cleanslate.errors import InputError
from cleanslate.store._tables import Base, RunRow, StudyRow, TrialRow

STORE_ENV = "CLEANSLATE_STORE"
DEFAULT_STORE_URL = "sqlite:///cleanslate.db"


def resolve_store_url(url: str | None) -> str:
    """``--store`` if given, else ``$CLEANSLATE_STORE``, else ``sqlite:///cleanslate.db``.

    A bare path (``runs.db``) is taken as a SQLite file.
    """
    value = url or os.environ.get(STORE_ENV) or DEFAULT_STORE_URL
    if "://" not in value:
        value = f"sqlite:///{value}"
    if value.startswith(("postgresql://", "postgres://")):
        # SQLAlchemy's default PostgreSQL driver is psycopg2; the one we depend on is psycopg 3.
        value = "postgresql+psycopg://" + value.split("://", 1)[1]
    return value


def artifacts_root(url: str) -> Path:
    """The folder for logs beside the store: ``<db dir>/artifacts`` for SQLite, else
    ``./artifacts`` (or ``$CLEANSLATE_ARTIFACTS``)."""
    override = os.environ.get("CLEANSLATE_ARTIFACTS")
    if override:
        return Path(override)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(parsed.database).resolve().parent / "artifacts"
    return Path("artifacts").resolve()


class RunRecord(BaseModel):
    """A launched server as the store keeps it. Times are epoch seconds.

    ``pid`` is the engine's root process, ``supervisor_pid`` the process that started it (the
    child subreaper, locally); ``create_time`` fields guard against PID reuse. ``marker`` is the
    value of ``CLEANSLATE_RUN`` in the run's environment: every process of the run carries it.
    ``boot_id`` (``/proc/sys/kernel/random/boot_id``) and ``machine_id`` (``/etc/machine-id``)
    say which boot of which machine the PIDs belong to: a record from another boot or machine
    names no live process. ``cgroup`` is the run's own cgroup (v2) path when the host allowed
    one to be made, ``None`` otherwise.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    host: str
    engine: str
    model: str
    argv: tuple[str, ...]
    flags: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    marker: str
    port: int
    gpus: tuple[int, ...] | None = None
    url: str
    log_path: str
    artifacts_dir: str
    status: str = "starting"
    cause: str | None = None
    detail: str | None = None
    log_tail: str | None = None
    pid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    create_time: float | None = None
    supervisor_pid: int | None = None
    supervisor_create_time: float | None = None
    started_at: float = Field(default_factory=time.time)
    ready_at: float | None = None
    stopped_at: float | None = None
    phases: dict[str, float] = Field(default_factory=dict)
    verdict_before: dict[str, Any] | None = None
    verdict_after: dict[str, Any] | None = None
    teardown: dict[str, Any] | None = None
    shm_before: tuple[str, ...] = ()
    study: str | None = None
    trial: int | None = None
    boot_id: str | None = None
    machine_id: str | None = None
    cgroup: str | None = None
    user: str | None = None


class TrialRecord(BaseModel):
    """One trial as the store keeps it.

    ``status``: ``running`` (its cycle is under way, or its controller died), ``feasible``
    (measured, at least one level met the SLOs), ``infeasible`` (a result: failed to start, OOM,
    NaN, crashed under load or missed every SLO; ``cause`` says which), ``infra_failed`` (the
    host was dirty or unreachable: not a result; the configuration is run again).
    ``levels`` are the benchmark levels (:class:`cleanslate.bench.LevelResult` JSON) in order.
    """

    model_config = ConfigDict(frozen=True)

    id: int | None = None
    study: str
    number: int
    params: dict[str, Any]
    flags: dict[str, Any] = Field(default_factory=dict)
    status: str = "running"
    cause: str | None = None
    detail: str | None = None
    value: float | None = None
    best_level: str | None = None
    levels: tuple[dict[str, Any], ...] = ()
    level_verdicts: dict[str, str] = Field(default_factory=dict)
    phases: dict[str, float] = Field(default_factory=dict)
    run_id: str | None = None
    argv: tuple[str, ...] = ()
    host: str | None = None
    log_tail: str | None = None
    verdict_before: str | None = None
    verdict_after: str | None = None
    findings_before: tuple[dict[str, Any], ...] = ()
    findings_after: tuple[dict[str, Any], ...] = ()
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None


class Store:
    """Runs (and, with the tuner, studies and trials) in one SQLAlchemy database.

    Thread safety: one ``Store`` may be shared by threads; each call opens its own session.
    """

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_store_url(url)
        try:
            self.engine: Engine = create_engine(self.url, future=True)
        except (ArgumentError, ValueError) as exc:
            raise InputError(f"not a database URL: {exc}", where="--store",
                             hint="sqlite:///cleanslate.db or postgresql://user@host/db") from None
        except ModuleNotFoundError as exc:
            raise InputError(f"the database driver is not installed: {exc.name}",
                             where="--store",
                             hint="pip install 'psycopg[binary]' for postgresql:// URLs") from None
        try:
            Base.metadata.create_all(self.engine)
        except OperationalError as exc:
            raise InputError(f"cannot open the store: {exc.orig}", where="--store") from None

    @property
    def artifacts(self) -> Path:
        return artifacts_root(self.url)

    def save_run(self, run: RunRecord) -> None:
        """Insert or replace a run record."""
        with Session(self.engine) as session, session.begin():
            row = session.get(RunRow, run.id)
            data = run.model_dump(mode="json")
            if row is None:
                session.add(RunRow(id=run.id, host=run.host, engine=run.engine, model=run.model,
                                   status=run.status, data=data, started_at=run.started_at,
                                   updated_at=time.time(), study=run.study, trial=run.trial))
            else:
                row.status = run.status
                row.data = data
                row.updated_at = time.time()

    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id; an unknown id is an :class:`InputError`."""
        with Session(self.engine) as session:
            row = session.get(RunRow, run_id)
            if row is None:
                known = session.scalars(
                    select(RunRow.id).order_by(RunRow.started_at.desc()).limit(5)
                ).all()
                raise InputError(
                    f"no run {run_id!r} in {self.url}",
                    hint=("recent runs: " + ", ".join(known)) if known else
                    "no runs are recorded in this store; pass --store if it is another one",
                )
            return RunRecord.model_validate(row.data)

    def runs(self, *, status: str | None = None, study: str | None = None) -> list[RunRecord]:
        with Session(self.engine) as session:
            query = select(RunRow).order_by(RunRow.started_at)
            if status is not None:
                query = query.where(RunRow.status == status)
            if study is not None:
                query = query.where(RunRow.study == study)
            return [RunRecord.model_validate(r.data) for r in session.scalars(query)]

    # -- studies and trials ---------------------------------------------------------------------

    def save_study(self, name: str, spec: dict[str, Any], status: str) -> float:
        """Create or update a study; returns when it was first created (epoch seconds)."""
        now = time.time()
        with Session(self.engine) as session, session.begin():
            row = session.get(StudyRow, name)
            if row is None:
                row = StudyRow(name=name, spec=spec, status=status, created_at=now,
                               updated_at=now, elapsed_s=0.0)
                session.add(row)
            else:
                row.spec = spec
                row.status = status
                row.updated_at = now
            return float(row.created_at)

    def add_study_time(self, name: str, seconds: float) -> float:
        """Add wall time spent on a study; returns its total (for ``budget.hours``)."""
        with Session(self.engine) as session, session.begin():
            row = session.get(StudyRow, name)
            if row is None:
                return seconds
            row.elapsed_s = float(row.elapsed_s or 0.0) + seconds
            return float(row.elapsed_s)

    def study(self, name: str) -> dict[str, Any] | None:
        with Session(self.engine) as session:
            row = session.get(StudyRow, name)
            if row is None:
                return None
            return {"name": row.name, "spec": row.spec, "status": row.status,
                    "created_at": row.created_at, "updated_at": row.updated_at,
                    "elapsed_s": row.elapsed_s}

    def studies(self) -> list[str]:
        with Session(self.engine) as session:
            return list(session.scalars(select(StudyRow.name).order_by(StudyRow.created_at)))

    def save_trial(self, trial: TrialRecord) -> TrialRecord:
        """Insert (``id`` None) or update a trial; returns it with its id."""
        with Session(self.engine) as session, session.begin():
            row = session.get(TrialRow, trial.id) if trial.id is not None else None
            if row is None:
                row = TrialRow(study=trial.study, number=trial.number, status=trial.status,
                               data={}, started_at=trial.started_at, updated_at=time.time())
                session.add(row)
                session.flush()
            trial = trial.model_copy(update={"id": row.id})
            row.status = trial.status
            row.number = trial.number
            row.data = trial.model_dump(mode="json")
            row.updated_at = time.time()
            return trial

    def trials(self, study: str, *, status: str | None = None) -> list[TrialRecord]:
        with Session(self.engine) as session:
            query = select(TrialRow).where(TrialRow.study == study).order_by(TrialRow.id)
            if status is not None:
                query = query.where(TrialRow.status == status)
            return [TrialRecord.model_validate(r.data) for r in session.scalars(query)]

    def close(self) -> None:
        self.engine.dispose()


__all__ = ["RunRecord", "SQLAlchemyError", "Store", "TrialRecord"]
