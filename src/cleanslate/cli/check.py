"""``cleanslate check``: is this host a clean slate? (``docs/check.md``)"""

from __future__ import annotations

import asyncio
import math
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from cleanslate.cli._common import check_writable, parse_gpus
from cleanslate.cli._options import (
    GpuBackendOption,
    JsonOption,
    SettleOption,
    check_settle,
    named_host,
    store_option,
)
from cleanslate.engines.signatures import require_signature
from cleanslate.errors import InputError
from cleanslate.hosts import executor_for
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.check import (
    DEFAULT_SETTLE_S,
    CheckOptions,
    check_host,
    check_hosts,
)
from cleanslate.verdict.check import check_until_clean as _until_clean
from cleanslate.verdict.findings import Verdict
from cleanslate.verdict.ports import implicit_ports
from cleanslate.verdict.rules import (
    DEFAULT_IDLE_TOLERANCE_MIB,
    SHM_MIN_FREE_BYTES,
    SHM_MIN_FREE_FRACTION,
    Scope,
)

T = TypeVar("T")


def check(
    host: Annotated[list[str] | None, typer.Option(
        "--host", callback=named_host,
        help="Host to check (repeatable); default: this machine.")] = None,
    gpus: Annotated[str | None, typer.Option(
        help="GPU indices in scope, e.g. 0,1 (default: all).")] = None,
    port: Annotated[list[int] | None, typer.Option(
        "--port", help="Port that must be free (repeatable), besides the engines' default "
        "ports and the ports of the runs recorded in the store.")] = None,
    default_ports: Annotated[bool, typer.Option(
        "--default-ports/--no-default-ports", help="Also require the default ports of the "
        "engines in scope (8000, 8080, 30000 ...) and the ports of the runs recorded for the "
        "host to be free.")] = True,
    store: Annotated[str | None, store_option(
        help="Store whose recorded runs' ports are checked (default: "
        "$CLEANSLATE_STORE or ./cleanslate.db, when it exists; never created by check).")
    ] = None,
    engine: Annotated[list[str] | None, typer.Option(
        "--engine", help="Only these engines' processes count as strays (repeatable).")] = None,
    gpu_backend: GpuBackendOption = "auto",
    baseline: Annotated[Path | None, typer.Option(
        help="Compare with an idle-state baseline saved by --save-baseline: listeners new "
        "since then (any port) are errors, processes new since then warnings.")] = None,
    save_baseline: Annotated[Path | None, typer.Option(
        help="Save this reading as the idle-state baseline.")] = None,
    until_clean: Annotated[bool, typer.Option(
        "--until-clean", help="Re-probe until clean (held for --settle seconds) or the "
        "deadline.")] = False,
    deadline: Annotated[float, typer.Option(
        help="Seconds --until-clean keeps trying.")] = 60.0,
    interval: Annotated[float, typer.Option(
        help="Seconds between probes with --until-clean.")] = 0.5,
    settle: SettleOption = DEFAULT_SETTLE_S,
    timeout: Annotated[float, typer.Option(
        help="Seconds each probe source may take before it counts as unknown.")] = 10.0,
    tolerance_mib: Annotated[int, typer.Option(
        help="MiB above idle a GPU may show and still be clean.")] = DEFAULT_IDLE_TOLERANCE_MIB,
    shm_min_free_mib: Annotated[int, typer.Option(
        help="MiB /dev/shm must keep free (at most half its size; at least "
        "--shm-min-free-percent of it); less is DIRTY.")] = SHM_MIN_FREE_BYTES >> 20,
    shm_min_free_percent: Annotated[float, typer.Option(
        help="Percent of its size /dev/shm must keep free (0-50).")
    ] = SHM_MIN_FREE_FRACTION * 100,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Warnings (shm leftovers, open device files, new processes) make the "
        "host DIRTY, and what could not be read (other users' environments) UNKNOWN.")
    ] = False,
    accept_new_host_key: Annotated[bool, typer.Option(
        "--accept-new-host-key", help="Trust and record unknown SSH host keys (changed keys are "
        "always refused).")] = False,
    json_out: JsonOption = False,
) -> None:
    """Probe the host(s) and print CLEAN, DIRTY or UNKNOWN (exit 0, 1 or 3)."""
    accept_new = True if accept_new_host_key else None  # else the URL's or the environment's
    for name, value in (("--deadline", deadline), ("--interval", interval),
                        ("--timeout", timeout)):
        if not math.isfinite(value) or value <= 0:
            raise InputError(f"must be a positive number of seconds, got {value:g}", where=name)
    if not math.isfinite(settle) or settle < 0:
        raise InputError(f"must be zero or a positive number of seconds, got {settle:g}",
                         where="--settle")
    if until_clean:
        check_settle(settle, deadline)
    if tolerance_mib < 0:
        raise InputError(f"must be zero or more, got {tolerance_mib}", where="--tolerance-mib")
    if shm_min_free_mib < 0:
        raise InputError(f"must be zero or more, got {shm_min_free_mib}",
                         where="--shm-min-free-mib")
    if not (math.isfinite(shm_min_free_percent) and 0 <= shm_min_free_percent <= 50):
        raise InputError(f"must be 0-50, got {shm_min_free_percent:g}",
                         where="--shm-min-free-percent",
                         hint="the probe reads what fills /dev/shm from half full on")
    for value in port or ():
        if not 1 <= value <= 65535:
            raise InputError(f"port {value} is out of range", where="--port",
                             hint="a TCP port is 1-65535")
    gpu_list = parse_gpus(gpus)
    if save_baseline is not None:
        check_writable(save_baseline, option="--save-baseline")
    loaded = Baseline.load(baseline) if baseline else None
    for name in engine or ():
        require_signature(name)  # unknown engine: an input error naming the known ones
    executors = ([executor_for(h, accept_new_host_keys=accept_new) for h in host] if host
                 else [executor_for(None)])
    names = [e.name for e in executors]
    reasons = implicit_ports(engine, _recorded_runs(store, names, engine)) if default_ports \
        else {}
    explicit = sorted(set(port or ()))
    scope = Scope(
        engines=tuple(engine) if engine else None,
        gpus=frozenset(gpu_list) if gpu_list is not None else None,
        exclude_roots=frozenset({os.getpid()}),
        idle_tolerance_mib=tolerance_mib,
        shm_min_free_bytes=shm_min_free_mib << 20,
        shm_min_free_fraction=shm_min_free_percent / 100,
        strict=strict,
        port_reasons=tuple(sorted((p, r) for p, r in reasons.items() if p not in explicit)),
    )
    options = CheckOptions(scope=scope, ports=tuple(sorted({*explicit, *reasons})),
                           gpu_backend=gpu_backend, timeout=timeout, baseline=loaded)

    if save_baseline is not None:
        if len(executors) != 1:
            raise InputError("a baseline describes one host", where="--save-baseline",
                             hint="save one baseline per host")
        saving = CheckOptions(scope=scope, ports=options.ports, gpu_backend=gpu_backend,
                              timeout=timeout, listeners=True)
        verdict, snapshot = _run_quietly(check_host(executors[0], saving))
        Baseline.from_snapshot(snapshot).save(save_baseline, where="--save-baseline")
        if not json_out:
            from rich.text import Text

            from cleanslate.cli._common import console_err

            console_err.print(Text(f"baseline of {snapshot.host} saved to {save_baseline}"))
            if snapshot.listeners is None:
                console_err.print("[yellow]warning:[/] the listening sockets could not be read: "
                                  "the baseline cannot tell new listeners later")
            if verdict.verdict != Verdict.CLEAN:
                console_err.print("[yellow]warning:[/] the host was not clean when the baseline "
                                  "was taken; memory in use now will count as idle later")
    if until_clean:
        report = asyncio.run(_until_clean(executors, options, deadline_s=deadline,
                                          interval_s=interval, settle_s=settle))
    else:
        report = asyncio.run(check_hosts(executors, options))

    if json_out:
        typer.echo(report.model_dump_json(exclude_none=False))
    else:
        from cleanslate.cli._render import render_report  # rich's tables: not for --json

        render_report(report)
    raise typer.Exit(report.exit_code)


def _run_quietly(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` without its main task's result: Python 3.11's ``asyncio.run``
    formats the repr of that task, result included, twice, around its SIGINT handler (for a
    snapshot: 10-20 ms per thousand processes on a 2-core machine)."""
    out: list[T] = []

    async def main() -> None:
        out.append(await coro)

    asyncio.run(main())
    return out[0]


def _recorded_runs(store_url: str | None, hosts: list[str],
                   engines: list[str] | None) -> list[tuple[int, str]]:
    """(port, run id) of the runs recorded for ``hosts``, oldest first. The store is read only
    when it exists: ``check`` never creates one. A ``--store`` that does not exist or cannot be
    read, and a ``$CLEANSLATE_STORE`` that cannot be read, are input errors; the default
    ``./cleanslate.db`` (or a ``$CLEANSLATE_STORE`` SQLite file) that does not exist is no
    store at all. A store that another user owns or could replace is refused when it was named
    (``--store``, ``$CLEANSLATE_STORE``: exit 2, by :class:`~cleanslate.store.Store`), and the
    default ``./cleanslate.db`` is then ignored with a warning on stderr: the check goes on
    without its recorded ports, none of its records is acted on."""
    if store_url is None:
        # Without importing the database stack (a quarter of a second) when there is no store.
        named = os.environ.get("CLEANSLATE_STORE")
        url = named or "cleanslate.db"
        if "://" not in url:
            url = "sqlite:///" + url
        if url.startswith("sqlite:///"):
            database = url.removeprefix("sqlite:///").split("?", 1)[0]
            if not database or database == ":memory:" or not Path(database).exists():
                return []
            if not named:
                from cleanslate.hosts.files import untrusted

                problem = untrusted(database)
                if problem is not None:
                    print(f"warning: ignoring the store {Path(database).absolute()}: "
                          f"{problem}; its recorded runs' ports are not checked (pass --store "
                          "or set $CLEANSLATE_STORE for your own store)", file=sys.stderr)
                    return []
    from cleanslate.store import Store

    runs = Store(store_url, create=False).runs()
    wanted = set(hosts)
    return [(r.port, r.id) for r in runs
            if r.host in wanted and (not engines or r.engine in engines)]


__all__ = ["check"]
