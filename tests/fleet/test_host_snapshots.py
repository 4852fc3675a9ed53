"""A study on two namespaced hosts records one doctor snapshot per host: the controller's slot on
``fleet-a`` and two ``cleanslate worker`` processes on ``fleet-b`` started at the same moment
(both may probe; the store keeps one, its partial unique index refusing the second). Each
snapshot is read over SSH on its own host; ``report`` shows both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._kit import free_ports, study_yaml
from tests.conftest import Processes, recorded_rows
from tests.fleet.conftest import Cli, MakeFleet

pytestmark = pytest.mark.slow

def test_two_hosts_record_one_snapshot_each(make_fleet: MakeFleet, procs: Processes) -> None:
    fleet = make_fleet(["fleet-a", "fleet-b"], gpus=2)
    cli = Cli(fleet, procs)
    pa, pb0, pb1 = free_ports(3)
    path: Path = fleet.root / "hosts.yaml"
    path.write_text(study_yaml(name="hosts", hosts=["fleet-a"], port=pa,
                               space={"max-running-requests": [16, 32, 64, 128]},
                               ready_timeout_s=60, smoke_timeout_s=15, lease_timeout_s=10))
    db = fleet.root / "hosts.db"
    store = f"sqlite:///{db}"
    registered = fleet.cli("tune", str(path), "--store", store, "--register", timeout=120)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    running = {"tune": cli.start("tune", "tune", str(path), "--store", store),
               "w-b0": cli.worker("w-b0", "hosts", store, "fleet-b", 0, pb0),
               "w-b1": cli.worker("w-b1", "hosts", store, "fleet-b", 1, pb1)}
    cli.wait_all(running, timeout=400)

    results = [t for t in recorded_rows(db, "cs_trials") if t["status"] == "feasible"]
    assert len(results) == 4
    hosts = recorded_rows(db, "cs_hosts")
    assert sorted(h["host"] for h in hosts) == ["fleet-a", "fleet-b"], hosts
    for host in hosts:
        snap = host["snapshot"]
        assert host["study"] == "hosts" and host["machine"] == ""
        assert snap["error"] is None and snap["host"] == host["host"]
        assert snap["driver_present"] is False  # the test hosts have no NVIDIA driver either

    shown = fleet.cli("report", "hosts", "--store", store, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    [document] = json.loads(shown.stdout)["studies"]
    assert sorted(h["label"] for h in document["hosts"]) == ["fleet-a", "fleet-b"]
