"""Start a run: the supervisor script on the host, the marker, the log file, the record.

Launch is designed for teardown (DESIGN section 4): the engine runs in a new session under a
supervisor that is its child subreaper, every process carries ``CLEANSLATE_RUN=<run id>`` in
its environment, the log goes to a file per run, and the record names every PID with its start
time before anything can go wrong.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from cleanslate.engines import EngineAdapter
from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.store import RunRecord

MARKER_ENV = "CLEANSLATE_RUN"


class LaunchError(Exception):
    """The supervisor could not start the engine (the message says why)."""


def new_run_id() -> str:
    """``r-YYYYmmdd-HHMMSS-xxxx``: sortable, short enough to type."""
    return datetime.now(UTC).strftime("r-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


@cache
def supervisor_source() -> bytes:
    return resources.files("cleanslate.launch").joinpath("_supervise.py").read_bytes()


@dataclass(frozen=True)
class LaunchRequest:
    """Everything :func:`launch` needs. ``run_dir`` is the run's artifacts folder on the host."""

    run_id: str
    adapter: EngineAdapter
    model: str
    port: int
    argv: tuple[str, ...]
    flags: dict[str, Any]
    env: dict[str, str]
    gpus: tuple[int, ...] | None
    run_dir: str
    study: str | None = None
    trial: int | None = None


async def launch(executor: Executor, request: LaunchRequest, *,
                 timeout: float = 15.0) -> RunRecord:
    """Start the engine under the supervisor and return the run record with its PIDs.

    Raises :class:`LaunchError` when the supervisor cannot start or reports no engine PID.
    """
    run_dir = request.run_dir.rstrip("/")
    log_path = f"{run_dir}/server.log"
    state_path = f"{run_dir}/state.json"
    spec_path = f"{run_dir}/spec.json"
    script_path = f"{run_dir}/supervise.py"
    env = {**request.env, MARKER_ENV: request.run_id}
    if request.gpus is not None and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, request.gpus))
    spec = {"argv": list(request.argv), "env": env, "log": log_path, "state": state_path,
            "daemonize": True}
    await executor.write_file(script_path, supervisor_source())
    await executor.write_file(spec_path, json.dumps(spec, indent=1).encode())
    started = time.time()
    result = await executor.run([executor.python, "-I", "-S", script_path, spec_path],
                                timeout=timeout, env={MARKER_ENV: request.run_id})
    if not result.ok:
        raise LaunchError(f"the run supervisor did not start: {result.describe_failure()}")
    state = await _read_state(executor, state_path, timeout)
    if state.get("error") or not state.get("pid"):
        raise LaunchError(f"the run supervisor could not start the engine: {state.get('error')}")
    snapshot = await probe_host(executor, NoGpuBackend(), timeout=timeout)
    root = snapshot.process(int(state["pid"]))
    supervisor = snapshot.process(int(state["supervisor_pid"]))
    return RunRecord(
        id=request.run_id,
        host=executor.name,
        engine=request.adapter.name,
        model=request.model,
        argv=request.argv,
        flags=request.flags,
        env=env,
        marker=request.run_id,
        port=request.port,
        gpus=request.gpus,
        url=request.adapter.base_url(request.port),
        log_path=log_path,
        artifacts_dir=run_dir,
        status="starting",
        pid=int(state["pid"]),
        pgid=int(state["pgid"]),
        sid=int(state["sid"]),
        create_time=root.create_time if root else None,
        supervisor_pid=int(state["supervisor_pid"]),
        supervisor_create_time=supervisor.create_time if supervisor else None,
        started_at=started,
        study=request.study,
        trial=request.trial,
    )


async def read_state(executor: Executor, state_path: str) -> dict[str, Any] | None:
    """The supervisor's state file, or ``None`` while it does not exist."""
    try:
        data: dict[str, Any] = json.loads(await executor.read_file(state_path))
    except (FileNotFoundError, ValueError):
        return None
    return data


async def _read_state(executor: Executor, state_path: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state = await read_state(executor, state_path)
        if state is not None and (state.get("pid") or state.get("error")):
            return state
        if time.monotonic() > deadline:
            raise LaunchError(f"the run supervisor wrote no state within {timeout:g} s "
                              f"({state_path})")
        await asyncio.sleep(0.05)

