"""Clusters: a study's workers submitted to a batch scheduler.

:mod:`~cleanslate.cluster.slurm` writes and submits a Slurm job array of ``cleanslate worker``
tasks (``cleanslate slurm submit``). Kubernetes needs no code: ``examples/k8s/`` is an Indexed
Job of the same workers (``docs/fleet.md``).
"""

from __future__ import annotations

from cleanslate.cluster.slurm import (
    SlurmOptions,
    render_script,
    submit,
    worker_command,
    write_script,
)

__all__ = ["SlurmOptions", "render_script", "submit", "worker_command", "write_script"]
