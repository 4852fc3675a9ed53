"""Doctor snapshots of hosts as the store keeps them (``cs_hosts``).

A study records one snapshot per host it runs on (the first worker on that host takes it; the
others find it recorded), and ``cleanslate serve`` one per run. ``host`` is the executor's
name (``local``, ``fleet-a``, ``user@host:port``); ``machine`` tells apart the machines that
all call themselves ``local`` (the hostname of this machine for a local host, empty for a
remote one, whose name says which it is).
"""

from __future__ import annotations

import socket

from cleanslate.doctor.snapshot import HostSnapshot
from cleanslate.store._records import Record


def local_machine() -> str:
    """The name this machine gives itself (``socket.gethostname``), ``""`` when it has none."""
    try:
        return socket.gethostname()
    except OSError:
        return ""


class HostRecord(Record):
    """A host's doctor snapshot in the store: of a ``study`` (one per host and machine) or of a
    ``serve`` run (``run_id``). ``id`` is the row's, ``None`` before it is saved."""

    id: int | None = None
    study: str | None = None
    run_id: str | None = None
    host: str
    machine: str = ""
    snapshot: HostSnapshot

    @property
    def label(self) -> str:
        """How a report names the host: ``local (gpu-7)`` for a local one, else its name."""
        return f"{self.host} ({self.machine})" if self.machine and self.host == "local" \
            else self.host
