"""Serving in the foreground (``cleanslate serve`` without ``--detach``): start a verified server,
serve until Ctrl-C, SIGTERM or a crash, then tear it down and verify.

Whatever ends the wait (a signal, the engine exiting by itself, an exception raised by the
caller's ``on_ready`` report, a closed stdout, a cancelled task), the server goes down and the
host is verified before :func:`serve_foreground` returns or its exception goes on. A signal that
arrives while the server is still starting is remembered and acted on as soon as it is up: a
foreground server is never left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from cleanslate.errors import ExitCode
from cleanslate.hosts.base import Executor
from cleanslate.launch.config import ServeConfig
from cleanslate.launch.lifecycle import (
    Progress,
    StartOutcome,
    ended_before_stop,
    run_exit_code,
    start_server,
    stop_server,
)
from cleanslate.store import RunRecord, RunStatus, Store
from cleanslate.teardown import TeardownReport

#: Called once the server is ready and smoke-tested, before serving: the caller reports it.
OnReady = Callable[[RunRecord, StartOutcome], None]

#: Seconds between two looks at whether the engine is still running.
POLL_S = 1.0


@dataclass(frozen=True)
class ForegroundEnd:
    """How serving ended: ``stopped`` (asked to, by a signal), ``crashed`` (the engine exited by
    itself; ``cause`` is its log's root cause, else ``killed`` by a signal or ``exited``, and
    ``detail`` says more) or ``failed`` (the wait was interrupted by an error), and the teardown
    that followed, with its verification."""

    run: RunRecord
    status: RunStatus
    cause: str | None
    teardown: TeardownReport
    detail: str | None = None

    @property
    def exit_code(self) -> ExitCode:
        """``FAILED`` after a crash, else the teardown's (clean, dirty or unknown after it)."""
        if self.status is RunStatus.CRASHED:
            return ExitCode.FAILED
        return ExitCode(self.teardown.exit_code)


@dataclass(frozen=True)
class ForegroundResult:
    """The start (``start.ok``: ready and smoke-tested) and, when it started, how serving
    ended."""

    start: StartOutcome
    end: ForegroundEnd | None = None

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAILED if self.end is None else self.end.exit_code


def serve_in_foreground(executor: Executor, store: Store, config: ServeConfig, *,
                        gpu_backend: str = "auto", preflight: bool = True,
                        progress: Progress | None = None,
                        on_ready: OnReady | None = None,
                        snapshot: bool = False) -> ForegroundResult:
    """:func:`serve_foreground` in a new event loop, with SIGINT and SIGTERM meaning "tear it
    down" from this call on (the process's handlers of both are replaced). For a command line's
    main thread."""
    interrupted = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: interrupted.set())
    return asyncio.run(serve_foreground(executor, store, config, gpu_backend=gpu_backend,
                                        preflight=preflight, progress=progress,
                                        on_ready=on_ready, interrupted=interrupted,
                                        snapshot=snapshot))


async def serve_foreground(executor: Executor, store: Store, config: ServeConfig, *,
                           gpu_backend: str = "auto", preflight: bool = True,
                           progress: Progress | None = None, on_ready: OnReady | None = None,
                           interrupted: threading.Event | None = None,
                           snapshot: bool = False) -> ForegroundResult:
    """Start the server (:func:`~cleanslate.launch.lifecycle.start_server`); when it is up, call
    ``on_ready`` and serve until SIGINT / SIGTERM (or ``interrupted`` being set, from another
    thread or a signal handler) or the engine's exit; then tear down and verify
    (:func:`~cleanslate.launch.lifecycle.stop_server`), the record updated with how it ended.
    A start that failed is returned with ``end`` ``None`` (it was torn down already).
    ``snapshot``: record a doctor snapshot of the host with the run (``start_server``)."""
    say = progress or (lambda _m: None)
    outcome = await start_server(executor, store, config, gpu_backend=gpu_backend,
                                 preflight=preflight, progress=say, snapshot=snapshot)
    if not outcome.ok:
        return ForegroundResult(outcome)
    run = outcome.run
    assert run is not None
    end: ForegroundEnd | None = None
    try:
        if on_ready is not None:
            on_ready(run, outcome)
        end = await _serve(executor, store, run, grace_s=config.grace_s,
                           gpu_backend=gpu_backend, interrupted=interrupted or threading.Event())
        return ForegroundResult(outcome, end)
    finally:
        if end is None:
            await _stop_if_running(executor, store, run, config.grace_s, gpu_backend, say)


async def _serve(executor: Executor, store: Store, run: RunRecord, *, grace_s: float,
                 gpu_backend: str, interrupted: threading.Event) -> ForegroundEnd:
    """Wait for a signal or the engine's exit, then tear down (always, shielded)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    if interrupted.is_set():
        stop.set()
    status, cause, detail = RunStatus.STOPPED, None, None
    try:
        while not stop.is_set() and not interrupted.is_set():
            if await run_exit_code(executor, run) is not None:
                how, cause, detail = await ended_before_stop(executor, run, None,
                                                           when="while serving")
                status = RunStatus(how)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)
    except BaseException:
        status, cause = RunStatus.FAILED, "interrupted"
        raise
    finally:
        # Whatever ended the wait, the server goes down and the host is verified.
        report = await asyncio.shield(stop_server(
            executor, store, run, grace_s=grace_s, gpu_backend=gpu_backend, status=status,
            cause=cause, detail=detail))
    return ForegroundEnd(run=run, status=status, cause=cause, teardown=report, detail=detail)


async def _stop_if_running(executor: Executor, store: Store, run: RunRecord, grace_s: float,
                           gpu_backend: str, say: Progress) -> None:
    """Tear the run down unless its record says it was stopped already (the store unreadable:
    tear down anyway). Never raises: the caller's exception is the one that matters."""
    with contextlib.suppress(BaseException):
        try:
            running = store.get_run(run.id).status.running
        except Exception:
            running = True
        if running:
            say("tearing the server down")
            await asyncio.shield(stop_server(executor, store, run, grace_s=grace_s,
                                             gpu_backend=gpu_backend, status=RunStatus.FAILED,
                                             cause="interrupted", progress=say))


__all__ = ["ForegroundEnd", "ForegroundResult", "OnReady", "serve_foreground",
           "serve_in_foreground"]
