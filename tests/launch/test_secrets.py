"""Secrets of a run (``env: HF_TOKEN``, a flag ``api-key``) never leave it: not in any file of the
artifacts folder (the spec that carried them is deleted once read; run folders are 0700 and their
files 0600), not in the store's bytes, not in ``serve`` / ``stop`` output, JSON or plain; a log
tail kept in the record is scrubbed of the real values; a store URL's password is never printed.

The engine is ``command`` around ``_secret_server.py``, which takes ``--api-key`` and becomes the
simulated engine.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._kit import free_port
from tests.conftest import run_cli
from tests.launch.conftest import Lab as LaunchLab

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
TOKEN = "hf_secret123"
KEY = "sk-live-abcdef1234567890"
SECRETS = (TOKEN, KEY)


class Lab(LaunchLab):
    """The launch tests' lab, with the secret-carrying server file and a search for leaks."""

    def server_file(self, *extra: str) -> Path:
        path = self.root / "server.yaml"
        path.write_text(json.dumps({
            "engine": "command", "model": "sim", "port": free_port(), "ready_timeout_s": 60,
            "smoke_timeout_s": 10, "env": {"HF_TOKEN": TOKEN},
            "argv": [sys.executable, str(HERE / "_secret_server.py"), *extra, "--port",
                     "{port}", "--model-path", "{model}"],
            "flags": {"api-key": KEY}}))
        return path

    def leaks(self) -> list[str]:
        """Files under the lab (artifacts, the store and its journals) holding a secret."""
        found = []
        for path in self.root.rglob("*"):
            if path.is_file() and path.name != "server.yaml":
                data = path.read_bytes()
                found += [f"{path.relative_to(self.root)}: {s}" for s in SECRETS
                          if s.encode() in data]
        return found


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    yield lab
    for run in lab.runs():
        if run["status"] in ("starting", "ready"):
            lab.cli("stop", run["id"], "--store", lab.store, "--json", "--grace", "2",
                    "--gpu-backend", "sim")


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} printed"


def test_secrets_reach_no_file_store_or_output(lab: Lab) -> None:
    served = lab.cli("serve", str(lab.server_file()), "--store", lab.store, "--detach",
                     "--gpu-backend", "sim")
    assert served.returncode == 0, served.stdout + served.stderr
    assert "--api-key ***" in served.stdout and "launching" in served.stderr
    assert_no_secret(served.stdout, served.stderr)
    (run,) = lab.runs()
    assert run["env"]["HF_TOKEN"] == "***" and run["flags"]["api-key"] == "***"
    assert KEY not in run["argv"]
    run_dir = Path(run["artifacts_dir"])
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert not (run_dir / "spec.json").exists()  # deleted by the supervisor once read
    for name in ("state.json", "server.log", "supervise.py"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    # The secret lives on only in the engine's own environment.
    assert f"HF_TOKEN={TOKEN}".encode() in Path(f"/proc/{run['pid']}/environ").read_bytes()

    as_json = lab.cli("stop", run["id"], "--store", lab.store, "--json", "--gpu-backend", "sim")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    assert_no_secret(as_json.stdout, as_json.stderr)
    assert lab.leaks() == []


def test_serve_json_shows_no_secret(lab: Lab) -> None:
    served = lab.cli("serve", str(lab.server_file()), "--store", lab.store, "--detach",
                     "--json", "--gpu-backend", "sim")
    assert served.returncode == 0, served.stdout + served.stderr
    doc = served.json()
    assert doc["argv"][-2:] == ["--api-key", "***"]
    assert_no_secret(served.stdout, served.stderr)
    stopped = lab.cli("stop", doc["run_id"], "--store", lab.store, "--gpu-backend", "sim")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert_no_secret(stopped.stdout, stopped.stderr)
    assert lab.leaks() == []


def test_a_log_that_prints_the_secrets_is_scrubbed_in_the_record(lab: Lab) -> None:
    """The engine's own log holds what the engine wrote (0600, in a 0700 folder); the tail and
    the failure detail that reach the store and the output carry ``***`` instead."""
    failed = lab.cli("serve", str(lab.server_file("--leak")), "--store", lab.store, "--detach",
                     "--json", "--gpu-backend", "sim")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    doc = failed.json()
    assert "RuntimeError: the hub refused token ***" in doc["detail"]
    assert "HF_TOKEN=***" in doc["log_tail"]
    assert_no_secret(failed.stdout, failed.stderr)
    (run,) = lab.runs()
    assert run["status"] == "failed"
    log = Path(run["log_path"])
    assert TOKEN.encode() in log.read_bytes()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert [leak for leak in lab.leaks() if not leak.endswith(f"server.log: {TOKEN}")
            and not leak.endswith(f"server.log: {KEY}")] == []
    plain = lab.cli("serve", str(lab.server_file("--leak")), "--store", lab.store, "--detach",
                    "--gpu-backend", "sim")
    assert plain.returncode == 1
    assert_no_secret(plain.stdout, plain.stderr)


def test_stop_never_prints_a_store_password(lab: Lab, postgres_url: str) -> None:
    url = postgres_url.replace("postgres@", "postgres:hunter2secret@", 1)
    for args in (("stop", "r-nope"), ("clean", "--run", "r-nope")):
        result = run_cli(*args, "--store", url)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "no run 'r-nope'" in result.stderr
        assert "hunter2secret" not in result.stdout + result.stderr
