"""``cleanslate worker``: lease trials of a study in a shared store and run them on one slot.

Options -> the stored study and the slot (:func:`~cleanslate.tune.controller.load_stored_study`,
:func:`~cleanslate.tune.controller.worker_slot`) -> one library call,
:func:`~cleanslate.tune.controller.run_worker` -> rendering (``docs/fleet.md``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from cleanslate.cli._common import console, parse_gpus
from cleanslate.cli._options import GpuBackendOption, named_host, store_option
from cleanslate.cli.tune import ConsoleView
from cleanslate.errors import ExitCode, InputError


def worker(
    study: Annotated[str, typer.Option("--study", help="The study's name in the store.")],
    store_url: Annotated[str | None, store_option(
        help="Store URL shared by the fleet (postgresql://... across machines).")
    ] = None,
    host: Annotated[str | None, typer.Option(
        callback=named_host,
        help="The slot's host (default: the study's host, else this machine).")] = None,
    gpus: Annotated[str | None, typer.Option(
        help="The slot's GPUs, e.g. 0,1 (default: the study's).")] = None,
    port: Annotated[int | None, typer.Option(
        min=1, max=65535, help="The slot's port (default: the study's first slot's).")] = None,
    gpu_backend: GpuBackendOption = "auto",
    baseline: Annotated[Path | None, typer.Option(
        "--baseline", help="Compare every check of this slot's trials with an idle-state "
        "baseline of its host, saved by `cleanslate check --save-baseline FILE` (as `tune "
        "--baseline`).")] = None,
) -> None:
    """Lease trials of a study that `cleanslate tune` started and run them on one slot (host,
    GPUs, port) until its plan or budget is done. Any number of workers may share a store."""
    from cleanslate.launch.lifecycle import using_baseline
    from cleanslate.store import Store, study_digest
    from cleanslate.tune.controller import (
        check_model_paths,
        load_stored_study,
        run_worker,
        worker_slot,
    )
    from cleanslate.verdict.baseline import Baseline

    host_baseline = Baseline.load(baseline) if baseline is not None else None
    gpu_list = parse_gpus(gpus) if gpus is not None else None
    reader = Store(store_url, create=False)  # a study that is not there: nothing written
    try:
        record = reader.study(study)
        spec = load_stored_study(reader, study)
    finally:
        reader.close()
    if record is not None:  # what this worker launches is what the store's row says: say which
        console.print(Text(f"worker: study {spec.name} from {reader.display_url}, definition "
                           f"{study_digest(record.spec)} (engine {spec.engine}, model "
                           f"{spec.model})"), highlight=False)
    if spec.strategy == "guided":
        # its path is one trial at a time, each read from the one before: a second process
        # claiming trials beside `tune` would measure steps no verdict asked for
        raise InputError(f"study {spec.name} is guided (strategy: guided): it runs one trial "
                         "at a time, in the process that runs it", where="--study",
                         hint="run it with cleanslate tune STUDY.yaml; workers serve studies "
                              "of another strategy")
    slot = worker_slot(spec, host=host, gpus=gpu_list, port=port)
    # a model path that is not on this worker's host: before anything is claimed
    asyncio.run(check_model_paths(spec.model_copy(update={"host": slot.host, "hosts": None}),
                                  f"model (of study {spec.name})"))
    store = Store(store_url)
    try:
        with using_baseline(host_baseline):
            outcome = asyncio.run(run_worker(store, spec, slot, view=ConsoleView(),
                                             gpu_backend=gpu_backend))
    finally:
        store.close()
    done = outcome.stopped_by in ("plan", "budget")
    if outcome.stopped_by == "systemic":
        console.print(Text(f"worker on {slot.key}: stopped: a failure that is not the "
                           f"configuration's: {outcome.message}; its configurations were "
                           "re-queued, none recorded infeasible"), highlight=False)
        raise typer.Exit(ExitCode.FAILED)
    console.print(f"worker on {escape(slot.key)}: {outcome.new_trials} trials; study "
                  + ("done" if done else f"not done: {escape(outcome.stopped_by)} "
                     f"{escape(outcome.message)}"), highlight=False)
    raise typer.Exit(ExitCode.OK if done else ExitCode.FAILED)


__all__ = ["worker"]
