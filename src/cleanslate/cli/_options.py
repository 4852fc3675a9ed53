"""Options that several commands share, declared once: one name, one help text and one check
for each (a command whose option means something more, such as ``check --store``, which never
creates a store, says so with :func:`store_option`)."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.models import OptionInfo


def _known_backend(value: str) -> str:
    """``--gpu-backend``: ``auto`` or a registered backend, checked before anything runs (an
    unknown name is an input error, exit 2, not a failed verification after a teardown)."""
    if value != "auto":
        from cleanslate.probe.gpu.base import backend_class

        backend_class(value)  # an InputError naming the choices
    return value


#: The help of ``--store`` where the store is opened (and made, for SQLite) as usual.
STORE_HELP = "Store URL (default $CLEANSLATE_STORE, else sqlite:///cleanslate.db)."


def store_option(help: str = STORE_HELP) -> OptionInfo:
    """``--store`` with ``help``."""
    option: OptionInfo = typer.Option("--store", help=help)
    return option


GpuBackendOption = Annotated[str, typer.Option(
    "--gpu-backend", callback=_known_backend,
    help="How GPUs are read: auto (the first that works), nvml, nvidia-smi, sim or none.")]
StoreOption = Annotated[str | None, store_option()]
JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout and nothing else.")]
GraceOption = Annotated[float, typer.Option(
    "--grace", help="Seconds between SIGTERM and SIGKILL.")]
DeadlineOption = Annotated[float, typer.Option(
    "--deadline", help="Seconds to wait for a clean verdict.")]
SettleOption = Annotated[float, typer.Option(
    "--settle", help="Seconds the host must keep reading clean before it is CLEAN (readings "
    "back to back, opened by the first clean one after any GPU memory release; an engine "
    "process that appears meanwhile is DIRTY).")]

__all__ = ["STORE_HELP", "DeadlineOption", "GpuBackendOption", "GraceOption", "JsonOption",
           "SettleOption", "StoreOption", "store_option"]
