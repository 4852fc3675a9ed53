"""Leases and slots as the store keeps them: who runs which trial where, and which slots are
out of service.

Optuna's trial heartbeat works only with ``study.optimize()``, not with ask/tell, so ownership of
a trial is cleanslate's own: a :class:`LeaseRecord` per claimed configuration (``cs_leases``).
A lease is ``active`` while its worker renews it (:attr:`LeaseRecord.heartbeat_at`); a lease
whose heartbeat is older than the study's ``lease_timeout_s`` is ``expired`` by whoever claims
next, and its configuration goes back to the queue; a lease whose trial ended is ``released``
(``outcome``: ``result`` when the trial produced one, ``requeued`` when it did not). A row
that is not a lease (its JSON unreadable or not a valid record) or whose configuration is not
one of the study's (:meth:`~cleanslate.store.Store.claim_lease`'s ``valid``) is marked
``invalid`` when a claim meets it, and skipped from then on.
:class:`SlotRecord` (``cs_slots``) says that a slot is ``suspect`` (a run of an expired lease
could not be torn down there) or ``quarantined`` (it stayed dirty), with the evidence.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypedDict

from pydantic import Field, ValidationError

from cleanslate.store._records import Record
from cleanslate.verdict.findings import Finding


def config_key(params: Mapping[str, Any]) -> str:
    """A configuration's identity: the SHA-256 of its parameters as canonical JSON (the same
    parameters in any order give the same key)."""
    text = json.dumps(dict(params), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class LeaseState(StrEnum):
    """``active`` (its worker holds it and renews it), ``released`` (its trial ended: see
    ``outcome``), ``expired`` (no heartbeat within the timeout: its worker is gone) or
    ``invalid`` (the row is not a lease of the study: garbled, or written by someone else;
    skipped, see ``detail``)."""

    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    INVALID = "invalid"


class LeaseOutcome(StrEnum):
    """How a released lease's trial ended: ``result`` (feasible or infeasible: counted),
    ``requeued`` (no result: the configuration goes back to the queue), ``lost`` (the lease
    had expired before the trial ended: another worker runs it; this run does not count)."""

    RESULT = "result"
    REQUEUED = "requeued"
    LOST = "lost"


class LeaseRecord(Record):
    """One claim of a configuration by a worker on a slot. Times are epoch seconds.

    ``key`` is :func:`config_key` of ``params`` (``new:...`` until a sampler's trial is
    asked); ``trial`` the Optuna trial number once it exists; ``run_id`` the run the trial
    launches (chosen before the launch, so that the other slots of the host know its marker
    from the start). ``slot`` is the slot's key (``host/gpus=0,1/port=30000``).
    """

    id: int | None = None
    study: str
    key: str
    params: dict[str, Any] = Field(default_factory=dict)
    trial: int | None = None
    worker: str
    host: str
    gpus: tuple[int, ...] | None = None
    port: int
    slot: str
    run_id: str | None = None
    state: LeaseState = LeaseState.ACTIVE
    outcome: LeaseOutcome | None = None
    detail: str | None = None
    acquired_at: float = Field(default_factory=time.time)
    heartbeat_at: float = Field(default_factory=time.time)
    expires_at: float = 0.0
    released_at: float | None = None


class LeaseChange(TypedDict, total=False):
    """Fields of a lease that change after its claim, by compare and set
    (:meth:`~cleanslate.store.Store.compare_and_set`): its binding to a sampler's trial and
    run, its heartbeat, and how it was given back."""

    trial: int | None
    key: str
    params: Mapping[str, Any]
    run_id: str | None
    heartbeat_at: float
    expires_at: float
    state: LeaseState
    outcome: LeaseOutcome | None
    detail: str | None
    released_at: float | None


class LeaseColumns(TypedDict):
    """A lease as its ``cs_leases`` row's columns: the fields a claim queries, and the whole
    record (redacted) as ``data``."""

    study: str
    key: str
    state: str
    worker: str
    host: str
    slot: str
    trial: int | None
    run_id: str | None
    acquired_at: float
    heartbeat_at: float
    expires_at: float
    data: Mapping[str, Any]


class SlotState(StrEnum):
    """``ok``, ``suspect`` (a run of an expired lease could not be torn down there: no new
    trial until the slot verifies clean) or ``quarantined`` (still dirty after cleaning)."""

    OK = "ok"
    SUSPECT = "suspect"
    QUARANTINED = "quarantined"


class SlotRecord(Record):
    """A slot of a study whose state is not plain ``ok``, or was not: why, and the evidence
    (the error and unknown findings of the check that decided it)."""

    study: str
    slot: str
    host: str
    gpus: tuple[int, ...] | None = None
    port: int
    state: SlotState
    reason: str | None = None
    findings: tuple[Finding, ...] = ()
    updated_at: float = Field(default_factory=time.time)


#: The largest lease document read (a lease is a few hundred bytes; its parameters are the
#: study's flags).
MAX_LEASE_CHARS = 1 << 20


def _short(text: str, limit: int = 160) -> str:
    text = text.replace("\n", " ").replace("\r", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def lease_document(raw: Any) -> dict[str, Any] | str:
    """A row's document (``raw``: its JSON text) as a mapping, or why it is none: not text,
    larger than :data:`MAX_LEASE_CHARS`, not JSON, or not an object."""
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).decode("utf-8", errors="replace")
    if not isinstance(raw, str):
        return "its document is not JSON text"
    if len(raw) > MAX_LEASE_CHARS:
        return f"its document is {len(raw):,} characters (at most {MAX_LEASE_CHARS:,})"
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return _short(f"its document is not JSON: {exc}")
    if not isinstance(data, dict):
        return f"its document is a JSON {type(data).__name__}, not an object"
    return data


def parse_lease(row_id: int, raw: Any) -> LeaseRecord | str:
    """The lease a row's document holds (``raw``: its JSON text), or why it holds none: not a
    document (:func:`lease_document`), or not a valid :class:`LeaseRecord` (a key missing, a
    wrong type). A document of a newer schema raises
    :class:`~cleanslate.store._records.NewerSchemaError`, as every record does."""
    data = lease_document(raw)
    if isinstance(data, str):
        return data
    try:
        return LeaseRecord.from_document({**data, "id": row_id})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the record"
        return _short(f"not a lease: {where}: {first.get('msg', 'invalid')}")


@dataclass(frozen=True)
class InvalidLease:
    """A row a claim marked ``invalid``: its id and why."""

    id: int
    reason: str


@dataclass
class Claim:
    """What :meth:`~cleanslate.store.Store.claim_lease` did: the lease it granted (``None``:
    nothing to hand out now), the leases it expired on the way, whether the study's plan or
    budget is done (every target has a result), how many results and active leases the
    study has, and the rows it marked ``invalid`` on the way."""

    lease: LeaseRecord | None
    expired: list[LeaseRecord] = field(default_factory=list)
    invalid: list[InvalidLease] = field(default_factory=list)
    done: bool = False
    finished: int = 0
    active: int = 0


__all__ = ["MAX_LEASE_CHARS", "Claim", "InvalidLease", "LeaseChange", "LeaseColumns",
           "LeaseOutcome", "LeaseRecord", "LeaseState", "SlotRecord", "SlotState", "config_key",
           "lease_document", "parse_lease"]
