"""``cleanslate serve`` and ``cleanslate stop``: verified launch and teardown of one server.

Text from outside (command lines, process names, log tails, failure details) is printed as
text, never as rich markup; secrets are redacted in everything printed (the record and the
log tails are redacted already; URLs go through :func:`cleanslate.redact.redact_url`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from cleanslate.cli import app
from cleanslate.cli._common import EXIT_FAILED, console, console_err, parse_int_list
from cleanslate.cli.check import render_report
from cleanslate.errors import InputError
from cleanslate.hosts import executor_for
from cleanslate.redact import redact_text

if TYPE_CHECKING:  # the launch stack (aiohttp, SQLAlchemy) is imported when a command runs
    from cleanslate.launch.config import ServeConfig
    from cleanslate.launch.lifecycle import StartOutcome
    from cleanslate.store import RunRecord, Store
    from cleanslate.teardown.teardown import Target, TargetRecord, TeardownReport


def parse_engine_args(args: list[str]) -> dict[str, Any]:
    """``--tp-size 2 --disable-cuda-graph --x a b`` -> ``{tp-size: "2", disable-cuda-graph:
    True, x: ["a", "b"]}``: the flags after ``--`` in the engine's own spelling."""
    flags: dict[str, Any] = {}
    key: str | None = None
    for token in args:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            key = name
            flags[key] = value if eq else True
            if eq:
                key = None
        elif key is None:
            raise InputError(f"unexpected engine argument {token!r}", where="-- ...",
                             hint="write engine flags as --name value or --name")
        else:
            current = flags[key]
            if current is True:
                flags[key] = token
            elif isinstance(current, list):
                current.append(token)
            else:
                flags[key] = [current, token]
    return flags


def _config(config_file: Path | None, engine: str | None, model: str | None, host: str | None,
            port: int | None, gpus: str | None, ready_timeout: float | None, smoke: bool,
            extra: list[str], smoke_timeout: float | None = None,
            grace: float | None = None) -> ServeConfig:
    from cleanslate.launch.config import ServeConfig, load_serve_config

    data: dict[str, Any] = {}
    if config_file is not None:
        data = load_serve_config(config_file).model_dump(exclude_unset=True)
    for key, value in (("engine", engine), ("model", model), ("host", host), ("port", port),
                       ("ready_timeout_s", ready_timeout), ("smoke_timeout_s", smoke_timeout),
                       ("grace_s", grace)):
        if value is not None:
            data[key] = value
    gpu_list = parse_int_list(gpus, option="--gpus")
    if gpu_list is not None:
        data["gpus"] = gpu_list
    if not smoke:
        data["smoke"] = False
    if extra:
        data["flags"] = {**data.get("flags", {}), **parse_engine_args(extra)}
    if "engine" not in data or "model" not in data:
        raise InputError("an engine and a model are needed",
                         hint="give a config file, or --engine E --model M")
    from pydantic import ValidationError

    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}",
                         where=str(config_file) if config_file else "options") from None


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    config_file: Annotated[Path | None, typer.Argument(
        help="Server file (YAML): engine, model, port, gpus, flags, env.")] = None,
    engine: Annotated[str | None, typer.Option(help="sglang, vllm, trtllm, transformers, "
                                                    "llamacpp, command or sim.")] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    host: Annotated[str | None, typer.Option(help="Host (default: this machine).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: the engine's).")] = None,
    gpus: Annotated[str | None, typer.Option(help="GPUs the run needs, e.g. 0,1.")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Leave it running, recorded.")] = False,
    store_url: Annotated[str | None, typer.Option("--store", help="Store URL.")] = None,
    ready_timeout: Annotated[float | None, typer.Option(help="Seconds to become ready.")] = None,
    smoke: Annotated[bool, typer.Option(help="Smoke-test after ready.")] = True,
    smoke_timeout: Annotated[float | None, typer.Option(
        help="Seconds per smoke request.")] = None,
    grace: Annotated[float | None, typer.Option(
        help="Seconds between SIGTERM and SIGKILL at teardown.")] = None,
    gpu_backend: Annotated[str, typer.Option(help="GPU backend for the checks.")] = "auto",
    no_preflight: Annotated[bool, typer.Option(
        "--no-preflight", help="Launch even if the host is not clean (not recommended).")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
) -> None:
    """Launch a server on a verified clean host, wait until ready, smoke-test it.

    Engine flags come from the config file or after `--`, spelled as the engine spells them:
    `cleanslate serve --engine sim --model sim --port 8000 --detach -- --tp-size 2`.
    In the foreground it tears the server down on Ctrl-C or SIGTERM.
    """
    extra = list(ctx.args)
    if config_file is not None and str(config_file).startswith("-"):
        # Everything after `--` is positional to click: the first engine flag lands here.
        extra.insert(0, str(config_file))
        config_file = None
    from cleanslate.launch.lifecycle import start_server
    from cleanslate.store import Store

    config = _config(config_file, engine, model, host, port, gpus, ready_timeout, smoke, extra,
                     smoke_timeout, grace)
    store = Store(store_url)
    executor = executor_for(config.host)
    say = (lambda _m: None) if json_out else progress_printer()
    if detach:
        outcome = asyncio.run(start_server(executor, store, config, gpu_backend=gpu_backend,
                                           preflight=not no_preflight, progress=say))
        if not outcome.ok:
            _report_failure(outcome, json_out)
            raise typer.Exit(EXIT_FAILED)
        assert outcome.run is not None
        _report_started(outcome.run, outcome, json_out)
        raise typer.Exit(0)
    # In the foreground a Ctrl-C or SIGTERM from the moment of launch means "tear it down":
    # remember it here, act on it as soon as the server is up (never leave it running).
    interrupted = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: interrupted.set())
    code = asyncio.run(_serve_foreground(executor, store, config, gpu_backend, not no_preflight,
                                         json_out, interrupted, say))
    raise typer.Exit(code)


def progress_printer() -> Any:
    """A progress callback that prints dim lines on stderr, as text."""
    def say(message: str) -> None:
        console_err.print(Text(message, style="dim"))

    return say


async def _serve_foreground(executor: Any, store: Store, config: ServeConfig, gpu_backend: str,
                            preflight: bool, json_out: bool, interrupted: threading.Event,
                            say: Any) -> int:
    """Start, report, serve until Ctrl-C / SIGTERM / a crash, tear down. Whatever happens after
    the server is up (a closed stdout, a store error, a bug), it is torn down and verified."""
    from cleanslate.launch.lifecycle import start_server

    outcome = await start_server(executor, store, config, gpu_backend=gpu_backend,
                                 preflight=preflight, progress=say)
    if not outcome.ok:
        _report_failure(outcome, json_out)
        return EXIT_FAILED
    run = outcome.run
    assert run is not None
    stopped = False
    try:
        _report_started(run, outcome, json_out)
        code = await _foreground(executor, store, run, config.grace_s, gpu_backend, json_out,
                                 interrupted)
        stopped = True
        return code
    finally:
        if not stopped:
            await _stop_if_running(executor, store, run, config.grace_s, gpu_backend, say)


async def _stop_if_running(executor: Any, store: Store, run: RunRecord, grace_s: float,
                           gpu_backend: str, say: Any) -> None:
    """Tear the run down unless its record says it was stopped already (the store unreadable:
    tear down anyway). Never raises: the caller's exception is the one that matters."""
    from cleanslate.launch.lifecycle import stop_server

    with contextlib.suppress(BaseException):
        try:
            running = store.get_run(run.id).status.running
        except Exception:
            running = True
        if running:
            say("tearing the server down")
            await asyncio.shield(stop_server(executor, store, run, grace_s=grace_s,
                                             gpu_backend=gpu_backend, status="failed",
                                             cause="interrupted", progress=say))


def _report_started(run: RunRecord, outcome: StartOutcome, json_out: bool) -> None:
    if json_out:
        typer.echo(json.dumps(_run_doc(run, outcome)))
    else:
        _print_started(run, outcome)


def _run_doc(run: RunRecord, outcome: StartOutcome) -> dict[str, Any]:
    """The ``serve --json`` document (the record's argv is redacted already)."""
    return {
        "run_id": run.id, "url": run.url, "argv": list(run.argv), "pid": run.pid,
        "pgid": run.pgid, "supervisor_pid": run.supervisor_pid, "host": run.host,
        "engine": run.engine, "port": run.port, "log": run.log_path, "status": run.status,
        "user": run.user, "cgroup": run.cgroup, "cgroup_note": outcome.cgroup_note,
        "boot_id": run.boot_id, "machine_id": run.machine_id,
        "verdict_before": run.verdict_before.model_dump(mode="json")
        if run.verdict_before else None,
        "phases": outcome.phases,
        "smoke": outcome.smoke.model_dump(mode="json") if outcome.smoke else None,
        "flag_validation": outcome.validation_note or "checked",
    }


def _line(label: str, value: object) -> Text:
    return Text.assemble(f"  {label:<8} ", str(value))


def _print_started(run: RunRecord, outcome: StartOutcome) -> None:
    console.print(Text.assemble(("READY", "bold green"), " run ", (run.id, "bold"), " on ",
                                run.host))
    console.print(_line("url", run.url))
    console.print(_line("command", " ".join(run.argv)))
    console.print(_line("pid", f"{run.pid} (process group {run.pgid}, supervisor "
                               f"{run.supervisor_pid}, user {run.user or '?'})"))
    console.print(_line("cgroup", run.cgroup or f"none ({outcome.cgroup_note or 'unknown'})"))
    console.print(_line("log", run.log_path))
    if outcome.validation_note:
        console.print(_line("flags", f"not validated: {outcome.validation_note}"))
    console.print(_line("stop it", f"cleanslate stop {run.id}"))


def _report_failure(outcome: StartOutcome, json_out: bool) -> None:
    if outcome.refused is not None:
        if json_out:
            typer.echo(json.dumps({"ok": False, "cause": "host_not_clean",
                                   "verdict_before": outcome.refused.model_dump(mode="json")}))
        else:
            console_err.print("[bold red]refusing to launch:[/] the host is not clean for the "
                              "GPUs and port this server needs")
            render_report(outcome.refused)
        return
    run = outcome.run
    if json_out:
        typer.echo(json.dumps({
            "ok": False, "run_id": run.id if run else None, "cause": outcome.cause,
            "detail": outcome.detail, "log_tail": outcome.log_tail,
            "argv": list(run.argv) if run else None,
            "verdict_after": outcome.teardown.verify.model_dump(mode="json")
            if outcome.teardown and outcome.teardown.verify else None,
        }))
        return
    console.print(Text.assemble(("FAILED", "bold red"), f" ({outcome.cause}): ",
                                str(outcome.detail)))
    if outcome.log_tail:
        console.print("[dim]--- log tail ---[/]")
        console.print(Text(outcome.log_tail.rstrip()[-3000:]))
        console.print("[dim]---[/]")
    if outcome.teardown is not None:
        _print_teardown(outcome.teardown)


async def _foreground(executor: Any, store: Store, run: RunRecord, grace_s: float,
                      gpu_backend: str, json_out: bool, interrupted: threading.Event) -> int:
    from cleanslate.launch.lifecycle import run_exit_code, stop_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if interrupted.is_set():
        stop.set()
    if not json_out:
        console.print("[dim]serving in the foreground; Ctrl-C tears it down[/]")
    status, cause = "stopped", None
    try:
        while not stop.is_set():
            code = await run_exit_code(executor, run)
            if code is not None:
                status, cause = "crashed", f"exited with status {code}"
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    except BaseException:
        status, cause = "failed", "interrupted"
        raise
    finally:
        # Whatever ended the wait, the server goes down and the host is verified.
        report = await asyncio.shield(stop_server(
            executor, store, run, grace_s=grace_s, gpu_backend=gpu_backend, status=status,
            cause=cause))
    if json_out:
        typer.echo(json.dumps({"run_id": run.id, "status": status, "cause": cause,
                               "teardown": report.model_dump(mode="json")}))
    else:
        if cause:
            console.print(Text(f"the server {cause}", style="bold red"))
        _print_teardown(report)
    return EXIT_FAILED if status == "crashed" else report.exit_code


def targets_table(title: str, targets: Iterable[Target | TargetRecord]) -> Table:
    """A table of teardown targets (live or as a report keeps them), every cell printed as
    text."""
    table = Table(title=title, title_justify="left")
    for column in ("PID", "user", "why", "comm", "command"):
        table.add_column(column, overflow="fold")
    for target in targets:
        why = target.why
        if target.protected:
            why = f"{why}; left alone: {target.protected}"
        user = target.user or (str(target.uid) if target.uid is not None else "?")
        table.add_row(Text(str(target.pid)), Text(user), Text(why), Text(target.comm),
                      Text(target.command[:200]))
    return table


def _print_teardown(report: TeardownReport) -> None:
    if report.refused:
        console.print(Text.assemble(("nothing signalled: ", "bold yellow"), report.refused))
    if report.targets:
        console.print(targets_table("teardown", report.targets))
    if report.left_alone:
        console.print(targets_table("left alone (protected)", report.left_alone))
    if report.cgroup:
        state = "removed" if report.cgroup_removed else (
            f"still holds {', '.join(map(str, report.cgroup_left))}" if report.cgroup_left
            else "not removed")
        console.print(Text(f"  cgroup {report.cgroup}: "
                           f"{'cgroup.kill used, ' if report.cgroup_killed else ''}{state}"))
    for rnd in report.rounds:
        console.print(f"  {rnd.at_s:6.2f} s  {rnd.signal} -> {', '.join(map(str, rnd.sent))}")
    if report.root_exit_s is not None:
        console.print(f"  root process exited {report.root_exit_s:.2f} s after SIGTERM")
    if report.killed:
        console.print(f"  escalated to SIGKILL for {', '.join(map(str, report.killed))}")
    if report.d_state:
        console.print(f"[red]  stuck in uninterruptible sleep: {report.d_state}[/]")
    if report.shm_removed:
        console.print(Text(f"  removed /dev/shm/{{{', '.join(report.shm_removed)}}}"))
    if report.verify is not None:
        render_report(report.verify)
    else:
        console.print("not verified")


@app.command()
def stop(
    run_id: Annotated[str, typer.Argument(help="The run id printed by `serve`.")],
    store_url: Annotated[str | None, typer.Option("--store", help="Store URL.")] = None,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = 30.0,
    deadline: Annotated[float, typer.Option(help="Seconds to wait for a clean verdict.")
                        ] = 60.0,
    gpu_backend: Annotated[str, typer.Option(help="GPU backend for verification.")] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")
                        ] = False,
) -> None:
    """Tear down a recorded run and verify the host is clean (same as `clean --run ID`)."""
    raise typer.Exit(stop_run(run_id, store_url, grace, deadline, gpu_backend, json_out))


def stop_run(run_id: str, store_url: str | None, grace: float, deadline: float,
             gpu_backend: str, json_out: bool) -> int:
    """``cleanslate stop`` / ``clean --run``: the exit code. Errors never show a store URL's
    password."""
    from cleanslate.launch.lifecycle import stop_server
    from cleanslate.store import Store

    try:
        store = Store(store_url, create=False)
        run = store.get_run(run_id)
    except InputError as exc:
        raise InputError(redact_text(exc.message), where=exc.where,
                         hint=redact_text(exc.hint) if exc.hint else None) from None
    executor = executor_for(None if run.host == "local" else run.host)
    say = (lambda _m: None) if json_out else progress_printer()
    report = asyncio.run(stop_server(executor, store, run, grace_s=grace, gpu_backend=gpu_backend,
                                     verify_deadline_s=deadline, progress=say))
    if json_out:
        typer.echo(json.dumps({"run_id": run.id, **report.model_dump(mode="json")}))
    else:
        _print_teardown(report)
    if report.refused_code == 2 and not json_out:
        console_err.print(Text.assemble(("refused: ", "bold red"), report.refused or ""))
    return report.exit_code

