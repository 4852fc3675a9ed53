"""Run the stdlib-only collector (:mod:`cleanslate.probe._collect_script`) on a host and read its
JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cleanslate.engines import shm_patterns as registered_shm_patterns
from cleanslate.hosts.base import CommandResult, Executor
from cleanslate.hosts.scripts import run_script, script_source

COLLECTOR = "probe._collect_script"


def collector_source() -> bytes:
    """The collector's source, as shipped to a host's Python on stdin."""
    return script_source(COLLECTOR)


async def run_collector(
    executor: Executor,
    *,
    ports: list[int],
    timeout: float,
    kmsg_since_us: int | None = None,
    kmsg_since_boot_id: str | None = None,
    shm_dir: str | None = None,
    listeners: bool = False,
    shm_patterns: Sequence[str] | None = None,
) -> tuple[dict[str, Any] | None, CommandResult]:
    """Run the collector with ``timeout`` seconds. Returns the parsed JSON (``None`` on failure)
    and the command's result, whose :meth:`~CommandResult.describe_failure` says what went wrong.
    ``listeners``: also report every listening socket (any port); ``kmsg_since_us`` counts only
    in the boot ``kmsg_since_boot_id`` (when given); ``shm_patterns``: the ``/dev/shm`` names
    to report (``None``: the registered engines', :func:`cleanslate.engines.shm_patterns`)."""
    options = {
        "ports": ports,
        "kmsg_since_us": kmsg_since_us,
        "kmsg_since_boot_id": kmsg_since_boot_id,
        "budget_s": max(0.5, timeout * 0.5),
        "shm_dir": shm_dir,
        "shm_patterns": list(registered_shm_patterns() if shm_patterns is None
                             else shm_patterns),
        "listeners": listeners,
    }
    done = await run_script(executor, COLLECTOR, options, timeout, output=dict,
                            what="the collector")
    return done.output, done.command
