"""Doctor snapshots recorded by real ``cleanslate tune`` runs on the simulated engine (this
machine has no NVIDIA driver: the snapshot says so and carries the environment): one per host
however many slots and trials the study runs there, none more when it resumes; a probe that
times out is recorded with why and the study still ends with its results; ``report`` shows the
snapshot in its table, its JSON and its page. ``serve``: ``tests/launch/test_serve_snapshot.py``;
several hosts: ``tests/fleet/test_host_snapshots.py``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cleanslate.doctor.snapshot import SNAPSHOT_TIMEOUT_ENV
from tests._kit import free_port
from tests.conftest import recorded_rows, run_cli

pytestmark = pytest.mark.slow

STUDY = """\
name: NAME
engine: sim
model: sim
port: PORT
SLOTS
fixed: {tp-size: 1, time-scale: 0.25}
space:
  max-running-requests: VALUES
strategy: grid
workload: {kind: random, input_len: 64, output_len: 8}
concurrency: [2]
requests_per_level: 4
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
"""


def _study(tmp_path: Path, name: str, slots: str, values: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(STUDY.replace("NAME", name).replace("PORT", str(free_port()))
                    .replace("SLOTS", slots).replace("VALUES", values))
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    gpus = tmp_path / "gpus"
    gpus.mkdir(exist_ok=True)
    return {"CLEANSLATE_SIM_GPU_DIR": str(gpus), **extra}


def _hosts(db: Path) -> list[dict[str, Any]]:
    return recorded_rows(db, "cs_hosts")


def test_a_study_on_two_slots_of_one_host_records_one_snapshot(tmp_path: Path,
                                                               figure: Any) -> None:
    study = _study(tmp_path, "snap", "slots: [{gpus: [0]}, {gpus: [1]}]", "[16, 32, 64]")
    db = tmp_path / "s.db"
    store = f"sqlite:///{db}"
    started = time.monotonic()
    done = run_cli("tune", str(study), "--store", store, env=_env(tmp_path), timeout=300)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    trials = [t for t in recorded_rows(db, "cs_trials") if t["status"] == "feasible"]
    assert len(trials) == 3
    [host] = _hosts(db)
    assert (host["study"], host["host"], host["run_id"]) == ("snap", "local", None)
    snap = host["snapshot"]
    assert snap["version"] == 1 and snap["error"] is None
    assert snap["driver_present"] is False and snap["gpus"] == []
    assert "no_driver" in {f["code"] for f in snap["findings"]}
    assert snap["kernel"] and snap["shm_bytes"] > 0
    assert snap["elapsed_s"] < 10
    assert "local: no NVIDIA driver" in done.stdout
    figure(f"doctor snapshot of this machine in a study: {snap['elapsed_s']:.2f} s "
           f"(the whole 3-trial study {elapsed:.1f} s)")

    again = run_cli("tune", str(study), "--store", store, env=_env(tmp_path), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(_hosts(db)) == 1  # resumed: the host has its snapshot

    shown = run_cli("report", "snap", "--store", store, env={"COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    assert "hosts of snap (doctor snapshots)" in shown.stdout
    assert "no NVIDIA driver" in shown.stdout
    exported = run_cli("report", "snap", "--store", store, "--format", "json")
    [document] = exported.json()["studies"]
    [entry] = document["hosts"]
    assert entry["label"].startswith("local") and entry["driver_present"] is False
    assert entry["summary"].startswith("no NVIDIA driver")
    page = tmp_path / "page.html"
    written = run_cli("report", "snap", "--store", store, "--html", str(page), timeout=180)
    assert written.returncode == 0, written.stderr
    html = page.read_text()
    assert '<h2 id="Hosts-snap">Hosts</h2>' in html and "no NVIDIA driver" in html


def test_a_probe_that_times_out_is_recorded_and_the_study_completes(tmp_path: Path) -> None:
    study = _study(tmp_path, "slowdoc", "gpus: [0]", "[16]")
    db = tmp_path / "s.db"
    # 10 ms: no Python starts and answers in that time, so the host script is ended.
    done = run_cli("tune", str(study), "--store", f"sqlite:///{db}",
                   env=_env(tmp_path, **{SNAPSHOT_TIMEOUT_ENV: "0.01"}), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [trial] = recorded_rows(db, "cs_trials")
    assert trial["status"] == "feasible"
    [host] = _hosts(db)
    assert "timed out" in host["snapshot"]["error"], host
    assert host["snapshot"]["findings"] == []
    assert "doctor snapshot failed" in done.stdout
    shown = run_cli("report", "slowdoc", "--store", f"sqlite:///{db}", env={"COLUMNS": "300"})
    assert "snapshot failed" in shown.stdout and "timed out" in shown.stdout
