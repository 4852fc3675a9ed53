"""Options that several commands share, declared once: one name, one help text and one check
for each (a command whose option means something more, such as ``check --store``, which never
creates a store, says so with :func:`store_option`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated

import typer
from typer.models import OptionInfo

from cleanslate.errors import InputError


def known_backend(value: str) -> str:
    """``--gpu-backend``: ``auto`` or a registered backend, checked before anything runs (an
    unknown name is an input error, exit 2, not a failed verification after a teardown)."""
    if value != "auto":
        from cleanslate.probe.gpu.base import backend_class

        backend_class(value)  # an InputError naming the choices
    return value


def _seconds(option: str, *, zero: bool) -> Callable[[float], float]:
    """A check of a number of seconds given to ``option``: finite, and positive (or zero,
    with ``zero``); ``nan`` and ``inf`` are input errors (exit 2), not a wait forever."""

    def check(value: float) -> float:
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            what = "zero or a positive" if zero else "a positive"
            raise InputError(f"must be {what} number of seconds, not {value:g}", where=option)
        return value

    return check


def named_host(value: str | list[str] | None) -> str | list[str] | None:
    """``--host``: a name, never an empty one (``--host ""`` from an unset shell variable would
    otherwise mean this machine)."""
    for item in [value] if isinstance(value, str) else value or []:
        if not item.strip():
            raise InputError("an empty host name", where="--host",
                             hint="leave --host out for this machine, or write local")
    return value


def check_settle(settle: float, deadline: float) -> None:
    """``--settle`` must fit inside ``--deadline``: a host must read clean for the settle
    window before the deadline, so a longer window could never end CLEAN (exit 2)."""
    if settle > deadline:
        raise InputError(f"{settle:g} s is longer than --deadline ({deadline:g} s): the host "
                         "could never read clean for that long before the deadline",
                         where="--settle", hint="raise --deadline or lower --settle")


#: The help of ``--store`` where the store is opened (and made, for SQLite) as usual.
STORE_HELP = "Store URL (default $CLEANSLATE_STORE, else sqlite:///cleanslate.db)."


def store_option(help: str = STORE_HELP) -> OptionInfo:
    """``--store`` with ``help``."""
    option: OptionInfo = typer.Option("--store", help=help)
    return option


GpuBackendOption = Annotated[str, typer.Option(
    "--gpu-backend", callback=known_backend,
    help="How GPUs are read: auto (the first that works), nvml, nvidia-smi, sim or none.")]
StoreOption = Annotated[str | None, store_option()]
JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout and nothing else.")]
GraceOption = Annotated[float, typer.Option(
    "--grace", callback=_seconds("--grace", zero=True),
    help="Seconds between SIGTERM and SIGKILL.")]
DeadlineOption = Annotated[float, typer.Option(
    "--deadline", callback=_seconds("--deadline", zero=False),
    help="Seconds to wait for a clean verdict.")]
SettleOption = Annotated[float, typer.Option(
    "--settle", callback=_seconds("--settle", zero=True),
    help="Seconds the host must keep reading clean before it is CLEAN (readings back to back, "
    "opened by the first clean one after any GPU memory release; an engine process that appears "
    "meanwhile is DIRTY); at most --deadline.")]

__all__ = ["STORE_HELP", "DeadlineOption", "GpuBackendOption", "GraceOption", "JsonOption",
           "SettleOption", "StoreOption", "check_settle", "known_backend", "named_host",
           "store_option"]
