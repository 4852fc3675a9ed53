"""Leases and slots in the store: who runs which configuration where, claimed atomically.

A claim reads what it chooses from inside the study's lock (:meth:`LeaseStore._study_lock`),
and :func:`choose_next` decides from those plain values which configuration it takes; the
store then writes that choice (a new ``active`` row, which the partial unique index
``cs_leases_one_active`` admits once per configuration). A lease changes afterwards only by
compare and set (:meth:`LeaseStore.compare_and_set`): while its row is still in the state its
worker saw.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from sqlalchemy import Text, cast, insert, inspect, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from cleanslate.store._leases import (
    Claim,
    InvalidLease,
    LeaseChange,
    LeaseColumns,
    LeaseOutcome,
    LeaseRecord,
    LeaseState,
    SlotRecord,
    config_key,
    lease_document,
    parse_lease,
)
from cleanslate.store._open import Database, _guarded
from cleanslate.store._tables import LeaseRow, SlotRow, TrialRow

#: Trial statuses that are results (``TrialStatus.finished``), as stored.
_FINISHED = ("feasible", "infeasible")

#: A configuration as a plan lists it: its key (:func:`config_key`) and its parameters.
Configuration = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Unreadable:
    """A row among the re-queue candidates that holds no lease: its id and why."""

    id: int
    reason: str


@dataclass(frozen=True)
class Pool:
    """What a claim chooses from, read inside the study's lock: the configuration keys of the
    study's results (one per finished trial), of its active leases and of its leases given
    back with a result; and, for a study without a plan, its expired and given-back leases
    oldest first (or why a row holds none) and every key it ever leased."""

    finished: Sequence[str]
    active: Collection[str]
    counted: Collection[str] = ()
    released: Sequence[LeaseRecord | Unreadable] = ()
    ever: Collection[str] = ()

    @property
    def taken(self) -> set[str]:
        """Keys that are not to be handed out: a result, an active lease or a counted one."""
        return {*self.finished, *self.active, *self.counted}


@dataclass(frozen=True)
class Choice:
    """What :func:`choose_next` decided: the configuration to claim (``None``: none now), the
    re-queued lease it comes from (to be checked against the study's space), whether the
    study's plan or budget is done, and the rows without a lease it passed over on the way."""

    configuration: Configuration | None = None
    requeued: LeaseRecord | None = None
    done: bool = False
    unreadable: tuple[Unreadable, ...] = ()


def choose_next(pool: Pool, *, plan: Sequence[Configuration] | None,
                first: Sequence[Configuration], limit: int, fresh: str,
                passed: Collection[int] = ()) -> Choice:
    """The configuration a claim takes (:meth:`LeaseStore.claim_lease` says which, in words).

    With a ``plan``: the first of its first ``limit`` configurations not taken. Without one,
    while results plus active leases are fewer than ``limit``: the oldest re-queued lease
    (expired or given back without a result, not taken, not a sampler's unbound ``new:...``),
    else one of ``first`` never leased, else a new one keyed ``fresh``. Rows whose id is in
    ``passed`` (already marked invalid by the caller) are skipped."""
    finished, taken = pool.finished, pool.taken
    if plan is not None:
        targets = list(plan)[:limit]
        return Choice(next(((k, p) for k, p in targets if k not in taken), None),
                      done=all(k in finished for k, _ in targets))
    if len(finished) + len(pool.active) >= limit:
        return Choice(done=len(finished) >= limit)
    unreadable: list[Unreadable] = []
    for lease in pool.released:
        if lease.id in passed:
            continue
        if isinstance(lease, Unreadable):
            unreadable.append(lease)
            continue
        if lease.key in taken or lease.key.startswith("new:") or \
                lease.outcome == LeaseOutcome.RESULT:
            continue
        return Choice((lease.key, dict(lease.params)), requeued=lease,
                      unreadable=tuple(unreadable))
    seen = taken | set(pool.ever)
    never = next(((k, p) for k, p in first if k not in seen), None)
    return Choice(never or (fresh, {}), unreadable=tuple(unreadable))


class LeaseStore(Database):
    """The store's leases and slots (:class:`~cleanslate.store.Store` is one)."""

    @contextlib.contextmanager
    def _study_lock(self, study: str) -> Iterator[Connection]:
        """A transaction that holds the study's claim lock until it commits: ``BEGIN
        IMMEDIATE`` on SQLite (one writer at a time), a transaction-scoped advisory lock on the
        study's name on PostgreSQL (claimers of one study wait for each other; other studies
        and every other write go on)."""
        with self.engine.connect() as conn:
            if self.engine.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
                             {"name": f"cleanslate:{study}"})
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def _lease_values(self, lease: LeaseRecord) -> LeaseColumns:
        return {"study": lease.study, "key": lease.key, "state": lease.state.value,
                "worker": lease.worker, "host": lease.host, "slot": lease.slot,
                "trial": lease.trial, "run_id": lease.run_id, "acquired_at": lease.acquired_at,
                "heartbeat_at": lease.heartbeat_at, "expires_at": lease.expires_at,
                "data": self.redacted(lease.to_document())}

    @_guarded("claiming a trial")
    def claim_lease(
        self,
        template: LeaseRecord,
        *,
        timeout_s: float,
        plan: Sequence[Configuration] | None,
        first: Sequence[Configuration] = (),
        limit: int,
        gone: Callable[[LeaseRecord], bool] | None = None,
        valid: Callable[[LeaseRecord], str | None] | None = None,
    ) -> Claim:
        """Claim the next configuration of ``template.study`` for ``template``'s worker and
        slot, atomically across processes (:meth:`_study_lock`).

        On the way, every active lease whose heartbeat is older than its timeout (or whose
        worker ``gone`` says is dead) is marked ``expired``: its configuration is free again.
        With a ``plan`` (grid, ablation: ``(key, params)`` in order), the first of its first
        ``limit`` configurations that has no result and no active lease is claimed. Without
        one (samplers), while results plus active leases are fewer than ``limit``: a
        configuration whose lease expired or was given back without a result, else one of
        ``first`` never claimed (the baseline), else a new one (``params`` empty, ``key``
        ``new:...``: the caller asks the sampler and :meth:`bind_lease`). The lease expires
        ``timeout_s`` after its last heartbeat. The choice is :func:`choose_next`'s.

        A row that is not a lease (:func:`~cleanslate.store._leases.parse_lease`), and a
        re-queued configuration that ``valid`` names a problem with (the caller's check against
        the study's space), is marked ``invalid`` and skipped (``Claim.invalid``): one garbled
        or hostile row stops no worker.
        """
        now = time.time()
        invalid: list[InvalidLease] = []
        study = template.study
        with self._study_lock(study) as conn:
            expired, active = self._expire(conn, study, now, gone, invalid)
            pool = self._pool(conn, study, active, sampled=plan is None)
            passed: set[int] = set()
            fresh = f"new:{secrets.token_hex(8)}"
            while True:
                choice = choose_next(pool, plan=plan, first=first, limit=limit, fresh=fresh,
                                     passed=passed)
                for row in choice.unreadable:
                    self._invalidate(conn, row.id, None, row.reason, invalid)
                    passed.add(row.id)
                requeued = choice.requeued
                problem = valid(requeued) if requeued is not None and valid is not None \
                    else None
                if requeued is None or requeued.id is None or problem is None:
                    break
                self._invalidate(conn, requeued.id, requeued, problem, invalid)
                passed.add(requeued.id)
            finished = len(pool.finished)
            if choice.configuration is None:
                return Claim(lease=None, expired=expired, invalid=invalid, done=choice.done,
                             finished=finished, active=len(active))
            key, params = choice.configuration
            lease = self._insert_active(conn, template.model_copy(update={
                "key": key, "params": params, "state": LeaseState.ACTIVE,
                "acquired_at": now, "heartbeat_at": now, "expires_at": now + timeout_s}))
        return Claim(lease=lease, expired=expired, invalid=invalid, done=False,
                     finished=finished, active=len(active) + 1)

    def _pool(self, conn: Connection, study: str, active: dict[str, LeaseRecord], *,
              sampled: bool) -> Pool:
        """What a claim of ``study`` chooses from (:class:`Pool`), read after expiring; the
        re-queue candidates and the keys ever leased only for a study without a plan
        (``sampled``), which alone uses them."""
        finished = [config_key(data.get("params") or {}) for data in conn.scalars(
            select(TrialRow.data).where(TrialRow.study == study,
                                        TrialRow.status.in_(_FINISHED)))]
        counted = set(conn.scalars(select(LeaseRow.key).where(
            LeaseRow.study == study, LeaseRow.state == LeaseState.RELEASED,
            LeaseRow.data["outcome"].as_string() == LeaseOutcome.RESULT.value)))
        if not sampled:
            return Pool(finished=finished, active=active.keys(), counted=counted)
        released = [Unreadable(row_id, lease) if isinstance(lease, str) else lease
                    for row_id, _state, lease in self._lease_rows(
                        conn, study, LeaseState.EXPIRED, LeaseState.RELEASED)]
        ever = set(conn.scalars(select(LeaseRow.key).where(LeaseRow.study == study)))
        return Pool(finished=finished, active=active.keys(), counted=counted,
                    released=released, ever=ever)

    def _insert_active(self, conn: Connection, lease: LeaseRecord) -> LeaseRecord:
        """Write a claimed lease as a new ``active`` row; returns it with the row's id."""
        row_id = conn.execute(insert(LeaseRow).values(
            **self._lease_values(lease)).returning(LeaseRow.id)).scalar_one()
        lease = lease.model_copy(update={"id": row_id})
        conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
            data=self.redacted(lease.to_document())))
        return lease

    @staticmethod
    def _raw_lease_rows(conn: Connection, study: str, *states: LeaseState
                        ) -> Iterator[tuple[int, str, Any]]:
        """``(id, state, document as text)`` of the study's rows in ``states`` (every state but
        ``invalid`` when none is given), oldest first: the document is read as text and parsed
        by the caller, so that one row that is not JSON fails only itself."""
        query = select(LeaseRow.id, LeaseRow.state, cast(LeaseRow.data, Text)).where(
            LeaseRow.study == study)
        query = query.where(LeaseRow.state.in_([s.value for s in states])) if states else \
            query.where(LeaseRow.state != LeaseState.INVALID.value)
        for row in conn.execute(query.order_by(LeaseRow.id)):
            yield row[0], row[1], row[2]

    def _lease_rows(self, conn: Connection, study: str, *states: LeaseState
                    ) -> Iterator[tuple[int, str, LeaseRecord | str]]:
        """``(id, state, lease or why it is none)`` (:meth:`_raw_lease_rows`,
        :func:`parse_lease`)."""
        for row_id, state, raw in self._raw_lease_rows(conn, study, *states):
            yield row_id, state, parse_lease(row_id, raw)

    def _invalidate(self, conn: Connection, row_id: int, lease: LeaseRecord | None, why: str,
                    invalid: list[InvalidLease] | None) -> None:
        """Mark the row ``invalid`` with why (in its document too when it holds a lease)."""
        if lease is None:
            conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
                state=LeaseState.INVALID.value))
        else:
            conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
                **self._lease_values(lease.model_copy(update={
                    "state": LeaseState.INVALID, "detail": why,
                    "released_at": lease.released_at or time.time()}))))
        if invalid is not None:
            invalid.append(InvalidLease(row_id, why))

    def _expire(self, conn: Connection, study: str, now: float,
                gone: Callable[[LeaseRecord], bool] | None,
                invalid: list[InvalidLease] | None = None,
                ) -> tuple[list[LeaseRecord], dict[str, LeaseRecord]]:
        """Inside the study's lock: mark ``invalid`` every row of the study that is not a lease
        (:meth:`_lease_rows`), and ``expired`` every active lease whose heartbeat is older than
        its timeout or whose worker is ``gone``; returns those, and the active leases left by
        key."""
        expired: list[LeaseRecord] = []
        active: dict[str, LeaseRecord] = {}
        for row_id, state, raw in self._raw_lease_rows(conn, study):
            # Every row's JSON is read (a row that is not JSON would fail the claim's queries
            # into the documents); an active one's lease too (the others' when re-queued).
            lease = parse_lease(row_id, raw) if state == LeaseState.ACTIVE else \
                lease_document(raw)
            if isinstance(lease, str):
                self._invalidate(conn, row_id, None, lease, invalid)
                continue
            if not isinstance(lease, LeaseRecord):
                continue
            if lease.expires_at < now or (gone is not None and gone(lease)):
                why = ("no heartbeat since " + time.strftime(
                    "%H:%M:%S", time.gmtime(lease.heartbeat_at)) + " UTC") \
                    if lease.expires_at < now else "its worker is not running any more"
                lease = lease.model_copy(update={
                    "state": LeaseState.EXPIRED, "detail": why, "released_at": now})
                conn.execute(update(LeaseRow).where(LeaseRow.id == lease.id).values(
                    **self._lease_values(lease)))
                expired.append(lease)
            else:
                active[lease.key] = lease
        return expired, active

    @_guarded("expiring leases")
    def expire_leases(self, study: str,
                      gone: Callable[[LeaseRecord], bool] | None = None) -> list[LeaseRecord]:
        """Expire the study's stale leases (see :meth:`claim_lease`) and return them: each is
        returned to exactly one caller, which re-queues its trial and tears its run down."""
        if not inspect(self.engine).has_table(LeaseRow.__tablename__):
            return []
        with self._study_lock(study) as conn:
            return self._expire(conn, study, time.time(), gone)[0]

    def compare_and_set(self, lease: LeaseRecord, values: LeaseChange, *,
                        expected: LeaseState = LeaseState.ACTIVE) -> bool:
        """Update ``lease`` with ``values`` only while its row is still in the ``expected``
        state and its worker's; whether it was (Optuna's ``set_trial_state_values``)."""
        updated = lease.model_copy(update=values)
        with Session(self.engine) as session, session.begin():
            result = session.execute(update(LeaseRow).where(
                LeaseRow.id == lease.id, LeaseRow.state == expected.value,
                LeaseRow.worker == lease.worker).values(**self._lease_values(updated)))
            return bool(getattr(result, "rowcount", 0) == 1)

    @_guarded("renewing a lease")
    def heartbeat(self, lease: LeaseRecord, timeout_s: float) -> bool:
        """Renew an active lease of this worker for ``timeout_s`` more seconds; ``False`` when
        it is not active any more (it expired: the trial is another worker's now)."""
        now = time.time()
        return self.compare_and_set(lease, {"heartbeat_at": now, "expires_at": now + timeout_s})

    @_guarded("binding a lease")
    def bind_lease(self, lease: LeaseRecord, /, **values: Unpack[LeaseChange]) -> LeaseRecord:
        """Set fields of this worker's active lease (``trial``, ``key`` and ``params`` once a
        sampler's trial is asked, ``run_id``); raises ``ValueError`` when it is not active."""
        if not self.compare_and_set(lease, values):
            raise ValueError(f"lease {lease.id} is not active any more")
        return lease.model_copy(update=values)

    @_guarded("releasing a lease")
    def release_lease(self, lease: LeaseRecord, outcome: LeaseOutcome,
                      detail: str | None = None) -> bool:
        """Give a lease back with its trial's ``outcome``; ``False`` when it had expired
        before (another worker may be running its configuration)."""
        return self.compare_and_set(lease, {"state": LeaseState.RELEASED, "outcome": outcome,
                                           "detail": detail, "released_at": time.time()})

    @_guarded("re-queueing results")
    def requeue_results(self, study: str, keys: Sequence[str], detail: str) -> int:
        """Turn the released leases of ``study`` with outcome ``result`` and a key in ``keys``
        into ``requeued`` ones (with ``detail``): their configurations are claimed again, as if
        their trials had never given a result (a failure found afterwards not to be the
        configuration's: :mod:`cleanslate.tune._systemic`). Returns how many were changed."""
        wanted = set(keys)
        changed = 0
        with self._study_lock(study) as conn:
            for row_id, _state, lease in self._lease_rows(conn, study, LeaseState.RELEASED):
                if isinstance(lease, str) or lease.key not in wanted or \
                        lease.outcome != LeaseOutcome.RESULT:
                    continue
                conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
                    **self._lease_values(lease.model_copy(update={
                        "outcome": LeaseOutcome.REQUEUED, "detail": detail}))))
                changed += 1
        return changed

    @_guarded("reading leases")
    def leases(self, study: str, *, state: LeaseState | None = None) -> list[LeaseRecord]:
        """A study's leases in the order they were granted; only those in ``state`` when
        given."""
        if self._empty or not inspect(self.engine).has_table(LeaseRow.__tablename__):
            return []
        # Rows that hold no lease are left out, and those marked invalid unless asked for
        # (they are no slot's work).
        with self.engine.connect() as conn:
            states = [s for s in LeaseState if s != LeaseState.INVALID] if state is None \
                else [LeaseState(state)]
            return [lease for _id, _state, lease in self._lease_rows(conn, study, *states)
                    if not isinstance(lease, str)]

    @_guarded("saving a slot")
    def save_slot(self, slot: SlotRecord) -> None:
        """Insert or replace the state of a study's slot (redacted)."""
        with Session(self.engine) as session, session.begin():
            row = session.get(SlotRow, (slot.study, slot.slot))
            data = self.redacted(slot.to_document())
            if row is None:
                session.add(SlotRow(study=slot.study, slot=slot.slot, state=slot.state.value,
                                    data=data, updated_at=slot.updated_at))
            else:
                row.state, row.data, row.updated_at = slot.state.value, data, slot.updated_at

    @_guarded("reading slots")
    def slots(self, study: str) -> list[SlotRecord]:
        """The recorded states of a study's slots (suspect, quarantined, or back to ok)."""
        if self._empty or not inspect(self.engine).has_table(SlotRow.__tablename__):
            return []
        with Session(self.engine) as session:
            rows = session.scalars(select(SlotRow).where(SlotRow.study == study).order_by(
                SlotRow.slot))
            return [SlotRecord.from_document(self.redacted(r.data)) for r in rows]


__all__ = ["Choice", "Configuration", "LeaseStore", "Pool", "Unreadable", "choose_next"]
