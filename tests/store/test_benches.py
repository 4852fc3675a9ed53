"""Benches in the store (``cs_benches``, issue 38 item 4): saved and read back equal, newest
first, by run; no secret of the URL or the result kept; schema 6 refused by a reader of 5,
and a store of schema 5 (no benches table) read by this one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from cleanslate.errors import InputError
from cleanslate.store import (
    SCHEMA_VERSION,
    BenchRecord,
    Store,
    _records,
    bench_url,
    new_bench_id,
)
from cleanslate.store._tables import RunRow
from tests.store.documents import level


def result(*levels: dict[str, Any], url: str = "http://127.0.0.1:8000") -> dict[str, Any]:
    """A ``bench --json`` document (the keys the record reads, and a secret in its URL)."""
    return {"tool": "cleanslate bench", "url": url, "model": "m", "partial": False,
            "levels": [copy.deepcopy(lv) for lv in levels]}


def bench(bench_id: str, *, run_id: str | None = None, created_at: float = 1.0,
          **values: Any) -> BenchRecord:
    return BenchRecord(id=bench_id, run_id=run_id, created_at=created_at,
                       url="http://127.0.0.1:8000", model="m", engine="sim",
                       options={"loads": [{"kind": "closed", "concurrency": 8}]},
                       result=result(level("c=1", output_throughput=120.5),
                                     level("c=8", output_throughput=610.25)), **values)


def test_a_bench_comes_back_equal_newest_first_and_by_run(store: Store) -> None:
    first = bench("b-1", run_id="r-a", created_at=100.0)
    second = bench("b-2", created_at=200.0)
    third = bench("b-3", run_id="r-a", created_at=300.0)
    for record in (first, second, third):
        store.save_bench(record)
    assert store.bench("b-1") == first
    assert store.bench("b-nope") is None
    assert [b.id for b in store.benches()] == ["b-3", "b-2", "b-1"]
    assert [b.id for b in store.benches(run_id="r-a")] == ["b-3", "b-1"]
    assert [b.id for b in store.benches(limit=1)] == ["b-3"]
    assert store.bench_ids() == ["b-3", "b-2", "b-1"]
    got = store.bench("b-2")
    assert got is not None and got.labels() == ["c=1", "c=8"]
    assert got.best_output_throughput() == 610.25 and not got.failed()


def test_no_secret_of_the_url_or_the_result_is_kept(store: Store) -> None:
    token = "sk-" + "q7Vd9xL2mP4rT8wZ3nB6"
    url = f"http://user:{token}@127.0.0.1:8000/v1?api_key={token}"
    assert bench_url(url) == "http://127.0.0.1:8000/v1"
    record = bench("b-s").model_copy(update={
        "url": bench_url(url), "result": {**result(level()), "url": url,
                                          "headers": {"Authorization": f"Bearer {token}"}}})
    store.save_bench(record)
    with store.engine.connect() as conn:
        raw = conn.exec_driver_sql("SELECT data FROM cs_benches").scalar_one()
    assert token not in str(raw)
    got = store.bench("b-s")
    assert got is not None and token not in got.model_dump_json()


def test_bench_ids_are_short_and_distinct() -> None:
    ids = {new_bench_id() for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("b-") and len(i) == 22 for i in ids)


def test_a_bench_is_written_with_the_schema_version_and_refused_by_a_reader_of_5(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'cs.db'}"
    store = Store(url)
    store.save_bench(bench("b-new"))
    with store.engine.connect() as conn:
        raw = conn.exec_driver_sql("SELECT data FROM cs_benches").scalar_one()
    assert SCHEMA_VERSION >= 6
    assert f'"schema_version": {SCHEMA_VERSION}' in str(raw).replace("\n", "")
    store.close()
    monkeypatch.setattr(_records, "SCHEMA_VERSION", 5)
    older = Store(url, create=False)
    with pytest.raises(InputError, match=f"schema version {SCHEMA_VERSION}") as info:
        older.bench("b-new")
    assert "newer cleanslate" in (info.value.hint or "")
    older.close()


def test_a_store_of_schema_5_without_benches_is_read(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    path.touch(mode=0o600)
    engine = create_engine(f"sqlite:///{path}")
    RunRow.metadata.tables["cs_runs"].create(engine)  # a store from before benches
    engine.dispose()
    reader = Store(f"sqlite:///{path}", create=False)
    assert reader.benches() == [] and reader.bench("b-x") is None and reader.bench_ids() == []
    reader.close()
    writer = Store(f"sqlite:///{path}")  # a command that writes adds the table
    writer.save_bench(bench("b-1"))
    assert [b.id for b in writer.benches()] == ["b-1"]
    writer.close()
