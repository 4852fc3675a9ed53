"""Leases and slots (``cs_leases``, ``cs_slots``) on every database the store supports.

Claims are atomic across processes (several processes claim from one store at once and no
configuration is handed out twice), a lease without a heartbeat expires and its configuration
goes back to the queue while the expired lease stays visible, a lease is renewed and given back
only by its own worker while it is active, and a slot's quarantine keeps its evidence.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from cleanslate.store import (
    SCHEMA_VERSION,
    LeaseOutcome,
    LeaseRecord,
    LeaseState,
    SlotRecord,
    SlotState,
    Store,
    config_key,
)
from cleanslate.store._tables import LeaseRow, SlotRow
from tests.store.documents import finding


def template(worker: str = "w-1", slot: str = "local/gpus=0/port=30000") -> LeaseRecord:
    return LeaseRecord(study="s", key="", worker=worker, host="local", gpus=(0,), port=30000,
                       slot=slot)


def plan(n: int) -> list[tuple[str, dict[str, Any]]]:
    return [(config_key({"x": i}), {"x": i}) for i in range(n)]


def test_a_plan_is_handed_out_in_order_once(store: Store) -> None:
    configs = plan(3)
    claims = [store.claim_lease(template(), timeout_s=60, plan=configs, limit=3)
              for _ in range(4)]
    assert [c.lease.params if c.lease else None for c in claims] == [
        {"x": 0}, {"x": 1}, {"x": 2}, None]
    assert claims[-1].active == 3 and not claims[-1].done
    first = claims[0].lease
    assert first is not None and first.state == LeaseState.ACTIVE and first.id is not None
    assert first.expires_at - first.acquired_at == 60
    assert store.release_lease(first, LeaseOutcome.RESULT)
    assert store.claim_lease(template(), timeout_s=60, plan=configs, limit=3).lease is None
    assert store.leases("s")[0].state == LeaseState.RELEASED
    assert store.leases("s")[0].outcome == LeaseOutcome.RESULT


def test_an_expired_lease_is_requeued_and_stays_visible(store: Store) -> None:
    configs = plan(2)
    lost = store.claim_lease(template("w-dead"), timeout_s=0.3, plan=configs, limit=2).lease
    assert lost is not None and lost.params == {"x": 0}
    time.sleep(0.5)
    claim = store.claim_lease(template("w-2"), timeout_s=60, plan=configs, limit=2)
    assert [e.id for e in claim.expired] == [lost.id]
    assert claim.expired[0].state == LeaseState.EXPIRED
    assert "no heartbeat since" in (claim.expired[0].detail or "")
    assert claim.lease is not None and claim.lease.params == {"x": 0}  # re-queued first
    assert not store.heartbeat(lost, 60)  # the dead worker's lease is gone for good
    assert not store.release_lease(lost, LeaseOutcome.RESULT)
    with pytest.raises(ValueError, match="not active"):
        store.bind_lease(lost, trial=3)
    states = {lease.id: lease.state for lease in store.leases("s")}
    assert states == {lost.id: LeaseState.EXPIRED, claim.lease.id: LeaseState.ACTIVE}
    assert [lease.id for lease in store.leases("s", state=LeaseState.EXPIRED)] == [lost.id]


def test_a_heartbeat_keeps_a_lease_and_a_gone_worker_loses_it_at_once(store: Store) -> None:
    configs = plan(2)
    held = store.claim_lease(template("w-1"), timeout_s=0.6, plan=configs, limit=2).lease
    assert held is not None
    for _ in range(3):
        time.sleep(0.3)
        assert store.heartbeat(held, 0.6)
    other = store.claim_lease(template("w-2"), timeout_s=60, plan=configs, limit=2)
    assert other.expired == [] and other.lease is not None and other.lease.params == {"x": 1}
    gone = store.claim_lease(template("w-3"), timeout_s=60, plan=configs, limit=2,
                             gone=lambda lease: lease.worker == "w-1")
    assert [e.worker for e in gone.expired] == ["w-1"]
    assert "not running any more" in (gone.expired[0].detail or "")
    assert gone.lease is not None and gone.lease.params == {"x": 0}
    assert store.expire_leases("s", gone=lambda lease: lease.worker == "w-2")[0].worker == "w-2"


def test_samplers_claim_the_baseline_then_new_trials_within_the_budget(store: Store) -> None:
    base = (config_key({"x": 5}), {"x": 5})
    first = store.claim_lease(template(), timeout_s=0.3, plan=None, first=[base], limit=2)
    second = store.claim_lease(template(), timeout_s=60, plan=None, first=[base], limit=2)
    assert first.lease is not None and first.lease.params == {"x": 5}
    assert second.lease is not None and second.lease.key.startswith("new:")
    bound = store.bind_lease(second.lease, trial=7, key=config_key({"x": 9}), params={"x": 9})
    assert bound.trial == 7 and store.leases("s")[1].params == {"x": 9}
    full = store.claim_lease(template(), timeout_s=60, plan=None, first=[base], limit=2)
    assert full.lease is None and not full.done
    time.sleep(0.5)  # the baseline's lease expires: it is handed out again, not a new one
    again = store.claim_lease(template("w-2"), timeout_s=60, plan=None, first=[base], limit=2)
    assert again.lease is not None and again.lease.params == {"x": 5}


def test_every_lease_and_slot_row_carries_the_schema_version(store: Store) -> None:
    store.claim_lease(template(), timeout_s=60, plan=plan(1), limit=1)
    store.save_slot(SlotRecord(study="s", slot="h/gpus=0/port=1", host="h", gpus=(0,), port=1,
                               state=SlotState.QUARANTINED, reason="stayed dirty",
                               findings=(finding("sglang::scheduler holds 70000 MiB"),)))
    with Session(store.engine) as session:
        documents = [*session.scalars(select(LeaseRow.data)), *session.scalars(
            select(SlotRow.data))]
    assert [d["schema_version"] for d in documents] == [SCHEMA_VERSION, SCHEMA_VERSION]
    [slot] = store.slots("s")
    assert slot.state == SlotState.QUARANTINED and slot.reason == "stayed dirty"
    assert "sglang::scheduler" in slot.findings[0].message
    store.save_slot(slot.model_copy(update={"state": SlotState.OK, "reason": "clean again"}))
    assert [s.state for s in store.slots("s")] == [SlotState.OK]


CLAIMER = """
import json, sys, time
from cleanslate.store import LeaseOutcome, LeaseRecord, Store, config_key
url, worker, start, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
store = Store(url)
template = LeaseRecord(study="s", key="", worker=worker, host="local", port=1, slot=worker)
plan = [(config_key({"x": i}), {"x": i}) for i in range(n)]
while time.time() < start:
    time.sleep(0.005)
got = []
while True:
    claim = store.claim_lease(template, timeout_s=60, plan=plan, limit=n)
    if claim.lease is None:
        break
    got.append(claim.lease.params["x"])
    store.release_lease(claim.lease, LeaseOutcome.RESULT)
print(json.dumps(got))
"""


def test_claims_under_contention_never_hand_out_a_configuration_twice(
        store: Store, store_url: str, figure: Any) -> None:
    configs, workers = 60, 4
    start = time.time() + 3.0  # every process claims from the same moment
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, store_url, f"w-{i}", str(start),
                               str(configs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(workers)]
    outputs = [p.communicate(timeout=120) for p in procs]
    elapsed = time.time() - start
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    claimed = [x for out, _ in outputs for x in json.loads(out)]
    assert Counter(claimed) == Counter(range(configs))  # each exactly once
    assert sum(1 for out, _ in outputs if json.loads(out)) >= 2, "no contention happened"
    leases = store.leases("s")
    assert len(leases) == configs
    assert all(lease.outcome == LeaseOutcome.RESULT for lease in leases)
    figure(f"{store.engine.dialect.name}: {workers} processes claimed {configs} leases in "
           f"{elapsed:.2f} s, none twice ({[len(json.loads(o)) for o, _ in outputs]} each)")
