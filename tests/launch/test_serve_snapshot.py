"""``cleanslate serve`` records one doctor snapshot of its host per run, prints it with the run
(``--json``: ``host_snapshot``), and ``stop`` takes none."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._kit import free_port
from tests.conftest import recorded_rows, run_cli

pytestmark = pytest.mark.slow


def test_a_serve_run_records_one_snapshot(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = f"sqlite:///{db}"
    (tmp_path / "gpus").mkdir()
    env = {"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}
    served = run_cli("serve", "--engine", "sim", "--model", "sim", "--port", str(free_port()),
                     "--store", store, "--detach", "--json", "--ready-timeout", "60", "--",
                     "--tp-size", "1", env=env, timeout=120)
    assert served.returncode == 0, served.stdout + served.stderr
    document = served.json()
    try:
        snap = document["host_snapshot"]
        assert snap["error"] is None and snap["driver_present"] is False
        assert "doctor_s" in document["phases"]
        [host] = recorded_rows(db, "cs_hosts")
        assert (host["run_id"], host["study"], host["host"]) == (document["run_id"], None,
                                                                 "local")
        assert host["snapshot"]["taken_at"] == snap["taken_at"]
    finally:
        stopped = run_cli("stop", document["run_id"], "--store", store, "--json",
                          "--gpu-backend", "sim", env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert len(recorded_rows(db, "cs_hosts")) == 1  # stopping takes none
