"""``cleanslate clean``: tear down what is in scope, then verify.

``--pid`` never reaches PID 1, a kernel thread, an ancestor of this process (the shell that runs
it) or a member of its session: asking for one is an input error (exit 2) that says why. The
targets table shows each process's owner; process names and command lines are printed as text.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from cleanslate.cli._common import console, console_err, progress_printer
from cleanslate.cli._options import (
    DeadlineOption,
    GpuBackendOption,
    GraceOption,
    JsonOption,
    SettleOption,
    StoreOption,
    check_settle,
    named_host,
)
from cleanslate.cli._render import print_teardown, targets_table
from cleanslate.cli.stop import stop_run
from cleanslate.engines.signatures import require_signature
from cleanslate.errors import ExitCode, InputError
from cleanslate.hosts import executor_for
from cleanslate.verdict.check import DEFAULT_SETTLE_S

if TYPE_CHECKING:
    from cleanslate.teardown import Target


def clean(
    run: Annotated[str | None, typer.Option("--run", help="A recorded run id.")] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Processes matching this engine's signatures (not started by us).")
    ] = None,
    pid: Annotated[list[int] | None, typer.Option(
        "--pid", help="A process (and its descendants) to end (repeatable).")] = None,
    host: Annotated[str | None, typer.Option(
        callback=named_host, help="Host (default: this machine).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Act without asking.")] = False,
    grace: GraceOption = 30.0,
    deadline: DeadlineOption = 60.0,
    store_url: StoreOption = None,
    gpu_backend: GpuBackendOption = "auto",
    settle: SettleOption = DEFAULT_SETTLE_S,
    json_out: JsonOption = False,
) -> None:
    """End a run (--run), an engine's stray processes (--engine) or given PIDs (--pid), then
    verify. --engine and --pid list their targets and act only with --yes or a confirmation.
    PID 1, kernel threads, this command's ancestors and its session are never ended."""
    chosen = [name for name, value in (("--run", run), ("--engine", engine), ("--pid", pid))
              if value]
    if len(chosen) != 1:
        raise InputError("give exactly one of --run, --engine, --pid",
                         where=" ".join(chosen) or "clean")
    if not math.isfinite(settle) or settle < 0:
        raise InputError(f"must be zero or a positive number of seconds, got {settle:g}",
                         where="--settle")
    check_settle(settle, deadline)
    if run:
        raise typer.Exit(stop_run(run, store_url, grace, deadline, gpu_backend, json_out,
                                  settle=settle))
    if engine:
        require_signature(engine)
    bad = [p for p in pid or () if p <= 0]
    if bad:
        raise InputError(f"{bad[0]} is not a process id", where="--pid",
                         hint="a PID is a positive number (see `ps -e`)")
    from cleanslate.teardown import ScopeSpec, scan_scope, teardown
    from cleanslate.verdict.check import CheckOptions
    from cleanslate.verdict.rules import Scope

    executor = executor_for(host)
    spec = ScopeSpec(engine=engine, pids=tuple(pid or ()),
                     exclude_roots=frozenset({os.getpid()}))
    targets, protected = asyncio.run(scan_scope(executor, spec))
    named_protected = [t for t in protected if t.pid in (pid or ())]
    if named_protected:
        first = named_protected[0]
        raise InputError(
            f"refusing to end PID {first.pid} ({first.comm}): it is {first.protected}",
            where="--pid",
            hint="cleanslate never ends PID 1, kernel threads, its own ancestors or the "
                 "processes of the session it runs in; end those yourself if you must")
    missing = sorted(set(pid or ()) - {t.pid for t in targets})
    if missing:
        raise InputError(f"no such process: {', '.join(map(str, missing))}", where="--pid")
    if not targets:
        if not json_out:
            console.print(Text(f"no {engine} processes found"))
            if protected:
                console.print(targets_table("left alone (protected)", protected))
        else:
            from cleanslate.cli._documents import CleanNothing, emit

            emit(CleanNothing(left_alone=tuple(t.record() for t in protected)))
        raise typer.Exit(ExitCode.OK)
    _list_targets(targets, protected, json_out)
    if not yes:
        if not sys.stdin.isatty():
            console_err.print("[bold red]refusing:[/] these processes were not started by "
                              "cleanslate; pass --yes to end them")
            raise typer.Exit(ExitCode.INPUT)
        if not typer.confirm(f"end these {len(targets)} processes?", err=True):
            raise typer.Exit(ExitCode.INPUT)
    verify = CheckOptions(
        scope=Scope(engines=(engine,) if engine else (), markers=frozenset(),
                    exclude_roots=frozenset({os.getpid()})),
        gpu_backend=gpu_backend)
    report = asyncio.run(teardown(executor, spec, grace_s=grace, verify=verify,
                                  verify_deadline_s=deadline, verify_settle_s=settle,
                                  progress=progress_printer(quiet=json_out)))
    if json_out:
        typer.echo(report.model_dump_json())
    else:
        print_teardown(report)
    raise typer.Exit(report.exit_code)


def _list_targets(targets: list[Target], protected: list[Target], json_out: bool) -> None:
    out = console_err if json_out else console
    out.print(targets_table("targets", targets))
    if protected:
        out.print(targets_table("left alone (protected)", protected))


__all__ = ["clean"]
