"""``bench --run ID``: benchmark a run that ``serve`` recorded, without typing it again.

From the run record (the store of ``--store``, as ``stop`` and ``serve`` open it): where the
server answers (its URL; through the SSH forward for a run on another host, as a study's
trial reaches it), the model it serves, its engine (the metric names read, the configuration
in effect, the advice a verdict names), the endpoint it serves and the request form it
accepts (``ignore_eos`` only where the engine's adapter says it does: ``transformers serve``
answers HTTP 422), and its tokenizer when the model is a folder on this machine. An option
given on the command line wins over the record's.

Refused, exit 2, nothing sent: ``--run`` with ``--url``; an id the store does not hold (with the
ids closest to it); a run that is not ``ready`` (its state, when and why); a ``ready`` run whose
server has exited since (its supervisor recorded the exit: when, the status and the cause).

While the bench runs, :func:`crash_check` watches the run after each level: a level during
which its server ended (an exit status recorded, or the connections lost) is the crash, its
cause read from the run's log with the engine's crash patterns (``source: "log"``), else from
its exit status, else from what the connections showed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cleanslate.cli._run_state import ServerExit, clock, engine_adapter, server_exit
from cleanslate.errors import InputError
from cleanslate.redact import redact_text

if TYPE_CHECKING:
    from cleanslate.bench import ConfigReader, CrashCheck, LevelCrash, LevelResult, ServerConfig
    from cleanslate.cli.bench import BenchOptions, SearchOptions
    from cleanslate.hosts import Executor
    from cleanslate.store import RunRecord, Store

#: Seconds a crash check waits for the supervisor to record the exit status of a server whose
#: connections were lost (it records it within a second of the exit).
EXIT_STATUS_WAIT_S = 3.0
#: Close ids named for an unknown one.
CLOSE_IDS = 5

#: The options a run record fills in when they are not given on the command line.
FROM_RECORD = ("model", "endpoint", "ignore_eos", "tokenizer", "engine")


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedRun:
    """The run a bench measures: its record, the host it runs on, and the store's artifacts
    folder where its state and log are read (``None`` for another host's run)."""

    record: RunRecord
    executor: Executor
    artifacts: Path | None


def open_run(run_id: str, store_url: str | None) -> tuple[Store, RunRecord]:
    """The store and the run ``run_id`` (a unique prefix of an id is taken too). An unknown id
    is an input error naming the closest ids; errors never show a store URL's password."""
    from cleanslate.store import Store

    try:
        store = Store(store_url, create=False)
        return store, store.get_run(run_id)
    except InputError as exc:
        if not exc.message.startswith("no run "):
            raise InputError(redact_text(exc.message), where=exc.where or "--store",
                             hint=redact_text(exc.hint) if exc.hint else None) from None
        store = Store(store_url, create=False)
    ids = [r.id for r in store.runs()]
    prefixed = [i for i in ids if i.startswith(run_id)]
    if len(prefixed) == 1 and run_id:
        return store, store.get_run(prefixed[0])
    close = prefixed or difflib.get_close_matches(run_id, ids, n=CLOSE_IDS, cutoff=0.5) \
        or ids[-CLOSE_IDS:][::-1]
    raise InputError(
        f"no run {run_id!r} in {redact_text(store.display_url)}", where="--run",
        hint=("closest ids: " + ", ".join(close[:CLOSE_IDS])) if close else
        "no runs are recorded in this store; pass --store if it is another one")


def _refusal(run: RunRecord, exited_at: float | None = None) -> str:
    """``run r-... is crashed (python_exception, 12:03:10): AttributeError: ...``: the time
    its server exited when its supervisor recorded it, else when the run was closed (or, for
    a run still starting, started)."""
    when = exited_at or (run.stopped_at if not run.status.running else run.started_at)
    why = ", ".join(x for x in (run.cause, clock(when)) if x)
    detail = f": {run.detail}" if run.detail else ""
    return f"run {run.id} is {run.status.value} ({why}){detail}"


def refuse_not_ready(record: RunRecord, exited_at: float | None = None) -> None:
    """Refuse a run that is not ``ready`` in the store: its state, when (``exited_at``: when
    its server exited, as its supervisor recorded) and why (an input error, exit 2: nothing
    is sent)."""
    if record.status != "ready":
        hint = ("wait until `serve` says it is ready, then run again" if record.status.running
                else "serve it again (`cleanslate serve ... --detach`) and bench the new run")
        raise InputError(_refusal(record, exited_at), where="--run", hint=hint)


async def check_serving(run: RecordedRun) -> None:
    """Refuse a ``ready`` run whose supervisor recorded that its server exited since: when,
    its status and its cause (an input error, exit 2: nothing is sent)."""
    ended = await server_exit(run.executor, run.record, run.artifacts)
    if ended is not None:
        raise InputError(f"run {run.record.id} is recorded ready, but its server has exited: "
                         f"{ended.describe()}", where="--run",
                         hint=f"`cleanslate stop {run.record.id}` cleans up after it; serve it "
                         "again to bench it")


def served_model(record: RunRecord) -> str:
    """The name the server answers to: its ``--served-model-name`` when it was launched with
    one, else the model it was launched with."""
    for key in ("served_model_name", "served-model-name"):
        value = record.flags.get(key)
        if isinstance(value, str) and value:
            return value
    return record.model


def _tokenizer_dir(record: RunRecord) -> str | None:
    """The model's folder when it is on this machine and holds a tokenizer (exact token
    counts), else ``None`` (counted as the server reports them)."""
    if record.host != "local":
        return None
    folder = Path(record.model)
    try:
        if folder.is_dir() and any((folder / name).is_file() for name in
                                   ("tokenizer.json", "tokenizer_config.json")):
            return str(folder)
    except OSError:
        return None
    return None


def options_from_record(opts: BenchOptions, record: RunRecord,
                        given: Callable[[str], bool]) -> BenchOptions:
    """``opts`` with what the record knows filled in where the option was not given on the
    command line (``given(name)``): the URL (the record's; the forward's replaces it when the
    levels run), the served model, the engine, an endpoint the engine serves (chat where it
    serves no completions), ``--no-ignore-eos`` where the engine does not accept
    ``ignore_eos``, and the tokenizer of a model folder on this machine."""
    from cleanslate.engines import engine_class

    try:
        adapter_cls = engine_class(record.engine)
    except InputError:
        adapter_cls = None
    found: dict[str, object] = {
        "model": served_model(record),
        "engine": record.engine if adapter_cls is not None else None,
        "tokenizer": _tokenizer_dir(record),
    }
    if adapter_cls is not None:
        if not adapter_cls.supports_completions and adapter_cls.supports_chat:
            found["endpoint"] = "chat"
        found["ignore_eos"] = bool(adapter_cls.accepts_ignore_eos)
    update = {k: v for k, v in found.items() if k in FROM_RECORD and not given(k)
              and v is not None}
    return dataclasses.replace(opts, url=record.url, **update)  # type: ignore[arg-type]


def crash_check(run: RecordedRun) -> CrashCheck:
    """The crash check of a level against the run (:data:`cleanslate.bench.CrashCheck`): when
    the supervisor recorded an exit, or the level lost its connections (waiting up to
    :data:`EXIT_STATUS_WAIT_S` for the exit status), the crash with its cause from the run's
    log (``source: "log"``), else from the exit status, else the connections' own."""
    from cleanslate.bench import LevelCrash, connection_crash
    from cleanslate.launch import run_exit_code
    from cleanslate.launch.lifecycle import describe_exit
    from cleanslate.launch.ready import classify_run_log

    record, executor, artifacts = run.record, run.executor, run.artifacts
    adapter = engine_adapter(record.engine)

    async def check(level: LevelResult) -> LevelCrash | None:
        code = await run_exit_code(executor, record, artifacts=artifacts)
        lost = connection_crash(level, served=True)
        if code is None and lost is None:
            return None
        deadline = time.monotonic() + EXIT_STATUS_WAIT_S
        while code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            code = await run_exit_code(executor, record, artifacts=artifacts)
        found = None if adapter is None else await classify_run_log(
            executor, adapter, record, returncode=code, artifacts=artifacts)
        if found is not None:
            return LevelCrash(label=level.label, cause=found[0], line=found[1], source="log")
        if code is not None:
            cause, line = describe_exit(code)
            return LevelCrash(label=level.label, cause=cause, line=line, source="exit_status")
        return lost

    return check


def recorded_config(run: RecordedRun) -> ConfigReader | None:
    """The configuration the run's engine said it runs with, read once it was ready (with the
    flags asked), as a reader that asks the server nothing (a study's trial does the same);
    ``None`` when the record holds none, or one that could not be read (the bench reads it as
    ``--engine`` would)."""
    recorded = run.record.server_config
    if recorded is None or recorded.unreadable:
        return None

    async def read(_session: object, _url: str) -> ServerConfig:
        return recorded

    return read


@asynccontextmanager
async def reach(run: RecordedRun) -> AsyncIterator[str]:
    """The base URL where this machine reaches the run's port: its own loopback for a run
    here, the private end of an SSH forward for a run on another host (only this process can
    use it: :mod:`cleanslate.hosts.forward`)."""
    async with run.executor.forward_port(run.record.port) as base_url:
        yield base_url


def recorded_run(run_id: str, store_url: str | None) -> RecordedRun:
    """The run of ``--run`` (:func:`open_run`), refused unless it is ``ready`` in the store
    (:func:`refuse_not_ready`); whether its server still runs is read when the bench starts
    (:func:`check_serving`)."""
    from cleanslate.hosts import executor_for

    store, record = open_run(run_id, store_url)
    executor = executor_for(None if record.host == "local" else record.host)
    run = RecordedRun(record=record, executor=executor,
                      artifacts=store.artifacts_root if executor.is_local else None)
    if record.status != "ready":
        ended = asyncio.run(_exit_of(run)) if record.status == "crashed" else None
        refuse_not_ready(record, ended.exited_at if ended is not None else None)
    return run


async def _exit_of(run: RecordedRun) -> ServerExit | None:
    """:func:`server_exit` of a run that is closed, the executor closed after it."""
    try:
        return await server_exit(run.executor, run.record, run.artifacts)
    finally:
        await run.executor.close()


def search_of_run(search: SearchOptions, run: RecordedRun) -> SearchOptions:
    """``--find-max`` against a recorded run of this machine: refused (exit 2) when its server
    has exited; its crash classified from the run's log with its engine's crash patterns unless
    ``--server-log`` names another. A run on another host is refused: the search does not
    reach a forward yet."""
    if run.record.host != "local":
        raise InputError(f"--find-max against run {run.record.id} on {run.record.host}: the "
                         "capacity search reaches runs of this machine only", where="--run",
                         hint="bench its levels with --run ID --concurrency ..., or run the "
                         "search on that host")
    asyncio.run(check_serving(run))
    log = Path(run.record.log_path)
    if search.server_log is None and log.is_file():
        search = dataclasses.replace(search, server_log=log)
    if search.engine is None:
        search = dataclasses.replace(search, engine=run.record.engine)
    return search


def crash_lines(levels: tuple[LevelResult, ...]) -> list[str]:
    """``the server crashed at c=16: python_exception: ... (from the run's log)``, one per
    level that carries a crash."""
    where = {"log": "from the run's log", "exit_status": "from its exit status",
             "connections": "from what the connections showed"}
    return [f"{lv.crash.describe()} ({where[lv.crash.source]})" for lv in levels
            if lv.crash is not None]


__all__ = ["FROM_RECORD", "RecordedRun", "check_serving", "crash_check", "crash_lines",
           "open_run", "options_from_record", "reach", "recorded_config", "recorded_run",
           "refuse_not_ready", "search_of_run", "served_model"]
