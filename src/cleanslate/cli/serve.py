"""``cleanslate serve``: a verified launch of one server, detached or in the foreground.

Options -> a :class:`~cleanslate.launch.config.ServeConfig` -> one library call:
:func:`~cleanslate.launch.lifecycle.start_server` (``--detach``) or
:func:`~cleanslate.launch.foreground.serve_in_foreground` -> rendering.

Text from outside (command lines, process names, log tails, failure details) is printed as
text, never as rich markup; secrets are redacted in everything printed (the record and the
log tails are redacted already).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from cleanslate.cli._common import console, console_err, parse_gpus, progress_printer
from cleanslate.cli._options import GpuBackendOption, JsonOption, StoreOption, named_host
from cleanslate.cli._render import print_teardown, render_report
from cleanslate.errors import ExitCode, InputError
from cleanslate.hosts import executor_for

if TYPE_CHECKING:  # the launch stack (aiohttp, SQLAlchemy) is imported when a command runs
    from cleanslate.launch.config import ServeConfig
    from cleanslate.launch.foreground import ForegroundEnd
    from cleanslate.launch.lifecycle import StartOutcome
    from cleanslate.store import RunRecord


def parse_engine_args(args: list[str]) -> dict[str, Any]:
    """``--tp-size 2 --disable-cuda-graph --x a b -c 8192`` -> ``{tp-size: "2",
    disable-cuda-graph: True, x: ["a", "b"], -c: "8192"}``: the flags after ``--`` in the
    engine's own spelling.

    A long option (``--name``) becomes the key ``name``; a short option (``-c``, llama.cpp's
    ``-np``) keeps its dash, so it reaches the engine exactly as written. A token that starts
    with a dash and then a digit or a dot (``-1``, ``-0.5``) is a value, as in argparse.
    """
    flags: dict[str, Any] = {}
    key: str | None = None
    for token in args:
        if _is_option(token):
            name, eq, value = token.partition("=")
            key = name[2:] if name.startswith("--") else name
            flags[key] = value if eq else True
            if eq:
                key = None
        elif key is None:
            raise InputError(f"unexpected engine argument {token!r}", where="-- ...",
                             hint="write engine flags as --name value, --name or -n value")
        else:
            current = flags[key]
            if current is True:
                flags[key] = token
            elif isinstance(current, list):
                current.append(token)
            else:
                flags[key] = [current, token]
    return flags


def _override_flags(base: dict[str, Any], extra: dict[str, Any],
                    engine: str) -> dict[str, Any]:
    """The file's flags with those after ``--`` on top; a flag given in both, however each
    spells it (``c:`` in YAML, ``-c`` on the command line), is the command line's alone."""
    from cleanslate.engines import engine_class, option_name

    try:
        short = engine_class(engine).short_options
    except InputError:
        short = frozenset()
    given = {option_name(key, short) for key in extra}
    kept = {key: value for key, value in base.items() if option_name(key, short) not in given}
    return {**kept, **extra}


def _is_option(token: str) -> bool:
    """``--name`` or ``-n``/``-np``; not ``-``, ``--``, ``-1`` or ``-.5`` (values)."""
    body = token[2:] if token.startswith("--") else token[1:] if token.startswith("-") else ""
    return bool(body) and not (body[0].isdigit() or body[0] in ".-")


def _config(config_file: Path | None, engine: str | None, model: str | None, host: str | None,
            port: int | None, gpus: str | None, ready_timeout: float | None, smoke: bool,
            extra: list[str], smoke_timeout: float | None = None,
            grace: float | None = None) -> ServeConfig:
    """The server file, overridden by the options; every bound is the model's."""
    from pydantic import ValidationError

    from cleanslate.launch.config import ServeConfig, load_serve_config

    data: dict[str, Any] = {}
    if config_file is not None:
        data = load_serve_config(config_file).model_dump(exclude_unset=True)
    for key, value in (("engine", engine), ("model", model), ("host", host), ("port", port),
                       ("ready_timeout_s", ready_timeout), ("smoke_timeout_s", smoke_timeout),
                       ("grace_s", grace)):
        if value is not None:
            data[key] = value
    gpu_list = parse_gpus(gpus)
    if gpu_list is not None:
        data["gpus"] = gpu_list
    if not smoke:
        data["smoke"] = False
    if extra:
        data["flags"] = _override_flags(data.get("flags") or {}, parse_engine_args(extra),
                                        str(data.get("engine", "")))
    if "engine" not in data or "model" not in data:
        raise InputError("an engine and a model are needed",
                         hint="give a config file, or --engine E --model M")
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_validation(
            exc, where=str(config_file) if config_file else "options") from None


def serve(
    ctx: typer.Context,
    config_file: Annotated[Path | None, typer.Argument(
        help="Server file (YAML): engine, model, port, gpus, flags, env.")] = None,
    engine: Annotated[str | None, typer.Option(help="sglang, vllm, trtllm, transformers, "
                                                    "llamacpp, command or sim.")] = None,
    model: Annotated[str | None, typer.Option(help="Model path or name.")] = None,
    host: Annotated[str | None, typer.Option(
        callback=named_host, help="Host (default: this machine).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: the engine's).")] = None,
    gpus: Annotated[str | None, typer.Option(help="GPUs the run needs, e.g. 0,1.")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Leave it running, recorded.")] = False,
    store_url: StoreOption = None,
    ready_timeout: Annotated[float | None, typer.Option(help="Seconds to become ready.")] = None,
    smoke: Annotated[bool, typer.Option(help="Smoke-test after ready.")] = True,
    smoke_timeout: Annotated[float | None, typer.Option(
        help="Seconds per smoke request.")] = None,
    grace: Annotated[float | None, typer.Option(
        help="Seconds between SIGTERM and SIGKILL at teardown.")] = None,
    gpu_backend: GpuBackendOption = "auto",
    no_preflight: Annotated[bool, typer.Option(
        "--no-preflight", help="Launch even if the host is not clean (not recommended).")
    ] = False,
    json_out: JsonOption = False,
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
    from cleanslate.store import Store

    config = _config(config_file, engine, model, host, port, gpus, ready_timeout, smoke, extra,
                     smoke_timeout, grace)
    store = Store(store_url)
    executor = executor_for(config.host)
    say = progress_printer(quiet=json_out)
    if detach:
        from cleanslate.launch.lifecycle import start_server

        outcome = asyncio.run(start_server(executor, store, config, gpu_backend=gpu_backend,
                                           preflight=not no_preflight, progress=say,
                                           snapshot=True))
        if not outcome.ok:
            _report_failure(outcome, json_out)
            raise typer.Exit(ExitCode.FAILED)
        assert outcome.run is not None
        _report_started(outcome.run, outcome, json_out)
        raise typer.Exit(ExitCode.OK)
    from cleanslate.launch.foreground import serve_in_foreground

    def ready(run: RunRecord, outcome: StartOutcome) -> None:
        if json_out:
            # The one JSON document comes at the end; until then a line on stderr says where.
            console_err.print(Text(f"READY run {run.id} pid {run.pid} url {run.url}; serving "
                                   "until Ctrl-C or SIGTERM"), soft_wrap=True)
            return
        _report_started(run, outcome, json_out)
        console.print("[dim]serving in the foreground; Ctrl-C tears it down[/]")

    result = serve_in_foreground(executor, store, config, gpu_backend=gpu_backend,
                                 preflight=not no_preflight, progress=say, on_ready=ready,
                                 snapshot=True)
    if result.end is None:
        _report_failure(result.start, json_out)
    else:
        _report_ended(result.end, result.start, json_out)
    raise typer.Exit(result.exit_code)


def _report_started(run: RunRecord, outcome: StartOutcome, json_out: bool) -> None:
    if json_out:
        from cleanslate.cli._documents import ServeStarted, emit

        emit(ServeStarted.of(run, outcome))
        return
    console.print(Text.assemble(("READY", "bold green"), " run ", (run.id, "bold"), " on ",
                                run.host))
    console.print(_line("url", run.url if run.host == "local" else
                        f"{run.url} on {run.host} (ssh -L {run.port}:127.0.0.1:{run.port} "
                        "reaches it from here)"))
    console.print(_line("command", " ".join(run.argv)))
    console.print(_line("pid", f"{run.pid} (process group {run.pgid}, supervisor "
                               f"{run.supervisor_pid}, user {run.user or '?'})"))
    console.print(_line("cgroup", run.cgroup or f"none ({outcome.cgroup_note or 'unknown'})"))
    console.print(_line("log", run.log_path))
    if outcome.host_snapshot is not None:
        console.print(_line("host", outcome.host_snapshot.summary()))
    if outcome.validation_note:
        console.print(_line("flags", f"not validated: {outcome.validation_note}"))
    for line in run.server_config.report() if run.server_config is not None else ():
        console.print(_line("config", line))  # the engine's words, as text
    console.print(_line("stop it", f"cleanslate stop {run.id}"))


def _line(label: str, value: object) -> Text:
    return Text.assemble(f"  {label:<8} ", str(value))


def _report_failure(outcome: StartOutcome, json_out: bool) -> None:
    if json_out:
        from cleanslate.cli._documents import emit, serve_failure

        emit(serve_failure(outcome))
        return
    if outcome.refused is not None:
        console_err.print("[bold red]refusing to launch:[/] the host is not clean for the "
                          "GPUs and port this server needs")
        render_report(outcome.refused)
        return
    console.print(Text.assemble(("FAILED", "bold red"), f" ({outcome.cause}): ",
                                str(outcome.detail)))
    if outcome.log_tail:
        console.print("[dim]--- log tail ---[/]")
        console.print(Text(outcome.log_tail.rstrip()[-3000:]))
        console.print("[dim]---[/]")
    if outcome.teardown is not None:
        print_teardown(outcome.teardown)


def _report_ended(end: ForegroundEnd, start: StartOutcome, json_out: bool) -> None:
    if json_out:
        from cleanslate.cli._documents import ServeEnded, ServeStarted, emit

        emit(ServeEnded(run_id=end.run.id, status=end.status, cause=end.cause,
                        detail=end.detail, started=ServeStarted.of(end.run, start),
                        teardown=end.teardown))
        return
    if end.cause:
        console.print(Text(f"{end.status.upper()} ({end.cause}): {end.detail or ''}",
                           style="bold red"))
    print_teardown(end.teardown)


__all__ = ["parse_engine_args", "serve"]
