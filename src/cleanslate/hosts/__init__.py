"""Where commands run: the :class:`Executor` protocol and its implementations.

``LocalExecutor`` runs on this machine; an SSH executor (a later issue) runs on a remote host
behind the same protocol, so the probe, teardown and launch code never ask where they are.
"""

from __future__ import annotations

from cleanslate.hosts.base import CommandResult, Executor
from cleanslate.hosts.local import LocalExecutor

__all__ = ["CommandResult", "Executor", "LocalExecutor", "executor_for"]


def executor_for(host: str | None) -> Executor:
    """Return the executor for a ``--host`` value (``None`` or ``local`` is this machine)."""
    from cleanslate.errors import InputError

    if host in (None, "", "local", "localhost"):
        return LocalExecutor()
    raise InputError(
        f"remote hosts are not supported yet: {host!r}",
        where="--host",
        hint="omit --host to work on this machine",
    )
