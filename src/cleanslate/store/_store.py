"""The :class:`Store`: records in, records out, redacted both ways."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from cleanslate.errors import InputError
from cleanslate.store._claims import LeaseStore
from cleanslate.store._open import (
    DEFAULT_STORE_URL,
    STORE_ENV,
    _guarded,
    artifacts_root,
    display_url,
    resolve_store_url,
    tighten,
)
from cleanslate.store._records import RunRecord, RunStatus
from cleanslate.store._tables import BenchRow, HostRow, RunRow, StudyRow, TrialRow

if TYPE_CHECKING:  # the benchmark client (a trial's levels) is imported when trials are read
    from cleanslate.store._benches import BenchRecord
    from cleanslate.store._hosts import HostRecord
    from cleanslate.store._trials import StudyRecord, StudyStatus, TrialRecord, TrialStatus


def study_digest(spec: Any) -> str:
    """``sha256:<hex>`` of a study definition as the store holds it (:attr:`StudyRecord.spec`,
    secrets redacted), over its canonical JSON: keys sorted, no blanks, UTF-8. Every worker
    launches what that row says (its ``engine``, ``launch``, ``fixed`` and ``space``): a worker
    logs this digest, so that what it ran can be compared with what was registered."""
    import hashlib
    import json

    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()



class Store(LeaseStore):
    """Runs (and, with the tuner, studies and trials) in one SQLAlchemy database: opened as a
    :class:`~cleanslate.store._open.Database`, with the leases and slots of
    :class:`~cleanslate.store._claims.LeaseStore`.

    Thread safety: one ``Store`` may be shared by threads; each call opens its own session.
    """

    @_guarded("saving a run")
    def save_run(self, run: RunRecord) -> None:
        """Insert or replace a run record, redacted (:meth:`redacted`) whoever built it, at
        the current schema version."""
        with Session(self.engine) as session, session.begin():
            row = session.get(RunRow, run.id)
            data = self.redacted(run.to_document())
            if row is None:
                session.add(RunRow(id=run.id, host=data["host"], engine=data["engine"],
                                   model=data["model"], status=run.status.value, data=data,
                                   started_at=run.started_at, updated_at=time.time(),
                                   study=run.study, trial=run.trial))
            else:
                row.status = run.status.value
                row.data = data
                row.updated_at = time.time()

    @_guarded("reading a run")
    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id; an unknown id is an :class:`InputError`."""
        if self._empty:
            raise InputError(f"no run {run_id!r} in {self.display_url}",
                             hint="this database holds no cleanslate records; pass --store if "
                                  "it is another one")
        with Session(self.engine) as session:
            row = session.get(RunRow, run_id)
            if row is None:
                known = session.scalars(
                    select(RunRow.id).order_by(RunRow.started_at.desc()).limit(5)
                ).all()
                raise InputError(
                    f"no run {run_id!r} in {self.display_url}",
                    hint=("recent runs: " + ", ".join(known)) if known else
                    "no runs are recorded in this store; pass --store if it is another one",
                )
            return RunRecord.from_document(self.redacted(row.data))

    @_guarded("reading runs")
    def runs(self, *, status: RunStatus | None = None,
             study: str | None = None) -> list[RunRecord]:
        """Run records, oldest first, redacted (stores written before redaction included);
        only those with this ``status`` or of this ``study`` when given."""
        if self._empty:
            return []
        with Session(self.engine) as session:
            query = select(RunRow).order_by(RunRow.started_at)
            if status is not None:
                query = query.where(RunRow.status == RunStatus(status).value)
            if study is not None:
                query = query.where(RunRow.study == study)
            return [RunRecord.from_document(self.redacted(r.data))
                    for r in session.scalars(query)]

    # -- studies and trials ---------------------------------------------------------------------

    @_guarded("saving a study")
    def save_study(self, name: str, spec: dict[str, Any], status: StudyStatus) -> float:
        """Create or update a study (its spec redacted: :meth:`redacted`); returns when it was
        first created (epoch seconds). ``spec`` is the study file's JSON."""
        from cleanslate.store._trials import StudyStatus

        now = time.time()
        spec = self.redacted(spec)
        value = StudyStatus(status).value
        with Session(self.engine) as session, session.begin():
            row = session.get(StudyRow, name)
            if row is None:
                row = StudyRow(name=name, spec=spec, status=value, created_at=now,
                               updated_at=now, elapsed_s=0.0)
                session.add(row)
            else:
                row.spec = spec
                row.status = value
                row.updated_at = now
            return float(row.created_at)

    @_guarded("saving a study")
    def add_study_time(self, name: str, seconds: float) -> float:
        """Add wall time spent on a study; returns its total (for ``budget.hours``)."""
        with Session(self.engine) as session, session.begin():
            row = session.get(StudyRow, name)
            if row is None:
                return seconds
            row.elapsed_s = float(row.elapsed_s or 0.0) + seconds
            return float(row.elapsed_s)

    @_guarded("reading a study")
    def study(self, name: str) -> StudyRecord | None:
        """The study (its spec redacted), ``None`` for an unknown name."""
        from cleanslate.store._trials import StudyRecord

        if self._empty:
            return None
        with Session(self.engine) as session:
            row = session.get(StudyRow, name)
            if row is None:
                return None
            return StudyRecord.model_validate({
                "name": row.name, "spec": self.redacted(row.spec), "status": row.status,
                "created_at": row.created_at, "updated_at": row.updated_at,
                "elapsed_s": row.elapsed_s or 0.0})

    @_guarded("reading studies")
    def studies(self) -> list[str]:
        """The names of the studies, oldest first."""
        if self._empty:
            return []
        with Session(self.engine) as session:
            return list(session.scalars(select(StudyRow.name).order_by(StudyRow.created_at)))

    @_guarded("saving a trial")
    def save_trial(self, trial: TrialRecord) -> TrialRecord:
        """Insert (``id`` None) or update a trial, redacted (:meth:`redacted`) in the store at
        the current schema version; returns the given record with its id."""
        with Session(self.engine) as session, session.begin():
            row = session.get(TrialRow, trial.id) if trial.id is not None else None
            if row is None:
                row = TrialRow(study=trial.study, number=trial.number, status=trial.status.value,
                               data={}, started_at=trial.started_at, updated_at=time.time())
                session.add(row)
                session.flush()
            trial = trial.model_copy(update={"id": row.id})
            row.status = trial.status.value
            row.number = trial.number
            row.data = self.redacted(trial.to_document())
            row.updated_at = time.time()
            return trial

    @_guarded("reading trials")
    def trials(self, study: str, *, status: TrialStatus | None = None) -> list[TrialRecord]:
        """A study's trial records in insertion order, redacted; only those with this
        ``status`` when given."""
        from cleanslate.store._trials import TrialRecord, TrialStatus

        if self._empty:
            return []
        with Session(self.engine) as session:
            query = select(TrialRow).where(TrialRow.study == study).order_by(TrialRow.id)
            if status is not None:
                query = query.where(TrialRow.status == TrialStatus(status).value)
            return [TrialRecord.from_document(self.redacted(r.data))
                    for r in session.scalars(query)]

    # -- host snapshots -------------------------------------------------------------------------

    @_guarded("saving a host snapshot")
    def save_host(self, record: HostRecord) -> HostRecord | None:
        """Insert a host's doctor snapshot, redacted (:meth:`redacted`); returns it with its id.
        A study keeps one per host and machine: when it has one already (another worker on the
        host recorded it first), nothing is written and ``None`` is returned."""
        data = self.redacted(record.to_document())
        try:
            with Session(self.engine) as session, session.begin():
                row = HostRow(study=record.study, run_id=record.run_id, host=record.host,
                              machine=record.machine, taken_at=record.snapshot.taken_at,
                              data=data)
                session.add(row)
                session.flush()
                row.data = {**data, "id": row.id}
                row_id = row.id
        except IntegrityError:
            if record.study is None or not self.has_host(record.study, record.host,
                                                         record.machine):
                raise
            return None
        return record.model_copy(update={"id": row_id})

    @_guarded("reading host snapshots")
    def has_host(self, study: str, host: str, machine: str = "") -> bool:
        """Whether the study has a snapshot of this host (and machine) already."""
        if self._empty or not inspect(self.engine).has_table(HostRow.__tablename__):
            return False
        with Session(self.engine) as session:
            return session.scalar(select(HostRow.id).where(
                HostRow.study == study, HostRow.host == host,
                HostRow.machine == machine).limit(1)) is not None

    @_guarded("reading host snapshots")
    def hosts(self, *, study: str | None = None, run_id: str | None = None
              ) -> list[HostRecord]:
        """Host snapshots in the order they were taken, redacted: a study's, a run's, or
        (neither given) all of them. A store written before snapshots were recorded has
        none."""
        from cleanslate.store._hosts import HostRecord

        if self._empty or not inspect(self.engine).has_table(HostRow.__tablename__):
            return []
        with Session(self.engine) as session:
            query = select(HostRow).order_by(HostRow.taken_at, HostRow.id)
            if study is not None:
                query = query.where(HostRow.study == study)
            if run_id is not None:
                query = query.where(HostRow.run_id == run_id)
            return [HostRecord.from_document({**self.redacted(r.data), "id": r.id})
                    for r in session.scalars(query)]

    # -- benches --------------------------------------------------------------------------------

    def _has_benches(self) -> bool:
        """Whether the database has the benches table (a store of schema 5 or older, opened
        by a reading command, has none)."""
        return not self._empty and inspect(self.engine).has_table(BenchRow.__tablename__)

    @_guarded("saving a bench")
    def save_bench(self, bench: BenchRecord) -> None:
        """Insert or replace a bench record, redacted (:meth:`redacted`), at the current
        schema version."""
        data = self.redacted(bench.to_document())
        with Session(self.engine) as session, session.begin():
            row = session.get(BenchRow, bench.id)
            if row is None:
                session.add(BenchRow(id=bench.id, run_id=bench.run_id, model=data["model"],
                                     created_at=bench.created_at, data=data))
            else:
                row.run_id = bench.run_id
                row.model = data["model"]
                row.created_at = bench.created_at
                row.data = data

    @_guarded("reading a bench")
    def bench(self, bench_id: str) -> BenchRecord | None:
        """The bench with this id, redacted; ``None`` for an unknown id (or a store without
        benches)."""
        from cleanslate.store._benches import BenchRecord

        if not self._has_benches():
            return None
        with Session(self.engine) as session:
            row = session.get(BenchRow, bench_id)
            return None if row is None else BenchRecord.from_document(self.redacted(row.data))

    @_guarded("reading benches")
    def benches(self, *, run_id: str | None = None, limit: int | None = None
                ) -> list[BenchRecord]:
        """Bench records, newest first, redacted: only those of this run when ``run_id`` is
        given; at most ``limit``."""
        from cleanslate.store._benches import BenchRecord

        if not self._has_benches():
            return []
        with Session(self.engine) as session:
            query = select(BenchRow).order_by(BenchRow.created_at.desc(), BenchRow.id.desc())
            if run_id is not None:
                query = query.where(BenchRow.run_id == run_id)
            if limit is not None:
                query = query.limit(limit)
            return [BenchRecord.from_document(self.redacted(r.data))
                    for r in session.scalars(query)]

    @_guarded("reading benches")
    def bench_ids(self, limit: int = 5) -> list[str]:
        """The ids of the newest benches (for a hint naming what there is)."""
        if not self._has_benches():
            return []
        with Session(self.engine) as session:
            return list(session.scalars(select(BenchRow.id).order_by(
                BenchRow.created_at.desc()).limit(limit)))


__all__ = ["DEFAULT_STORE_URL", "STORE_ENV", "SQLAlchemyError", "Store", "artifacts_root",
           "display_url", "resolve_store_url", "study_digest", "tighten"]
