"""``cleanslate runs``: the runs and benches of a store, newest first (``docs/bench.md``, "Every
bench is recorded").

A run's state is its record's status, except a run recorded ``ready`` on this machine whose
server has exited since: its supervisor's state says so (``exited``, with the cause classified
from its log, as ``stop`` finds it), or its processes are gone (the supervisor killed, the
machine rebooted). A remote run's ready state is what its record says (no host is contacted).
Nothing is written: the store is opened read-only. Every text from the store is printed as
text, never as markup.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from cleanslate.cli._common import console
from cleanslate.cli._options import JsonOption, StoreOption
from cleanslate.errors import InputError

if TYPE_CHECKING:
    from cleanslate.store import BenchRecord, RunRecord

#: Characters of a run's flags shown in the table (the JSON has them all).
FLAGS_WIDTH = 40
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _positive(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise InputError(f"must be 1 or more, not {value}", where="--limit")
    return value


def runs(
    store_url: StoreOption = None,
    json_out: JsonOption = False,
    limit: Annotated[int | None, typer.Option(
        "--limit", callback=_positive, metavar="N",
        help="Show the N newest runs (and the N newest benches of no run).",
        show_default=False)] = None,
) -> None:
    """List the runs and benches of the store, newest first: each run's state (ready, exited,
    crashed with its cause, stopped, failed), engine, model, flags, URL and when, with its
    benches; the benches of no recorded run apart."""
    from cleanslate.store import Store

    store = Store(store_url, create=False)
    try:
        recorded = list(reversed(store.runs()))[:limit]
        benches = store.benches()
        artifacts = store.artifacts_root
        url = store.display_url
    finally:
        store.close()
    by_run: dict[str, list[BenchRecord]] = {}
    for bench in benches:
        by_run.setdefault(bench.run_id or "", []).append(bench)
    known = {run.id for run in recorded}
    loose = [b for b in benches if b.run_id is None or b.run_id not in known][:limit]
    states = {run.id: run_state(run, artifacts) for run in recorded}
    if json_out:
        document = {"store": url,
                    "runs": [{**_run_document(run, states[run.id]),
                              "benches": [_bench_document(b) for b in by_run.get(run.id, [])]}
                             for run in recorded],
                    "benches": [_bench_document(b) for b in loose]}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        sys.stdout.flush()
        return
    if not recorded and not benches:
        console.print(Text(f"no runs and no benches in {url}"), highlight=False)
        return
    if recorded:
        console.print(_runs_table(recorded, states, by_run))
    if loose:
        console.print(_benches_table(loose))
    console.print(Text(f"{len(recorded)} run(s), {len(benches)} bench(es) in {url}; "
                       "cleanslate report BENCH_ID renders a bench", style="dim"),
                  highlight=False)


def run_state(run: RunRecord, artifacts: Path) -> tuple[str, str | None, str | None]:
    """(state, cause, detail) of a run: its record's status, or ``exited`` for a run recorded
    ``ready`` on this machine whose server is gone (:func:`_exited`)."""
    status = str(run.status)
    if status != "ready" or run.host != "local":
        return status, run.cause, run.detail
    found = _exited(run, artifacts)
    return found if found is not None else (status, run.cause, run.detail)


def _exited(run: RunRecord, artifacts: Path) -> tuple[str, str | None, str | None] | None:
    """Why a ready local run is no longer serving, ``None`` while it is (or when that cannot be
    told: then its record stands)."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = None
    if run.boot_id and boot and run.boot_id != boot:
        return "exited", "rebooted", "recorded before this machine's last boot"
    from cleanslate.hosts import executor_for
    from cleanslate.launch.lifecycle import ended_before_stop

    try:
        status, cause, detail = asyncio.run(ended_before_stop(
            executor_for(None), run, None, "while serving", artifacts=artifacts))
    except (OSError, InputError):
        status, cause, detail = "stopped", None, None
    if status == "crashed":
        return "exited", cause, detail
    pids = [(p, t) for p, t in ((run.pid, run.create_time),
                                (run.supervisor_pid, run.supervisor_create_time)) if p]
    if pids and not any(_runs(pid, started) for pid, started in pids):
        return "exited", "gone", "neither its server nor its supervisor runs any more"
    return None


def _runs(pid: int, started: float | None) -> bool:
    """Whether the recorded process still runs: its PID, and the start time recorded with it
    (a PID the kernel gave to another process since is not it); without a recorded start
    time, the PID alone (it cannot be told apart). A process whose start time cannot be read
    (access denied) is not called gone: what cannot be read proves nothing."""
    import psutil

    from cleanslate.teardown.scope import SAME_START_S

    try:
        now = psutil.Process(pid).create_time()
    except psutil.AccessDenied:
        return True
    except psutil.Error:  # no such process, or a zombie: it ended
        return False
    return started is None or abs(now - started) <= SAME_START_S


def _when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def flags_text(flags: dict[str, Any], width: int = FLAGS_WIDTH) -> str:
    """A run's flags as ``--name value`` words, cut to ``width`` characters with ``…``."""
    words = []
    for name, value in flags.items():
        flag = "--" + str(name).replace("_", "-")
        words.append(flag if value is True else f"{flag} {value}")
    text = " ".join(words) or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def _state_text(state: tuple[str, str | None, str | None]) -> Text:
    name, cause, _ = state
    style = {"ready": "green", "crashed": "red", "exited": "red", "failed": "red",
             "stopped": "dim"}.get(name, "yellow")
    return Text(f"{name} ({cause})" if cause and name in ("crashed", "exited", "failed")
                else name, style=style)


def bench_line(bench: BenchRecord) -> str:
    """``b-... c=1,c=8 610 tok/s``: a bench's id, levels and best output tokens/s."""
    labels = bench.labels()
    levels = ",".join(labels) if len(labels) <= 6 else f"{len(labels)} levels"
    best = bench.best_output_throughput()
    shown = f"{best:,.0f} tok/s" if best is not None else "no level completed"
    search = " find-max" if bench.kind == "find_max" else ""
    return f"{bench.id}{search} {levels or '-'} {shown}" + (" (failed)" if bench.failed()
                                                            else "")


def _runs_table(recorded: list[RunRecord], states: dict[str, tuple[str, str | None, str | None]],
                by_run: dict[str, list[BenchRecord]]) -> Table:
    table = Table(title="Runs, newest first", title_justify="left")
    for column in ("RUN", "STATE", "ENGINE", "MODEL", "FLAGS", "URL", "STARTED", "BENCHES"):
        table.add_column(column, overflow="fold")
    for run in recorded:
        benches = by_run.get(run.id, [])
        table.add_row(Text(run.id), _state_text(states[run.id]), Text(run.engine),
                      Text(run.model), Text(flags_text(run.flags)), Text(run.url),
                      Text(_when(run.started_at)),
                      Text("\n".join(bench_line(b) for b in benches) or "-"))
    return table


def _benches_table(benches: list[BenchRecord]) -> Table:
    table = Table(title="Benches of no recorded run (bench --url)", title_justify="left")
    for column in ("BENCH", "URL", "MODEL", "ENGINE", "LEVELS", "BEST OUT TOK/S", "WHEN"):
        table.add_column(column, overflow="fold")
    for bench in benches:
        best = bench.best_output_throughput()
        table.add_row(Text(bench.id), Text(bench.url), Text(bench.model),
                      Text(bench.engine or "-"),
                      Text(",".join(bench.labels()) or "-"),
                      Text(f"{best:,.0f}" if best is not None else "-"),
                      Text(_when(bench.created_at)))
    return table


def _run_document(run: RunRecord, state: tuple[str, str | None, str | None]) -> dict[str, Any]:
    return {"run_id": run.id, "state": state[0], "cause": state[1], "detail": state[2],
            "status": str(run.status), "host": run.host, "engine": run.engine,
            "model": run.model, "flags": run.flags, "url": run.url,
            "started_at": run.started_at, "ready_at": run.ready_at,
            "stopped_at": run.stopped_at}


def _bench_document(bench: BenchRecord) -> dict[str, Any]:
    return {"bench_id": bench.id, "run_id": bench.run_id, "kind": bench.kind,
            "url": bench.url, "model": bench.model, "engine": bench.engine,
            "created_at": bench.created_at, "levels": bench.labels(),
            "best_output_throughput": bench.best_output_throughput(),
            "failed": bench.failed()}


__all__ = ["bench_line", "flags_text", "run_state", "runs"]
