"""Workers of a study as a Slurm job array, submitted with plain ``sbatch``.

``cleanslate slurm submit STUDY.yaml --workers N`` writes one batch script and submits it as an
array of ``N`` tasks. Each task runs ``cleanslate worker`` on the node Slurm gave it, on the GPUs
Slurm allocated to it, with a port of its own (the study's port plus the task's index, so that
tasks sharing a node do not collide). The workers lease trials from the study in the shared
store (``docs/fleet.md``): a task that is preempted, cancelled or loses its node stops renewing
its lease, the lease expires and its trial is run again by another task.

Why plain ``sbatch`` and not ``submitit``: submitit pickles a Python callable into a folder that
the submitting machine and the nodes must share, and reads results back from it. The workers
here need neither: they coordinate through the store, and what runs on a node is one command
line. A plain script is what an operator can read, keep beside the study (it is written to the
study's artifacts), edit and resubmit with ``sbatch`` by hand; ``--dry-run`` prints it.

GPUs: the script passes the worker the GPUs the task may use, from ``CUDA_VISIBLE_DEVICES``
(set by Slurm for a ``--gres=gpu:G`` job; with ``ConstrainDevices=yes`` these are the indices
the job's CUDA and NVML see), else ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``. A task that got no
GPU from Slurm while ``--gpus-per-worker`` asked for some refuses to start (exit 2) rather than
run on GPUs it was not given.

The store's URL never enters the script (it may hold a password and the script is kept on
disk): ``sbatch`` hands the submitter's ``CLEANSLATE_STORE`` to the tasks in their environment.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import Field, field_validator

from cleanslate._output_files import make_output_folder, write_output
from cleanslate.errors import InputError
from cleanslate.models import FrozenStrict

#: What ``--time`` accepts: Slurm's forms (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
#: ``D-HH:MM``, ``D-HH:MM:SS``) or ``UNLIMITED``.
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$|^INFINITE$", re.I)
#: Partition names: what Slurm allows in a partition name.
_PARTITION = re.compile(r"^[A-Za-z0-9_.,-]{1,128}$")
#: Options of sbatch that the script sets itself: given again, they would change what the
#: tasks run on behind the script's back.
_OWN_OPTIONS = ("--array", "-a", "--output", "-o", "--error", "-e", "--job-name", "-J",
                "--gres", "--gpus", "-G", "--export")


class SlurmOptions(FrozenStrict):
    """What ``cleanslate slurm submit`` was asked for."""

    workers: int = Field(ge=1, le=10_000, description="array tasks, one worker each")
    gpus_per_worker: int = Field(default=0, ge=0, le=64,
                                 description="GPUs per task (--gres=gpu:G); 0 asks for none")
    partition: str | None = None
    time: str | None = Field(default=None, description="Slurm's --time of each task")
    max_parallel: int | None = Field(default=None, ge=1, le=10_000,
                                     description="tasks running at once (--array=...%K)")
    gpu_backend: str = "auto"
    base_port: int | None = Field(default=None, ge=1, le=65_535)
    extra: tuple[str, ...] = ()

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        if value is not None and not _PARTITION.match(value):
            raise ValueError(f"{value!r} is not a Slurm partition name")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.match(value):
            raise ValueError(f"{value!r} is not a Slurm time (e.g. 90, 4:00:00, 1-12)")
        return value

    @field_validator("extra")
    @classmethod
    def _extra(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            name = arg.split("=", 1)[0]
            if name in _OWN_OPTIONS:
                raise ValueError(f"{name} is set by the script itself; it cannot be given "
                                 "after --")
            if "\n" in arg or "\r" in arg:
                raise ValueError(f"sbatch argument {arg!r} holds a line break")
        return value


#: What may not appear in an ``#SBATCH`` line's value: a line break would end the directive and
#: start a line of the script; a blank, a quote or a backslash would be read by sbatch's own
#: word splitting; any other control character is refused with them.
_DIRECTIVE_BAD = re.compile(r"[\x00-\x20\x7f\"'\\]")


def _directive(value: str, *, where: str) -> str:
    """``value`` as the text after ``#SBATCH ``, or an :class:`InputError` naming ``where``
    when a character of it would be read as something else (:data:`_DIRECTIVE_BAD`)."""
    bad = _DIRECTIVE_BAD.search(value)
    if bad is not None:
        raise InputError(f"{value!r} cannot be written as an #SBATCH line: it holds "
                         f"{bad.group()!r}", where=where,
                         hint="Slurm reads #SBATCH lines word by word; use a value (a path) "
                         "without blanks, quotes or line breaks")
    return value


def _slurm_path(path: Path) -> str:
    """A path as a Slurm file name pattern: ``%`` doubled, so that only our ``%A``/``%a`` are
    replaced."""
    return str(path).replace("%", "%%")


def worker_command(python: str = sys.executable) -> list[str]:
    """How a task starts cleanslate: the interpreter running this command, as ``-m
    cleanslate`` (a cluster's nodes share the submitter's environment, or the script is edited
    to say otherwise)."""
    return [python, "-m", "cleanslate"]


def render_script(study: str, options: SlurmOptions, *, log_dir: Path, port: int,
                  command: Sequence[str] | None = None) -> str:
    """The batch script of a study's workers (see the module docstring). ``port`` is the port
    of task 0; task ``i`` uses ``port + i``."""
    if port + options.workers - 1 > 65_535:
        raise InputError(f"ports {port}-{port + options.workers - 1} of {options.workers} "
                         "workers go past 65535", where="--workers",
                         hint="give the study a lower port:, or fewer workers")
    from cleanslate.tune.study import study_name_problem

    problem = study_name_problem(study)
    if problem is not None:  # the file's loader refuses it first; a caller of this function too
        raise InputError(problem, where="name")
    last = options.workers - 1
    array = f"0-{last}" + (f"%{options.max_parallel}" if options.max_parallel else "")
    directives = [
        f"--job-name=cleanslate-{study}",
        f"--array={array}",
        f"--output={_slurm_path(log_dir)}/worker-%A_%a.log",
        "--export=ALL",
    ]
    if options.gpus_per_worker:
        directives.append(f"--gres=gpu:{options.gpus_per_worker}")
    if options.partition:
        directives.append(f"--partition={options.partition}")
    if options.time:
        directives.append(f"--time={options.time}")
    directives = [_directive(d, where="the artifacts folder" if d.startswith("--output=")
                             else "the script") for d in directives]
    directives += [_directive(arg, where="sbatch arguments after --") for arg in options.extra]
    # --host local: a task drives the node Slurm gave it, whatever host the study names (a
    # study's host: would send every task's servers to that one machine over SSH)
    argv = [*(command or worker_command()), "worker", "--study", study, "--host", "local",
            "--gpu-backend", options.gpu_backend]
    lines = [
        "#!/bin/bash",
        f"# Workers of the cleanslate study {study!r}: {options.workers} array task(s), each",
        "# running `cleanslate worker` on the GPUs Slurm gave it (docs/fleet.md).",
        "# The store comes from CLEANSLATE_STORE in the environment sbatch hands over.",
        *(f"#SBATCH {d}" for d in directives),
        "set -euo pipefail",
        ': "${CLEANSLATE_STORE:?CLEANSLATE_STORE is not set: submit with it in the environment}"',
        "gpus=${CUDA_VISIBLE_DEVICES:-${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}}",
    ]
    gpu_args = ""
    if options.gpus_per_worker:
        lines += [
            'if [ -z "$gpus" ]; then',
            f'    echo "task $SLURM_ARRAY_TASK_ID: Slurm allocated no GPU (asked for '
            f'{options.gpus_per_worker}); not running" >&2',
            "    exit 2",
            "fi",
        ]
        gpu_args = ' --gpus "$gpus"'
    lines += [
        f"port=$(( {port} + SLURM_ARRAY_TASK_ID ))",
        'echo "task $SLURM_ARRAY_TASK_ID on $(hostname): gpus ${gpus:-none}, port $port"',
        f'exec {shlex.join(argv)}{gpu_args} --port "$port"',
        "",
    ]
    return "\n".join(lines)


def write_script(text: str, folder: Path, name: str) -> Path:
    """Write the script (mode 0700 folder, 0600 file: it names the store, whose URL may hold
    a password) through a temporary file and a rename, never through a link
    (:func:`cleanslate._output_files.write_output`), and return its path."""
    make_output_folder(folder, where=str(folder), mode=0o700)
    return write_output(folder / name, text, where=str(folder / name))


def submit(script: Path, *, env: Mapping[str, str], timeout: float = 60.0) -> str:
    """``sbatch --parsable SCRIPT`` with ``env``; the job id. No sbatch, or sbatch refusing
    the job: :class:`InputError` with what sbatch said."""
    sbatch = shutil.which("sbatch", path=env.get("PATH"))
    if sbatch is None:
        raise InputError("sbatch is not on PATH: this machine cannot submit Slurm jobs",
                         hint="run on a login node of the cluster, or use --dry-run to see "
                         "the script")
    try:
        done = subprocess.run([sbatch, "--parsable", str(script)], env=dict(env),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"sbatch did not answer in {timeout:g} s",
                         hint="is slurmctld up? (sinfo)") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise InputError("sbatch refused the job: " + (said[-1] if said else
                                                       f"exit status {done.returncode}"),
                         hint=f"the script is kept at {script}")
    job = done.stdout.strip().split(";", 1)[0]
    if not job.isdigit():
        raise InputError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
    return job


__all__ = ["SlurmOptions", "render_script", "submit", "worker_command", "write_script"]
