"""``cleanslate check``: is this host a clean slate?"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from cleanslate.cli import app
from cleanslate.cli._common import EXIT_INPUT, console, console_err, parse_int_list
from cleanslate.engines.signatures import get_signature
from cleanslate.errors import InputError
from cleanslate.hosts import executor_for, set_accept_new_host_keys
from cleanslate.probe.gpu.base import backend_names
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.check import CheckOptions, CheckReport, check_host, check_hosts
from cleanslate.verdict.check import check_until_clean as _until_clean
from cleanslate.verdict.findings import HostVerdict, Severity, Verdict
from cleanslate.verdict.rules import DEFAULT_IDLE_TOLERANCE_MIB, Scope

_MAX_ROWS_PER_KIND = 5
_VERDICT_STYLE = {Verdict.CLEAN: "bold green", Verdict.DIRTY: "bold red",
                  Verdict.UNKNOWN: "bold yellow"}
_SEVERITY_STYLE = {Severity.ERROR: "red", Severity.UNKNOWN: "yellow", Severity.WARNING: "magenta",
                   Severity.INFO: "dim"}


@app.command()
def check(
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="Host to check (repeatable); default: this machine.")] = None,
    gpus: Annotated[str | None, typer.Option(
        help="GPU indices in scope, e.g. 0,1 (default: all).")] = None,
    port: Annotated[list[int] | None, typer.Option(
        "--port", help="Port that must be free (repeatable).")] = None,
    engine: Annotated[list[str] | None, typer.Option(
        "--engine", help="Only these engines' processes count as strays (repeatable).")] = None,
    gpu_backend: Annotated[str, typer.Option(
        help="auto, nvml, nvidia-smi, sim or none.")] = "auto",
    baseline: Annotated[Path | None, typer.Option(
        help="Compare with an idle-state baseline saved by --save-baseline.")] = None,
    save_baseline: Annotated[Path | None, typer.Option(
        help="Save this reading as the idle-state baseline.")] = None,
    until_clean: Annotated[bool, typer.Option(
        "--until-clean", help="Re-probe until clean or the deadline.")] = False,
    deadline: Annotated[float, typer.Option(
        help="Seconds --until-clean keeps trying.")] = 60.0,
    interval: Annotated[float, typer.Option(
        help="Seconds between probes with --until-clean.")] = 0.5,
    timeout: Annotated[float, typer.Option(
        help="Seconds each probe source may take before it counts as unknown.")] = 10.0,
    tolerance_mib: Annotated[int, typer.Option(
        help="MiB above idle a GPU may show and still be clean.")] = DEFAULT_IDLE_TOLERANCE_MIB,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Warnings (shm leftovers, open device files) make the host DIRTY.")
    ] = False,
    accept_new_host_key: Annotated[bool, typer.Option(
        "--accept-new-host-key", help="Trust and record unknown SSH host keys (changed keys are "
        "always refused).")] = False,
    json_out: Annotated[bool, typer.Option(
        "--json", help="Print one JSON document on stdout and nothing else.")] = False,
) -> None:
    """Probe the host(s) and print CLEAN, DIRTY or UNKNOWN (exit 0, 1 or 3)."""
    if accept_new_host_key:
        set_accept_new_host_keys(True)
    if gpu_backend != "auto" and gpu_backend not in backend_names():
        raise InputError(f"unknown GPU backend {gpu_backend!r}", where="--gpu-backend",
                         hint="choose one of auto, " + ", ".join(backend_names()))
    for name, value in (("--deadline", deadline), ("--interval", interval),
                        ("--timeout", timeout)):
        if value <= 0:
            raise InputError(f"must be positive, got {value:g}", where=name)
    gpu_list = parse_int_list(gpus, option="--gpus")
    loaded = Baseline.load(baseline) if baseline else None
    for name in engine or ():
        get_signature(name)  # unknown engine: an input error naming the known ones
    scope = Scope(
        engines=tuple(engine) if engine else None,
        gpus=frozenset(gpu_list) if gpu_list is not None else None,
        exclude_roots=frozenset({os.getpid()}),
        idle_tolerance_mib=tolerance_mib,
        strict=strict,
    )
    options = CheckOptions(scope=scope, ports=tuple(port or ()), gpu_backend=gpu_backend,
                           timeout=timeout, baseline=loaded)
    executors = [executor_for(h) for h in host] if host else [executor_for(None)]

    if save_baseline is not None:
        if len(executors) != 1:
            raise InputError("a baseline describes one host", where="--save-baseline",
                             hint="save one baseline per host")
        verdict, snapshot = asyncio.run(check_host(executors[0], options))
        Baseline.from_snapshot(snapshot).save(save_baseline)
        if not json_out:
            console_err.print(f"baseline of {snapshot.host} saved to {save_baseline}")
            if verdict.verdict != Verdict.CLEAN:
                console_err.print("[yellow]warning:[/] the host was not clean when the baseline "
                                  "was taken; memory in use now will count as idle later")
    if until_clean:
        report = asyncio.run(_until_clean(executors, options, deadline_s=deadline,
                                          interval_s=interval))
    else:
        report = asyncio.run(check_hosts(executors, options))

    if json_out:
        typer.echo(report.model_dump_json(exclude_none=False))
    else:
        render_report(report)
    raise typer.Exit(report.exit_code)


def render_report(report: CheckReport) -> None:
    """Print GPU and finding tables per host, ending with one explicit verdict line."""
    for host in report.hosts:
        _render_host(host, show_name=len(report.hosts) > 1)
    line = report.verdict.value.upper()
    if report.until_clean is not None:
        uc = report.until_clean
        if uc.clean_after_s is not None:
            line += f" after {uc.clean_after_s:.2f} s ({uc.attempts} probes)"
        else:
            line += f" at the {uc.deadline_s:g} s deadline ({uc.attempts} probes)"
    console.print(line, style=_VERDICT_STYLE[report.verdict])


def _render_host(host: HostVerdict, *, show_name: bool) -> None:
    title = f"{host.host}: " if show_name else ""
    if host.gpus:
        table = Table(title=f"{title}GPUs ({host.gpu_backend})", title_justify="left")
        for column in ("GPU", "name", "used MiB", "total MiB", "processes (PID: MiB)"):
            table.add_column(column)
        for gpu in host.gpus:
            procs = ", ".join(
                f"{p.pid}: {p.used_mib if p.used_mib is not None else '?'}"
                for p in gpu.processes
            )
            table.add_row(str(gpu.index), gpu.name or "?",
                          _num(gpu.memory_used_mib), _num(gpu.memory_total_mib), procs or "-")
        console.print(table)
    elif show_name or host.gpu_backend != "none":
        console.print(f"{title}no GPUs read (backend {host.gpu_backend})")
    problems = host.problems
    if problems:
        table = Table(title=f"{title}findings", title_justify="left")
        table.add_column("severity")
        table.add_column("kind")
        table.add_column("detail", overflow="fold")
        shown: dict[tuple[str, str], int] = {}
        for finding in problems:
            key = (finding.kind.value, finding.severity.value)
            shown[key] = shown.get(key, 0) + 1
            if shown[key] > _MAX_ROWS_PER_KIND:
                continue
            table.add_row(f"[{_SEVERITY_STYLE[finding.severity]}]{finding.severity.value}[/]",
                          finding.kind.value, escape(finding.message))
        for (kind, severity), count in shown.items():
            if count > _MAX_ROWS_PER_KIND:
                table.add_row(f"[{_SEVERITY_STYLE[Severity(severity)]}]{severity}[/]", kind,
                              f"... and {count - _MAX_ROWS_PER_KIND} more (all in --json)")
        console.print(table)
    if show_name:
        console.print(f"{host.host}: {host.verdict.value.upper()}",
                      style=_VERDICT_STYLE[host.verdict])


def _num(value: int | None) -> str:
    return "[N/A]" if value is None else str(value)


__all__ = ["EXIT_INPUT", "check", "render_report"]
