"""A lease row that is garbled or hostile (written with plain SQL, as a malicious or broken
store writer would: its JSON unreadable, not a lease, or a configuration outside the study's
space) is marked ``invalid`` when a worker's claim meets it, said as a warning, and skipped:
the worker gets the next configuration and goes on, and no later claim trips on it again."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.report._data import slot_summaries
from cleanslate.store import Store
from cleanslate.store._leases import LeaseOutcome, LeaseRecord, LeaseState, config_key
from cleanslate.tune.controller import open_optuna, register_study
from cleanslate.tune.fleet import Fleet
from cleanslate.tune.study import StudySpec
from cleanslate.tune.view import TuneView

SAMPLED = {"name": "h", "engine": "sim", "model": "sim", "strategy": "tpe",
           "space": {"mrr": [16, 32], "chunk": {"int": [1, 8]}, "frac": {"float": [0.5, 0.9]},
                     "mode": ["a", None]},
           "concurrency": [2], "budget": {"trials": 5}}
GRID = {**SAMPLED, "name": "g", "strategy": "grid", "space": {"mrr": [16, 32]}}

GOOD = {"mrr": 16, "chunk": 4, "frac": 0.7, "mode": None}


def _doc(params: Any, **fields: Any) -> dict[str, Any]:
    key = config_key(params) if isinstance(params, dict) else "k"
    return {"study": "h", "key": key, "params": params, "worker": "w", "host": "local",
            "port": 30000, "slot": "local/gpus=all/port=30000", "state": "expired",
            "schema_version": 2, **fields}


#: (what the row is, its document as stored text)
HOSTILE: list[tuple[str, str]] = [
    ("unknown flag", json.dumps(_doc({**GOOD, "nope": 1}))),
    ("a string for an int", json.dumps(_doc({**GOOD, "mrr": "16"}))),
    ("a bool for an int", json.dumps(_doc({**GOOD, "chunk": True}))),
    ("outside an int range", json.dumps(_doc({**GOOD, "chunk": 9}))),
    ("a huge int", json.dumps(_doc({**GOOD, "chunk": 2 ** 80}))),
    ("NaN for a float", json.dumps(_doc({**GOOD, "frac": float("nan")}))),
    ("outside a float range", json.dumps(_doc({**GOOD, "frac": 1e308}))),
    ("a huge string", json.dumps(_doc({**GOOD, "mode": "x" * 500_000}))),
    ("a nested value", json.dumps(_doc({**GOOD, "mode": {"$(id)": [1]}}))),
    ("no parameters", json.dumps(_doc({}))),
    ("a key not its parameters'", json.dumps({**_doc(GOOD), "key": config_key({"mrr": 32})})),
    ("params not a mapping", json.dumps(_doc([1, 2]))),
    ("a missing key", json.dumps({k: v for k, v in _doc(GOOD).items() if k != "worker"})),
    ("a wrong type", json.dumps(_doc(GOOD, port="x"))),
    ("a JSON list", "[1, 2]"),
    ("a JSON string", '"lease"'),
    ("not JSON", "{not json"),
    ("deeply nested", "[" * 100_000 + "]" * 100_000),
    ("too large", json.dumps(_doc(GOOD, detail="d" * (2 << 20)))),
    ("JSON null", "null"),
]


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with both studies registered (Optuna's tables take a second to create: once)."""
    path = tmp_path_factory.mktemp("registered") / "s.db"
    store = Store(f"sqlite:///{path}")
    try:
        for raw in (SAMPLED, GRID):
            register_study(store, StudySpec.model_validate(raw))
    finally:
        store.close()
    return path


@pytest.fixture
def db(tmp_path: Path, registered: Path) -> Iterator[Path]:
    path = tmp_path / "s.db"
    shutil.copy2(registered, path)
    yield path


def _fleet(store: Store, raw: dict[str, Any]) -> Fleet:
    spec = StudySpec.model_validate(raw)
    return Fleet(store=store, spec=spec, study=open_optuna(store, spec), view=TuneView(),
                 stop=asyncio.Event())


def _plant(db: Path, study: str, text: str, state: str = "expired",
           key: str = "k") -> int:
    """A row written with plain SQL, as a store writer other than cleanslate would."""
    with sqlite3.connect(db) as conn:
        cursor = conn.execute(
            "insert into cs_leases (study, key, state, worker, host, slot, trial, run_id, "
            "acquired_at, heartbeat_at, expires_at, data) values (?, ?, ?, 'w', 'local', 's', "
            "null, null, 0, 0, 0, ?)", (study, key, state, text))
        assert cursor.lastrowid is not None
        return cursor.lastrowid


def _state(db: Path, row: int) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("select state from cs_leases where id = ?", (row,)).fetchone()[0])


def _template(fleet: Fleet) -> LeaseRecord:
    return LeaseRecord(study=fleet.spec.name, key="", worker=fleet.worker, host="local",
                       port=30000, slot="local/gpus=all/port=30000")


@pytest.mark.parametrize(("what", "text"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_requeued_row_is_marked_invalid_and_the_worker_goes_on(
        db: Path, what: str, text: str) -> None:
    store = Store(f"sqlite:///{db}")
    try:
        fleet = _fleet(store, SAMPLED)
        row = _plant(db, "h", text)
        said: list[str] = []
        claim = fleet.claim(_template(fleet), said.append)
        assert claim.lease is not None and claim.lease.key.startswith("new:")  # a fresh one
        assert [bad.id for bad in claim.invalid] == [row], what
        assert _state(db, row) == LeaseState.INVALID
        assert len(said) == 1 and said[0].startswith(f"warning: lease row {row} in the store")
        assert len(said[0]) < 400  # a huge value is not repeated
        _trial, bound = fleet._trial_for(claim.lease)  # the sampler's configuration runs
        assert bound is not None and set(bound.params) == set(SAMPLED["space"])
        again = fleet.claim(_template(fleet), said.append)
        assert again.invalid == [] and again.lease is not None and len(said) == 1
        # every reader of the study's leases still works; the invalid row is no slot's work
        assert [lease.id for lease in store.leases("h")] == [claim.lease.id, again.lease.id]
        if not what.startswith(("a missing", "a wrong", "a JSON", "JSON", "not JSON", "deeply",
                                "too large", "params not")):  # a lease, marked invalid
            assert [lease.id for lease in store.leases("h", state=LeaseState.INVALID)] == [row]
        assert [s.slot for s in slot_summaries(store, "h")] == [claim.lease.slot]
    finally:
        store.close()


def test_a_garbled_active_row_does_not_stop_a_planned_study(db: Path) -> None:
    store = Store(f"sqlite:///{db}")
    try:
        fleet = _fleet(store, GRID)
        rows = [_plant(db, "g", text, state=state) for text, state in
                (("{not json", "active"), ("[1]", "released"), ('{"key": 1}', "expired"),
                 ("{not json either", "released"))]
        said: list[str] = []
        claim = fleet.claim(_template(fleet), said.append)
        assert claim.lease is not None and claim.lease.params == {"mrr": 16}
        # A JSON object that is no lease is not read by a planned study's claim: left as it is
        assert sorted(bad.id for bad in claim.invalid) == [rows[0], rows[1], rows[3]]
        assert [_state(db, r) for r in rows] == ["invalid", "invalid", "expired", "invalid"]
        assert len(said) == 3
        assert store.leases("g", state=LeaseState.ACTIVE) == [claim.lease]
    finally:
        store.close()


def test_a_genuine_requeued_lease_still_runs_its_configuration(db: Path) -> None:
    store = Store(f"sqlite:///{db}")
    try:
        fleet = _fleet(store, SAMPLED)
        said: list[str] = []
        first = fleet.claim(_template(fleet), said.append).lease
        assert first is not None
        _trial, bound = fleet._trial_for(first)
        assert bound is not None
        store.release_lease(bound, LeaseOutcome.REQUEUED, "the slot is quarantined")
        time.sleep(0.01)
        again = fleet.claim(_template(fleet), said.append)
        assert again.invalid == [] and said == []
        assert again.lease is not None and again.lease.params == bound.params
        assert again.lease.key == bound.key
    finally:
        store.close()


@pytest.mark.slow  # a PostgreSQL database and Optuna's tables in it: 2-4 s on the 2-core machine
def test_hostile_rows_in_postgresql_are_skipped_too(postgres_url: str) -> None:
    import uuid

    import psycopg

    name = f"cs_leases_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url.rsplit("/", 1)[0] + "/" + name
    try:
        store = Store(url)
        try:
            register_study(store, StudySpec.model_validate(SAMPLED))
            fleet = _fleet(store, SAMPLED)
            rows = []
            with psycopg.connect(url, autocommit=True) as conn:
                for text in ("[1, 2]", json.dumps(_doc({**GOOD, "mrr": 17})), '"x"'):
                    rows.append(conn.execute(
                        "insert into cs_leases (study, key, state, worker, host, slot, "
                        "acquired_at, heartbeat_at, expires_at, data) values ('h', 'k', "
                        "'expired', 'w', 'local', 's', 0, 0, 0, %s::json) returning id",
                        (text,)).fetchone()[0])  # type: ignore[index]
            said: list[str] = []
            claim = fleet.claim(_template(fleet), said.append)
            assert claim.lease is not None and claim.lease.key.startswith("new:")
            assert sorted(bad.id for bad in claim.invalid) == sorted(rows) and len(said) == 3
            assert [lease.id for lease in store.leases("h")] == [claim.lease.id]
        finally:
            store.close()
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
