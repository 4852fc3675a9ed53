"""``cleanslate slurm submit``: a study's workers as a Slurm job array.

Options -> the study file (:func:`~cleanslate.tune.study.load_study`, validated as ``tune``
validates it) -> the study registered in the store -> the batch script
(:mod:`cleanslate.cluster.slurm`) written beside the study's artifacts and submitted with
``sbatch`` -> rendering. ``--dry-run`` prints the script and touches nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from cleanslate.cli._common import console, console_err
from cleanslate.cli._options import GpuBackendOption, store_option
from cleanslate.errors import ExitCode, InputError
from cleanslate.hosts import executor_for

slurm_app = typer.Typer(name="slurm", no_args_is_help=True, add_completion=False,
                        help="Run a study's workers on a Slurm cluster.")


@slurm_app.command(context_settings={"allow_extra_args": True,
                                     "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    study_file: Annotated[Path, typer.Argument(help="The study file (YAML).")],
    workers: Annotated[int, typer.Option(min=1, max=10_000,
                                         help="Array tasks: one cleanslate worker each.")],
    store_url: Annotated[str | None, store_option(
        help="Store URL every node reaches (postgresql://...).")] = None,
    gpus_per_worker: Annotated[int | None, typer.Option(
        min=0, max=64, help="GPUs Slurm gives each task (--gres=gpu:G); default: as many as "
        "the study's gpus: names.")] = None,
    partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
    time_limit: Annotated[str | None, typer.Option(
        "--time", help="Slurm --time of each task, e.g. 4:00:00.")] = None,
    max_parallel: Annotated[int | None, typer.Option(
        min=1, max=10_000, help="Tasks running at once (--array=...%K).")] = None,
    gpu_backend: GpuBackendOption = "auto",
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the batch script; submit nothing, leave the store alone.")
    ] = False,
) -> None:
    """Submit a job array whose tasks run `cleanslate worker` on the GPUs Slurm gives them,
    all leasing trials of the study from one store. Arguments after `--` go to sbatch:
    `cleanslate slurm submit study.yaml --workers 8 -- --account=serving --qos=high`."""
    from pydantic import ValidationError

    from cleanslate.cluster.slurm import SlurmOptions, render_script, submit, write_script
    from cleanslate.store import STORE_ENV, Store, resolve_store_url
    from cleanslate.tune import load_study, validate_study_flags
    from cleanslate.tune.controller import check_slot_hosts, register_study

    if gpu_backend != "auto":  # written into the script: an unknown name fails every task
        from cleanslate.probe.gpu import backend_class

        backend_class(gpu_backend)
    spec, root = load_study(study_file)
    if spec.hosts and len(spec.hosts) > 1:
        raise InputError("a study submitted to Slurm runs on the nodes Slurm gives it; it "
                         f"names {len(spec.hosts)} hosts", where="hosts",
                         hint="drop hosts: (and host:) from the study for Slurm")
    check_slot_hosts(spec)
    wanted = len(spec.gpus) if spec.gpus else 0
    per_worker = wanted if gpus_per_worker is None else gpus_per_worker
    if wanted and per_worker < wanted:
        raise InputError(f"the study's servers use {wanted} GPU(s) (gpus: {spec.gpus}); each "
                         f"task would get {per_worker}", where="--gpus-per-worker",
                         hint=f"give --gpus-per-worker {wanted}, so that Slurm allocates each "
                         "task GPUs of its own")
    try:
        options = SlurmOptions(workers=workers, gpus_per_worker=per_worker,
                               partition=partition, time=time_limit,
                               max_parallel=max_parallel, gpu_backend=gpu_backend,
                               extra=tuple(ctx.args))
    except ValidationError as exc:
        raise InputError.from_validation(exc, where="options") from None
    note = asyncio.run(validate_study_flags(spec, root, study_file, executor_for(spec.host)))
    if note:
        console_err.print(f"[yellow]note:[/] {escape(note)}")
    url = resolve_store_url(store_url)
    if url.startswith("sqlite"):
        console_err.print("[yellow]note:[/] a SQLite store is shared only by nodes that see "
                          "the same file; a cluster's workers share a PostgreSQL store")
    port = spec.slot_ports()[0]
    if dry_run:
        text = render_script(spec.name, options, log_dir=Path("<artifacts>/slurm"), port=port)
        console.print(Text(text), end="", soft_wrap=True)
        raise typer.Exit(ExitCode.OK)
    store = Store(url)
    try:
        register_study(store, spec)
        folder = store.artifacts / "studies" / spec.name / "slurm"
        text = render_script(spec.name, options, log_dir=folder, port=port)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        script = write_script(text, folder, f"workers-{stamp}.sbatch")
        job = submit(script, env={**os.environ, STORE_ENV: url})
    finally:
        store.close()
    console.print(Text.assemble(("SUBMITTED", "bold green"), f" job {job}: {workers} "
                                f"worker(s) of study {spec.name}"))
    console.print(Text(f"  script   {script}"))
    console.print(Text(f"  logs     {folder}/worker-{job}_<task>.log"))
    console.print(Text(f"  watch    squeue -j {job}; cleanslate report {spec.name}"))
    raise typer.Exit(ExitCode.OK)


__all__ = ["slurm_app", "submit"]
