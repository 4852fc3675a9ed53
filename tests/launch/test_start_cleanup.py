"""No way out of ``start_server`` leaves a server running (issue 12, "left behind").

Once the engine is launched, a failure that is not a start failure (a bug, a store error, a
cancelled task, Ctrl-C) tears the run down and verifies before the exception goes on; the record
ends ``failed``, not stuck ``starting``. In-process with the simulated engine; the census of the
run's processes reads ``/proc`` for its marker. Foreground ``serve`` too: a stdout that closes
under it (``| head``) does not leave the server up.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch import lifecycle
from cleanslate.launch.config import ServeConfig
from cleanslate.launch.lifecycle import start_server
from cleanslate.store import Store
from tests._kit import free_port

pytestmark = pytest.mark.slow


def marked(run_id: str) -> list[int]:
    """Live processes carrying ``CLEANSLATE_RUN=<run_id>``."""
    needle = f"CLEANSLATE_RUN={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    return Store(f"sqlite:///{tmp_path}/cs.db")


def sim(**flags: Any) -> ServeConfig:
    return ServeConfig(engine="sim", model="sim", port=free_port(), ready_timeout_s=60,
                       smoke_timeout_s=10, grace_s=5, flags={"tp-size": 2, **flags})


def start(store: Store, config: ServeConfig) -> Any:
    return start_server(LocalExecutor(), store, config, gpu_backend="sim", validate=False,
                        verify_deadline_s=20)


def test_a_bug_after_launch_tears_the_server_down(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> Any:
        assert [r for r in store.runs() if marked(r.id)], "the server is not up"
        raise RuntimeError("a bug in the smoke test")

    monkeypatch.setattr(lifecycle, "smoke_test", broken)
    with pytest.raises(RuntimeError, match="a bug in the smoke test"):
        asyncio.run(start(store, sim()))
    (run,) = store.runs()
    assert marked(run.id) == []
    assert run.status == "failed" and run.cause == "error"
    assert "RuntimeError" in (run.detail or "")
    assert run.verdict_after is not None and run.verdict_after.verdict == "clean"


def test_a_store_error_after_launch_tears_the_server_down(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[str] = []
    real = store.save_run

    def failing(run: Any) -> None:
        saves.append(run.status)
        if run.status == "ready":
            raise OSError("disk full")
        real(run)

    monkeypatch.setattr(store, "save_run", failing)
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(start(store, sim()))
    (run,) = store.runs()
    assert marked(run.id) == []
    assert run.status == "failed" and run.cause == "error"


def test_a_cancelled_start_tears_the_server_down(store: Store) -> None:
    """Ctrl-C under ``asyncio.run`` cancels the main task: the same path."""
    async def cancel_while_starting() -> None:
        task = asyncio.create_task(start(store, sim(fault="slow-start=30")))
        deadline = time.monotonic() + 30
        while not any(marked(r.id) for r in store.runs()):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_starting())
    (run,) = store.runs()
    assert marked(run.id) == []
    assert run.status == "failed" and run.cause == "interrupted"


def test_foreground_serve_whose_stdout_is_closed_still_tears_down(tmp_path: Path) -> None:
    """``cleanslate serve --json ... | head -0``: the one JSON document comes at the end, so
    serving goes on (READY is on stderr); on SIGTERM the server is torn down, and printing the
    document into the closed pipe ends the command quietly, with no traceback and nothing left."""
    import signal

    db = tmp_path / "cs.db"
    (tmp_path / "gpus").mkdir()
    env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}
    read, write = os.pipe()
    os.close(read)  # nobody will ever read: a write fails with EPIPE
    proc = subprocess.Popen(
        [sys.executable, "-m", "cleanslate", "serve", "--engine", "sim", "--model", "sim",
         "--port", str(free_port()), "--store", f"sqlite:///{db}", "--json", "--grace", "5",
         "--gpu-backend", "sim", "--", "--tp-size", "1"],
        stdout=write, stderr=subprocess.PIPE, env=env)
    os.close(write)
    try:
        assert proc.stderr is not None
        ready = next((line for line in proc.stderr if line.startswith(b"READY run ")), None)
        assert ready is not None, f"no READY line; exit {proc.wait(timeout=60)}"
        proc.send_signal(signal.SIGTERM)  # the command this test started, by PID
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # never leave its server behind for the tests after this one
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert b"Traceback" not in err, err.decode()
    store = Store(f"sqlite:///{db}")
    (run,) = store.runs()
    assert marked(run.id) == []
    assert run.status == "stopped", json.dumps(run.model_dump(mode="json"))[:500]
    assert run.verdict_after is not None and run.verdict_after.verdict == "clean"
