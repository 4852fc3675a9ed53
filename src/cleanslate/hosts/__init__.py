"""Where commands run: the :class:`Executor` protocol and its implementations.

``LocalExecutor`` runs on this machine; ``SSHExecutor`` runs on a remote host over SSH behind the
same protocol, so the probe, teardown and launch code never ask where they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports
from cleanslate.hosts.base import CommandResult, Executor
from cleanslate.hosts.local import LocalExecutor
from cleanslate.hosts.scripts import ScriptResult, run_script

if TYPE_CHECKING:
    from cleanslate.hosts.ssh import SSHExecutor

# asyncssh is not needed to work on this machine: SSHExecutor loads when used.
__getattr__, __dir__ = lazy_exports(__name__, {"SSHExecutor": "cleanslate.hosts.ssh"})

__all__ = [
    "CommandResult",
    "Executor",
    "LocalExecutor",
    "SSHExecutor",
    "ScriptResult",
    "check_resolves",
    "executor_for",
    "is_local_host",
    "run_script",
]

_LOCAL_NAMES = (None, "", "local", "localhost")


def is_local_host(host: str | None) -> bool:
    """Whether a ``--host`` value means this machine (``None``, ``local`` or ``localhost``).

    ``ssh://localhost`` is a remote host that happens to be this machine: it goes through SSH.
    """
    return host in _LOCAL_NAMES


def executor_for(host: str | None, *, accept_new_host_keys: bool | None = None) -> Executor:
    """Return the executor for a ``--host`` value.

    ``None``, ``local`` or ``localhost``: this machine. ``ssh://[user@]host[:port][?accept-new=1
    &connect-timeout=S]`` or ``[user@]NAME`` (a ``Host`` of ``~/.ssh/config``): that host over SSH.
    A malformed value is an :class:`~cleanslate.errors.InputError`; an unreachable host is not an
    error here (connections open on first use, and a failure makes that host UNKNOWN).
    ``accept_new_host_keys``: record an SSH host key never seen before (``True``; a changed key
    is still refused), or not (``False``); ``None`` leaves it to the URL's ``?accept-new=1``
    and ``$CLEANSLATE_SSH_ACCEPT_NEW``.
    """
    if is_local_host(host):
        return LocalExecutor()
    from cleanslate.hosts.ssh import SSHExecutor

    assert host is not None
    return SSHExecutor(host, accept_new=accept_new_host_keys)


def check_resolves(host: str | None, *, where: str = "--host") -> None:
    """Refuse a host whose name does not resolve (after ``~/.ssh/config``) with an
    :class:`~cleanslate.errors.InputError` naming ``where``; this machine always resolves.
    Nothing is connected to: whether the host answers is found out when it is used."""
    if is_local_host(host):
        return
    from cleanslate.hosts.ssh import resolve_address

    assert host is not None
    resolve_address(host, where=where)

