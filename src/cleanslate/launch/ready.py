"""Wait until a launched server is really ready.

Ready means all of: the readiness endpoint answers 200, the engine's root process is alive,
and the log shows no crash signature. Whichever fails first decides the cause: the engine's
crash classification of the log (``oom``, ``cuda_error`` ...), ``exited`` (the process ended
with no recognisable cause in its log) or ``timeout``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from cleanslate.engines import EngineAdapter
from cleanslate.hosts.base import Executor
from cleanslate.launch.launcher import scrubber_for
from cleanslate.models import Frozen
from cleanslate.store import RunRecord

LOG_TAIL_BYTES = 6000
#: Where launch makes run folders on a remote host: relative to the SSH user's home.
REMOTE_RUNS_ROOT = ".cleanslate/runs"
#: After the log of a server that still runs shows a failure: how long to let it finish writing
#: (a traceback names its error on its last line) or exit before the log is read again. A
#: traceback read half-written says ``python_exception`` where its last line says ``oom``.
LOG_SETTLE_S = 1.0


class ReadyResult(Frozen):

    ready: bool
    cause: str | None = None
    detail: str | None = None
    elapsed_s: float
    exit_code: int | None = None


def run_log_path(run: RunRecord) -> str | None:
    """The run's log file, or ``None`` when the record names a file outside the run's own folder
    (``<artifacts>/<run id>/server.log``, as launch writes it): a record in a shared store must
    not make cleanslate read, keep and print an arbitrary file of the host. This checks the
    record's text; :func:`run_file` also checks where the folder really is."""
    folder = run.artifacts_dir.rstrip("/")
    parts = folder.split("/")
    if parts[-1] != run.id or ".." in parts or run.log_path != f"{folder}/server.log":
        return None
    return run.log_path


def run_file(executor: Executor, run: RunRecord, name: str,
             artifacts: Path | str | None = None) -> tuple[str, str] | None:
    """``(path, root)`` of the file ``name`` (``server.log``, ``state.json``) of the run's own
    folder, to read with ``executor.read_file(path, under=root)`` (no symbolic link followed
    below ``root``: :func:`cleanslate.hosts.files.open_under`), or ``None`` when the record's
    folder is not the run's own (:func:`run_log_path`) or is not where it must be: on a remote
    host ``.cleanslate/runs/<run id>`` (:data:`REMOTE_RUNS_ROOT`, as launch makes it); on this
    machine ``<artifacts>/<run id>`` after ``realpath``, where ``artifacts`` is the store's own
    artifacts folder (:attr:`cleanslate.store.Store.artifacts_root`). Without ``artifacts`` (a
    run this process has just launched) the folder the record names holds it."""
    if run_log_path(run) is None:
        return None
    if not executor.is_local:
        if os.path.normpath(run.artifacts_dir) != f"{REMOTE_RUNS_ROOT}/{run.id}":
            return None
        return f"{REMOTE_RUNS_ROOT}/{run.id}/{name}", REMOTE_RUNS_ROOT
    if artifacts is None:
        root = os.path.dirname(run.artifacts_dir.rstrip("/")) or "."
    else:
        root = os.path.realpath(artifacts)
        if os.path.realpath(run.artifacts_dir) != os.path.join(root, run.id):
            return None
    return f"{root}/{run.id}/{name}", root


async def read_run_file(executor: Executor, run: RunRecord, name: str, *,
                        artifacts: Path | str | None = None, max_bytes: int = 1 << 20,
                        tail: bool = False) -> bytes:
    """The file ``name`` of the run's own folder (:func:`run_file`), read without following a
    link: ``FileNotFoundError`` when it is missing, ``PermissionError`` when the record points
    elsewhere or the file is a link, not a regular file or another user's."""
    found = run_file(executor, run, name, artifacts)
    if found is None:
        raise PermissionError(f"{run.artifacts_dir}: not the folder of run {run.id}")
    path, root = found
    return await executor.read_file(path, max_bytes=max_bytes, tail=tail, under=root)


async def run_state(executor: Executor, run: RunRecord, *,
                    artifacts: Path | str | None = None) -> dict[str, Any] | None:
    """The supervisor's ``state.json`` of the run (:func:`read_run_file`), or ``None`` while it
    does not exist, cannot be read or is not a JSON object."""
    try:
        data = json.loads(await read_run_file(executor, run, "state.json", artifacts=artifacts))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def log_tail(executor: Executor, run: RunRecord, max_bytes: int = LOG_TAIL_BYTES, *,
                   artifacts: Path | str | None = None) -> str:
    """The last ``max_bytes`` of the run's log ('' when there is none yet, or when it is not the
    run's own: :func:`read_run_file`), scrubbed of the run's secrets
    (:func:`~cleanslate.launch.launcher.scrubber_for`)."""
    try:
        data = await read_run_file(executor, run, "server.log", artifacts=artifacts,
                                   max_bytes=max_bytes, tail=True)
    except OSError:
        return ""
    return scrubber_for(run.id)(data.decode(errors="replace")) or ""


async def classify_run_log(executor: Executor, adapter: EngineAdapter, run: RunRecord,
                           returncode: int | None = None, *,
                           artifacts: Path | str | None = None) -> tuple[str, str] | None:
    """(cause, root-cause line) from the whole log (:func:`read_run_file`), or ``None`` when it
    shows no failure."""
    try:
        text = (await read_run_file(executor, run, "server.log", artifacts=artifacts,
                                    tail=True)).decode(errors="replace")
    except OSError:
        text = ""
    crash = adapter.classify_log(text, returncode=returncode)
    if crash is None:
        return None
    return str(crash.cause), scrubber_for(run.id)(crash.line) or ""


async def wait_ready(
    executor: Executor,
    adapter: EngineAdapter,
    run: RunRecord,
    *,
    timeout: float,
    interval: float = 0.25,
    base_url: str | None = None,
) -> ReadyResult:
    """Poll readiness, liveness and the log until ready, failed, or ``timeout`` seconds.
    ``base_url`` is where this machine reaches the run's port (``Executor.forward_port``);
    without it, this machine's own loopback (a run on this machine)."""
    started = time.monotonic()
    url = (base_url.rstrip("/") + adapter.readiness_path if base_url is not None
           else adapter.readiness_url(run.port))
    client_timeout = aiohttp.ClientTimeout(total=min(5.0, max(1.0, interval * 8)))
    from cleanslate.hosts.forward import connector_for  # a remote run: the forward's socket

    async with aiohttp.ClientSession(connector=connector_for(url),
                                     timeout=client_timeout) as session:
        last_error = "no answer yet"
        while True:
            state = await run_state(executor, run)
            exit_code = state.get("exit_code") if state else None
            if state is not None and exit_code is not None:
                found = await classify_run_log(executor, adapter, run, returncode=exit_code)
                cause, line = found or ("exited", f"the server exited with status {exit_code} "
                                        "before it was ready")
                return ReadyResult(ready=False, cause=cause, detail=line, exit_code=exit_code,
                                   elapsed_s=round(time.monotonic() - started, 3))
            found = await classify_run_log(executor, adapter, run)
            if found is not None:
                (cause, line), code = await _settled(executor, adapter, run, found)
                return ReadyResult(ready=False, cause=cause, detail=line, exit_code=code,
                                   elapsed_s=round(time.monotonic() - started, 3))
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return ReadyResult(ready=True,
                                           elapsed_s=round(time.monotonic() - started, 3))
                    last_error = f"{url} answered HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last_error = f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")
            if time.monotonic() - started > timeout:
                return ReadyResult(ready=False, cause="timeout",
                                   detail=f"not ready after {timeout:g} s ({last_error})",
                                   elapsed_s=round(time.monotonic() - started, 3))
            await asyncio.sleep(interval)


async def _settled(executor: Executor, adapter: EngineAdapter, run: RunRecord,
                   first: tuple[str, str]) -> tuple[tuple[str, str], int | None]:
    """The failure a running server's log showed (``first``), read again once the server has
    exited or :data:`LOG_SETTLE_S` has passed, with its exit status (``None``: still running)."""
    deadline = time.monotonic() + LOG_SETTLE_S
    code = None
    while code is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        state = await run_state(executor, run)
        code = state.get("exit_code") if state else None
    found = await classify_run_log(executor, adapter, run, returncode=code)
    return found or first, code
