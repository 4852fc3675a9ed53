"""``cleanslate stop RUN_ID``: teardown of a recorded run, then verification
(:func:`~cleanslate.launch.lifecycle.stop_server`; ``docs/teardown.md``).

A record of another boot of the host is closed without signalling anything; a record of another
machine is refused (exit 2). Errors never show a store URL's password.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from cleanslate.cli._common import console_err, progress_printer
from cleanslate.cli._options import (
    DeadlineOption,
    GpuBackendOption,
    GraceOption,
    JsonOption,
    SettleOption,
    StoreOption,
    check_settle,
)
from cleanslate.cli._render import print_teardown
from cleanslate.cli._run_state import ServerExit, server_exit
from cleanslate.errors import ExitCode, InputError
from cleanslate.hosts import executor_for
from cleanslate.redact import redact_text
from cleanslate.verdict.check import DEFAULT_SETTLE_S

if TYPE_CHECKING:
    from cleanslate.store import RunRecord, Store
    from cleanslate.teardown import TeardownReport


def stop(
    run_id: Annotated[str, typer.Argument(help="The run id printed by `serve`.")],
    store_url: StoreOption = None,
    grace: GraceOption = 30.0,
    deadline: DeadlineOption = 60.0,
    gpu_backend: GpuBackendOption = "auto",
    settle: SettleOption = DEFAULT_SETTLE_S,
    json_out: JsonOption = False,
) -> None:
    """Tear down a recorded run and verify the host is clean (same as `clean --run ID`)."""
    raise typer.Exit(stop_run(run_id, store_url, grace, deadline, gpu_backend, json_out,
                              settle=settle))


def stop_run(run_id: str, store_url: str | None, grace: float, deadline: float,
             gpu_backend: str, json_out: bool, *, settle: float = DEFAULT_SETTLE_S) -> int:
    """``cleanslate stop`` / ``clean --run``: the exit code. Errors never show a store URL's
    password."""
    if not math.isfinite(settle) or settle < 0:
        raise InputError(f"must be zero or a positive number of seconds, got {settle:g}",
                         where="--settle")
    check_settle(settle, deadline)
    from cleanslate.launch.lifecycle import stop_server
    from cleanslate.store import Store

    try:
        store = Store(store_url, create=False)
        run = store.get_run(run_id)
    except InputError as exc:
        raise InputError(redact_text(exc.message), where=exc.where,
                         hint=redact_text(exc.hint) if exc.hint else None) from None
    executor = executor_for(None if run.host == "local" else run.host)
    artifacts = store.artifacts_root if executor.is_local else None

    async def read_then_stop() -> tuple[ServerExit | None, TeardownReport]:
        # Read before the teardown: its SIGTERM makes the supervisor record an exit too.
        ended = await server_exit(executor, run, artifacts) if run.status.running else None
        report = await stop_server(executor, store, run, grace_s=grace,
                                   gpu_backend=gpu_backend, verify_deadline_s=deadline,
                                   verify_settle_s=settle,
                                   progress=progress_printer(quiet=json_out))
        return ended, report

    ended, report = asyncio.run(read_then_stop())
    if ended is None and run.status.running:
        ended = _gone_unrecorded(store, run.id)
    if json_out:
        from cleanslate.cli._documents import emit, stopped

        emit(stopped(run.id, report, server_exited=ended))
    else:
        print_teardown(report)
        if ended is not None:  # beside the verdict: the run had died, and why (text)
            console_err.print(Text.assemble(("the server had exited before the stop: ",
                                             "bold yellow"), ended.describe()), soft_wrap=True)
        elif run.status.running and _supervisor_gone(run, report):
            console_err.print(Text(
                f"the run's supervisor (PID {run.supervisor_pid}) was gone before the stop; "
                "its server was still running and was stopped (no exit status could be "
                "recorded for it)", style="yellow"), soft_wrap=True)
    if report.refused_code == ExitCode.INPUT and not json_out:
        console_err.print(Text.assemble(("refused: ", "bold red"), report.refused or ""))
    return report.exit_code


def _supervisor_gone(run: RunRecord, report: TeardownReport) -> bool:
    """The teardown found the run's engine root (its PID with its start time) but not its
    supervisor: the supervisor had ended (``kill -9``) while the server kept serving."""
    if run.supervisor_pid is None or report.refused:
        return False
    whys = {t.why for t in report.targets}
    return "root" in whys and "supervisor" not in whys


def _gone_unrecorded(store: Store, run_id: str) -> ServerExit | None:
    """The run's server was gone before the stop although its supervisor recorded no exit
    (the supervisor is gone too): the teardown found its root process missing and recorded
    the run ``crashed`` (:func:`~cleanslate.launch.lifecycle.stop_server`); ``None`` when
    it did not."""
    try:
        after = store.get_run(run_id)
    except InputError:
        return None
    if after.status != "crashed" or after.cause is None:
        return None
    return ServerExit(exited_at=None, exit_status=None, cause=after.cause,
                      line=after.detail or "its root process was gone",
                      source="process_table")


__all__ = ["stop", "stop_run"]
