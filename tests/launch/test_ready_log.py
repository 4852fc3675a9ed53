"""``wait_ready`` reads a server's log while the server writes it. A traceback read before its
last line (the one that names the error) must not decide the cause: the log is read again once
the server exits or :data:`~cleanslate.launch.ready.LOG_SETTLE_S` passes. A writer thread plays
the engine here, so that the half-written moment is certain rather than a race."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from cleanslate.engines import engine_class
from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch import ready
from cleanslate.store import RunRecord
from tests._kit import free_port

HEAD = ("[2026-12-01 14:00:00 TP0] Scheduler hit an exception: Traceback (most recent call "
        "last):\n  File \"/sgl/managers/scheduler.py\", line 2411, in run_scheduler_process\n"
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)\n")
LAST = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 139.81 GiB of which 512.00 MiB is free.\n")


def _run(tmp_path: Path) -> RunRecord:
    folder = tmp_path / "r-ready"
    folder.mkdir()
    port = free_port()
    return RunRecord(id="r-ready", host="local", engine="sglang", model="m", argv=("x",),
                     marker="r-ready", port=port, url=f"http://127.0.0.1:{port}",
                     log_path=f"{folder}/server.log", artifacts_dir=str(folder))


def _wait_while_the_engine_writes(tmp_path: Path,
                                  exit_after_s: float | None) -> ready.ReadyResult:
    """``wait_ready`` on a run whose engine writes the traceback's head now and its last line
    0.4 s later, then (unless ``None``) its exit status ``exit_after_s`` after that."""
    run = _run(tmp_path)
    log = Path(run.log_path)
    log.write_text(HEAD)

    def finish() -> None:
        time.sleep(0.4)
        with log.open("a") as fh:
            fh.write(LAST)
        if exit_after_s is not None:
            time.sleep(exit_after_s)
            (Path(run.artifacts_dir) / "state.json").write_text(json.dumps({"exit_code": 1}))

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        return asyncio.run(ready.wait_ready(LocalExecutor(), engine_class("sglang")(), run,
                                            timeout=10, interval=0.05))
    finally:
        writer.join()


@pytest.mark.parametrize("exit_after_s", [0.1, None])
def test_a_half_written_traceback_is_read_again(tmp_path: Path,
                                                exit_after_s: float | None) -> None:
    result = _wait_while_the_engine_writes(tmp_path, exit_after_s)
    assert not result.ready
    assert result.cause == "oom", result
    assert "CUDA out of memory" in (result.detail or "")
    assert result.exit_code == (1 if exit_after_s is not None else None)


def test_without_the_settle_the_head_alone_decides(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: read once, the head of the traceback says only ``python_exception``."""
    monkeypatch.setattr(ready, "LOG_SETTLE_S", 0.0)
    result = _wait_while_the_engine_writes(tmp_path, None)
    assert result.cause == "python_exception", result
