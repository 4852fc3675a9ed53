"""Stores for the report tests: real recorded studies (fast), and a study run for real (slow).

``recorded_store``: ``data/stores.json`` (two real studies, see ``data/README.md``) loaded into
a fresh SQLite store through the store's own API.

``live_store``: two tiny studies run by ``cleanslate tune`` on the sim engine into one SQLite
store (about 40 s; tests using it are ``slow``). Other processes on a shared host can make the
preflight check see the host dirty, so the tuner runs in a private PID namespace (``unshare -p
-f --mount-proc``) when it can.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cleanslate.store import RunRecord, Store, TrialRecord
from tests._kit import free_port

DATA = Path(__file__).parent / "data" / "stores.json"

TINY_STUDY = """\
name: report-tiny
engine: sim
model: sim-llama-8b
port: {port}
gpus: [0]
fixed: {{time-scale: 0.25}}
baseline: {{fault: null, max-running-requests: 64}}
space:
  fault: [null, oom-at-start]
  max-running-requests: [64, 128]
strategy: ablation
workload: {{kind: random, input_len: 256, output_len: 32}}
concurrency: [8, 32]
duration_s_per_level: 1
objective: {{maximize: output_throughput}}
slo: {{ttft_p99_ms: 8000}}
ready_timeout_s: 30
smoke_timeout_s: 20
grace_s: 5
verify_deadline_s: 30
"""

OTHER_STUDY = """\
name: report-tiny-b
engine: sim
model: sim-llama-8b
port: {port}
gpus: [0]
fixed: {{time-scale: 0.25, fault: null}}
space:
  max-running-requests: [32, 256]
strategy: grid
workload: {{kind: random, input_len: 256, output_len: 32}}
concurrency: [8, 32]
duration_s_per_level: 1
objective: {{maximize: output_throughput}}
slo: {{ttft_p99_ms: 8000}}
ready_timeout_s: 30
smoke_timeout_s: 20
grace_s: 5
verify_deadline_s: 30
"""


@dataclass(frozen=True)
class StudyStore:
    """A SQLite store holding studies, and the folder it lives in."""

    folder: Path
    url: str
    studies: tuple[str, ...]


def load_recorded(url: str) -> list[str]:
    """Write ``data/stores.json`` into the store at ``url``; returns the study names."""
    data = json.loads(DATA.read_text())
    store = Store(url)
    names = []
    try:
        for entry in data["studies"]:
            study = entry["study"]
            store.save_study(study["name"], study["spec"], study["status"])
            store.add_study_time(study["name"], float(study.get("elapsed_s") or 0.0))
            for trial in entry["trials"]:
                store.save_trial(TrialRecord.model_validate({**trial, "id": None}))
            for run in entry["runs"]:
                store.save_run(RunRecord.model_validate(run))
            names.append(study["name"])
    finally:
        store.close()
    return names


@pytest.fixture(scope="module")
def recorded_store(tmp_path_factory: pytest.TempPathFactory) -> StudyStore:
    folder = tmp_path_factory.mktemp("recorded")
    url = f"sqlite:///{folder / 'cleanslate.db'}"
    return StudyStore(folder, url, tuple(load_recorded(url)))


def _tune_argv(study_file: Path) -> list[str]:
    argv = [sys.executable, "-m", "cleanslate", "tune", str(study_file)]
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0:
        probe = subprocess.run([unshare, "-p", "-f", "--mount-proc", "true"],
                               capture_output=True, check=False, timeout=30)
        if probe.returncode == 0:
            return [unshare, "-p", "-f", "--mount-proc", *argv]
    return argv


@pytest.fixture(scope="session")
def live_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StudyStore]:
    """Two tiny sim studies run for real by ``cleanslate tune`` (ablation with an OOM trial,
    and a 2-config grid) into one store."""
    folder = tmp_path_factory.mktemp("live")
    names = []
    for name, text in (("report-tiny", TINY_STUDY), ("report-tiny-b", OTHER_STUDY)):
        path = folder / f"{name}.yaml"
        path.write_text(text.format(port=free_port()))
        # the default store (./cleanslate.db in the folder), not the session's
        env = {k: v for k, v in os.environ.items() if k != "CLEANSLATE_STORE"}
        done = subprocess.run(_tune_argv(path), cwd=folder, capture_output=True, text=True,
                              timeout=240, check=False, env=env)
        assert done.returncode == 0, f"cleanslate tune {name} failed:\n{done.stdout}\n" \
                                     f"{done.stderr}"
        names.append(name)
    yield StudyStore(folder, f"sqlite:///{folder / 'cleanslate.db'}", tuple(names))
