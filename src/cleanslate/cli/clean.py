"""``cleanslate clean``: tear down what is in scope, then verify."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Annotated

import typer
from rich.table import Table

from cleanslate.cli import app
from cleanslate.cli._common import EXIT_INPUT, console, console_err
from cleanslate.cli.serve import _print_teardown, stop_run
from cleanslate.engines.signatures import get_signature
from cleanslate.errors import InputError
from cleanslate.hosts import executor_for
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.teardown.teardown import ScopeSpec, Target, resolve_scope, teardown
from cleanslate.verdict.check import CheckOptions
from cleanslate.verdict.rules import Scope


@app.command()
def clean(
    run: Annotated[str | None, typer.Option("--run", help="A recorded run id.")] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Processes matching this engine's signatures (not started by us).")
    ] = None,
    pid: Annotated[list[int] | None, typer.Option(
        "--pid", help="A process (and its descendants) to end (repeatable).")] = None,
    host: Annotated[str | None, typer.Option(help="Host (default: this machine).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Act without asking.")] = False,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 30.0,
    deadline: Annotated[float, typer.Option(help="Seconds to wait for a clean verdict.")
                        ] = 60.0,
    store_url: Annotated[str | None, typer.Option("--store", help="Store URL (--run).")] = None,
    gpu_backend: Annotated[str, typer.Option(help="GPU backend for verification.")] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
) -> None:
    """End a run (--run), an engine's stray processes (--engine) or given PIDs (--pid), then
    verify. --engine and --pid list their targets and act only with --yes or a confirmation."""
    chosen = [name for name, value in (("--run", run), ("--engine", engine), ("--pid", pid))
              if value]
    if len(chosen) != 1:
        raise InputError("give exactly one of --run, --engine, --pid",
                         where=" ".join(chosen) or "clean")
    if run:
        raise typer.Exit(stop_run(run, store_url, grace, deadline, gpu_backend, json_out))
    if engine:
        get_signature(engine)
    executor = executor_for(host)
    spec = ScopeSpec(engine=engine, pids=tuple(pid or ()),
                     exclude_roots=frozenset({os.getpid()}))
    snapshot = asyncio.run(probe_host(executor, NoGpuBackend()))
    targets = resolve_scope(snapshot, spec)
    missing = sorted(set(pid or ()) - {t.pid for t in targets})
    if missing:
        raise InputError(f"no such process: {', '.join(map(str, missing))}", where="--pid")
    if not targets:
        if not json_out:
            console.print(f"no {engine} processes found")
        else:
            typer.echo(json.dumps({"targets": [], "verify": None}))
        raise typer.Exit(0)
    _list_targets(targets, json_out)
    if not yes:
        if not sys.stdin.isatty():
            console_err.print("[bold red]refusing:[/] these processes were not started by "
                              "cleanslate; pass --yes to end them")
            raise typer.Exit(EXIT_INPUT)
        if not typer.confirm(f"end these {len(targets)} processes?", err=True):
            raise typer.Exit(EXIT_INPUT)
    verify = CheckOptions(
        scope=Scope(engines=(engine,) if engine else (), markers=frozenset(),
                    exclude_roots=frozenset({os.getpid()})),
        gpu_backend=gpu_backend)
    say = (lambda _m: None) if json_out else (lambda m: console_err.print(f"[dim]{m}[/]"))
    report = asyncio.run(teardown(executor, spec, grace_s=grace, verify=verify,
                                  verify_deadline_s=deadline, progress=say))
    if json_out:
        typer.echo(report.model_dump_json())
    else:
        _print_teardown(report)
    raise typer.Exit(report.exit_code)


def _list_targets(targets: list[Target], json_out: bool) -> None:
    out = console_err if json_out else console
    table = Table(title="targets", title_justify="left")
    for column in ("PID", "why", "comm", "command"):
        table.add_column(column, overflow="fold")
    for t in targets:
        table.add_row(str(t.pid), t.why, t.comm, t.command[:100])
    out.print(table)
