"""Host snapshots (``cs_hosts``) on every database the store supports: one per host and machine
of a study however many write it, one per ``serve`` run, typed and redacted both ways, and a
store written before the table existed (read as having none; a writer adds the table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session

from cleanslate.doctor.report import DoctorSeverity
from cleanslate.doctor.snapshot import HostSnapshot, SnapshotFinding
from cleanslate.errors import InputError
from cleanslate.redact import REDACTED
from cleanslate.store import SCHEMA_VERSION, HostRecord, Store
from cleanslate.store._tables import HostRow


def snapshot(host: str = "gpu-a", **changes: object) -> HostSnapshot:
    fields: dict[str, object] = {
        "host": host, "taken_at": 100.0, "elapsed_s": 0.2, "driver_present": False,
        "kernel": "6.8.0", "shm_bytes": 2**30,
        "findings": (SnapshotFinding(code="no_driver", severity=DoctorSeverity.INFO,
                                     message="no NVIDIA driver", consequence="nothing to check",
                                     evidence=("nvidia-smi: missing",)),)}
    fields.update(changes)
    return HostSnapshot.model_validate(fields)


def test_a_study_keeps_one_snapshot_per_host_and_machine(store: Store) -> None:
    first = store.save_host(HostRecord(study="s", host="gpu-a", snapshot=snapshot()))
    assert first is not None and first.id is not None
    assert store.has_host("s", "gpu-a") and not store.has_host("s", "gpu-b")
    # A second worker on the same host: nothing written, the first one stays.
    assert store.save_host(HostRecord(study="s", host="gpu-a",
                                      snapshot=snapshot(kernel="other"))) is None
    store.save_host(HostRecord(study="s", host="gpu-b", snapshot=snapshot("gpu-b")))
    store.save_host(HostRecord(study="s", host="local", machine="m1",
                               snapshot=snapshot("local")))
    store.save_host(HostRecord(study="s", host="local", machine="m2",
                               snapshot=snapshot("local")))
    store.save_host(HostRecord(study="other", host="gpu-a", snapshot=snapshot()))
    hosts = store.hosts(study="s")
    assert [(h.host, h.machine) for h in hosts] == [
        ("gpu-a", ""), ("gpu-b", ""), ("local", "m1"), ("local", "m2")]
    assert hosts[0] == first and hosts[0].snapshot.kernel == "6.8.0"
    assert hosts[0].schema_version == SCHEMA_VERSION
    assert [h.label for h in hosts] == ["gpu-a", "gpu-b", "local (m1)", "local (m2)"]


def test_serve_runs_keep_one_each(store: Store) -> None:
    for run_id in ("r-1", "r-2"):
        store.save_host(HostRecord(run_id=run_id, host="local", snapshot=snapshot("local")))
    assert [h.run_id for h in store.hosts(run_id="r-2")] == ["r-2"]
    assert len(store.hosts()) == 2 and store.hosts(study="s") == []


def test_nothing_secret_is_written(store: Store) -> None:
    secret = snapshot(kernel="6.8 HF_TOKEN=hf_hostsecret42", error=None, findings=(
        SnapshotFinding(code="x", severity=DoctorSeverity.WARNING, message="m", consequence="c",
                        evidence=("postgresql://u:pw-host-99@db/x",)),))
    store.save_host(HostRecord(study="s", host="gpu-a", snapshot=secret))
    with Session(store.engine) as session:
        raw = json.dumps(list(session.scalars(select(HostRow.data))))
    assert "hf_hostsecret42" not in raw and "pw-host-99" not in raw
    [back] = store.hosts(study="s")
    assert REDACTED in (back.snapshot.kernel or "")


def test_a_row_of_a_newer_snapshot_version_is_an_input_error(store: Store) -> None:
    store.save_host(HostRecord(study="s", host="gpu-a", snapshot=snapshot()))
    with Session(store.engine) as session, session.begin():
        row = session.scalars(select(HostRow)).one()
        row.data = {**row.data, "snapshot": {**row.data["snapshot"], "version": 99}}
    with pytest.raises(InputError, match="version 99"):
        store.hosts(study="s")


def test_a_store_from_before_snapshots_reads_none_and_a_writer_adds_the_table(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    Store(url).close()
    old = Store(url)
    with old.engine.begin() as conn:  # as a cleanslate without host snapshots left it
        conn.execute(text("DROP TABLE cs_hosts"))
    old.close()
    reader = Store(url, create=False)
    assert reader.hosts(study="s") == [] and not reader.has_host("s", "gpu-a")
    assert not inspect(reader.engine).has_table("cs_hosts")  # a reader writes nothing
    reader.close()
    writer = Store(url)
    assert writer.save_host(HostRecord(study="s", host="gpu-a", snapshot=snapshot()))
    assert len(writer.hosts(study="s")) == 1
    writer.close()
