"""``cleanslate slurm submit`` on a real one-node Slurm (``tests/slurm/cluster.py``): a 9-trial
sim study run by 3 array tasks, each a ``cleanslate worker`` on the fake GPU Slurm gave it,
against one PostgreSQL store; one task cancelled mid-trial (its trial runs again elsewhere); a
decoy engine process holding memory on one GPU before the job (the task on it refuses that
slot, and the study says why); bad input refused with the store untouched."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Processes, run_cli
from tests.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.slow

STUDY = """\
name: NAME
engine: sim
model: sim
gpus: [0]
fixed: {tp-size: 1, time-scale: 0.25}
space:
  max-running-requests: [16, 32, 64]
  chunked-prefill-size: [512, 1024, 2048]
strategy: grid
workload: {kind: random, input_len: 128, output_len: 16}
concurrency: [4]
duration_s_per_level: DURATION
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
lease_timeout_s: 10
retries: 1
"""


def study_file(tmp_path: Path, name: str, duration: float = 1.0) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(STUDY.replace("NAME", name).replace("DURATION", f"{duration:g}"))
    return path


def env_for(tmp_path: Path, slurm: SlurmCluster) -> dict[str, str]:
    gpus = tmp_path / "gpus"
    gpus.mkdir(exist_ok=True)
    from cleanslate.sim.ledger import write_config

    write_config(str(gpus), gpus=slurm.gpus)
    return {**slurm.env, "CLEANSLATE_SIM_GPU_DIR": str(gpus),
            "CLEANSLATE_ARTIFACTS": str(tmp_path / "artifacts")}


def trials(store: str, study: str) -> list[dict[str, Any]]:
    from cleanslate.store import Store

    with_store = Store(store, create=False)
    try:
        return [t.model_dump(mode="json") for t in with_store.trials(study)]
    finally:
        with_store.close()


def job_of(output: str) -> str:
    for word in output.split():
        if word.isdigit():
            return word
    raise AssertionError(f"no job id in {output!r}")


def task_holding_a_lease(store: str, study: str) -> str | None:
    """``JOB_TASK`` of the array task whose worker holds an active lease of ``study`` (the
    worker's PID is in its lease; Slurm put the task's ids in its environment)."""
    from cleanslate.store import Store

    reader = Store(store, create=False)
    try:
        active = [lease for lease in reader.leases(study) if lease.state == "active"]
    finally:
        reader.close()
    for lease in active:
        pid = lease.worker.split("/")[-2]
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ids = dict(item.decode(errors="replace").split("=", 1) for item in environ
                   if b"=" in item)
        if "SLURM_ARRAY_JOB_ID" in ids:
            return f"{ids['SLURM_ARRAY_JOB_ID']}_{ids['SLURM_ARRAY_TASK_ID']}"
    return None


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def test_a_study_on_three_array_tasks_with_one_cancelled_mid_trial(
        slurm: SlurmCluster, tmp_path: Path, postgres_url: str, figure: Any) -> None:
    env = env_for(tmp_path, slurm)
    study = study_file(tmp_path, "slurm-grid", duration=2.0)
    t0 = time.monotonic()
    submitted = run_cli("slurm", "submit", str(study), "--workers", "3", "--store",
                        postgres_url, "--gpu-backend", "sim", env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = job_of(submitted.stdout.split("SUBMITTED", 1)[1])
    # The task whose worker holds a lease, mid-trial: cancel it as a preemption would.
    victim = wait_for(lambda: task_holding_a_lease(postgres_url, "slurm-grid"), 120,
                      "a worker holding a lease")
    cancelled = slurm.run("scancel", victim)
    assert cancelled.returncode == 0, cancelled.stderr
    assert slurm.wait_idle(300), slurm.jobs()
    elapsed = time.monotonic() - t0
    finished = [t for t in trials(postgres_url, "slurm-grid")
                if t["status"] in ("feasible", "infeasible")]
    configs = Counter(json.dumps(t["params"], sort_keys=True) for t in finished)
    logs = sorted((tmp_path / "artifacts").rglob(f"worker-{job}_*.log"))
    assert len(configs) == 9 and set(configs.values()) == {1}, (
        configs, [p.read_text()[-1500:] for p in logs])
    check = run_cli("check", "--gpu-backend", "sim", "--json", env=env)
    assert check.json()["verdict"] == "clean", check.stdout  # nothing of the job is left
    everything = trials(postgres_url, "slurm-grid")
    cut = [t for t in everything if t["status"] not in ("feasible", "infeasible")]
    assert cut, [(t["status"], t["cause"]) for t in everything]  # the cancelled task's trial
    assert all(json.dumps(t["params"], sort_keys=True) in configs for t in cut)  # ran again
    figure(f"slurm: 9-trial study on 3 array tasks in {elapsed:.0f} s; task {victim} "
           f"cancelled mid-trial, its trial recorded "
           f"{cut[0]['status']}/{cut[0]['cause']} and run again by another task; 9 results, "
           "no duplicate")


def test_a_decoy_on_an_allocated_gpu_makes_that_slot_refuse(
        slurm: SlurmCluster, tmp_path: Path, procs: Processes, postgres_url: str) -> None:
    env = env_for(tmp_path, slurm)
    decoy = procs.start([sys.executable, "-c", (
        "import ctypes, os, signal\n"
        "ctypes.CDLL(None).prctl(15, b'sglang::schedul', 0, 0, 0)\n"
        "from cleanslate.sim.ledger import allocate\n"
        "for gpu in range(4):\n"
        "    allocate(os.environ['CLEANSLATE_SIM_GPU_DIR'], gpu, 30000, 'sglang::scheduler')\n"
        "open(os.environ['READY'], 'w').close()\n"
        "signal.pause()\n")], env={**env, "READY": str(tmp_path / "decoy-ready")})
    wait_for(lambda: (tmp_path / "decoy-ready").exists(), 20, "the decoy")
    study = study_file(tmp_path, "slurm-decoy")
    submitted = run_cli("slurm", "submit", str(study), "--workers", "1", "--store",
                        postgres_url, "--gpu-backend", "sim", env=env, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert slurm.wait_idle(180), slurm.jobs()
    assert decoy.poll() is None  # the decoy was not signalled
    report = run_cli("report", "slurm-decoy", "--store", postgres_url, "--format", "json",
                     env=env)
    assert report.returncode == 0, report.stdout + report.stderr
    slots = report.json()["studies"][0]["slots"]
    quarantined = [s for s in slots if s["state"] == "quarantined"]
    assert quarantined, slots
    assert any(f.get("pid") == decoy.pid for s in quarantined for f in s["findings"]), slots
    done = [t for t in trials(postgres_url, "slurm-decoy")
            if t["status"] in ("feasible", "infeasible")]
    assert done == []  # no trial ran on a GPU the decoy holds
    decoy.send_signal(signal.SIGTERM)


def test_bad_input_is_refused_and_the_store_is_untouched(
        tmp_path: Path, postgres_url: str) -> None:
    study = study_file(tmp_path, "slurm-bad")
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    for args, needle in [
        (["--workers", "0"], "--workers"),
        (["--workers", "2", "--gpus-per-worker", "0"], "--gpus-per-worker"),
        (["--workers", "2", "--time", "tomorrow"], "not a Slurm time"),
        (["--workers", "2", "--", "--array=0-99"], "set by the script itself"),
    ]:
        done = run_cli("slurm", "submit", str(study), "--store", postgres_url, *args, env=env)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert needle in done.stderr, (args, done.stderr)
    assert trials(postgres_url, "slurm-bad") == []
    dry = run_cli("slurm", "submit", str(study), "--workers", "2", "--store", postgres_url,
                  "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --array=0-1" in dry.stdout and "--gres=gpu:1" in dry.stdout
    assert "postgresql" not in dry.stdout  # the URL is never in the script
    from cleanslate.store import Store

    reader = Store(postgres_url, create=False)
    try:
        assert reader.study("slurm-bad") is None  # a dry run registers nothing
    finally:
        reader.close()
