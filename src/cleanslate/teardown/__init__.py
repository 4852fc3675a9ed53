"""Teardown: end exactly what a run owns, then verify the host is clean.

:func:`cleanslate.teardown.teardown.teardown` signals the processes in a :class:`ScopeSpec`'s
scope (what selects a process, and what is never touched, is in
:mod:`cleanslate.teardown.teardown` and ``docs/teardown.md``), escalates from SIGTERM to
SIGKILL, removes the run's cgroup and its own ``/dev/shm`` files, and verifies; the
:class:`TeardownReport` says what it did. :func:`scan_scope` lists the targets without
signalling (``clean --engine`` shows them first); :func:`resolve_scope` is the pure selection
over a snapshot.

The names below load on first use. The ``teardown`` function is imported from its module: the
package's attribute ``teardown`` is that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.teardown.teardown import (
        ScopeSpec,
        SignalRound,
        Target,
        TargetRecord,
        TeardownReport,
        resolve_scope,
        scan_scope,
        skip_teardown,
    )

__getattr__, __dir__ = lazy_exports(__name__, {
    "ScopeSpec": "cleanslate.teardown.teardown",
    "SignalRound": "cleanslate.teardown.teardown",
    "Target": "cleanslate.teardown.teardown",
    "TargetRecord": "cleanslate.teardown.teardown",
    "TeardownReport": "cleanslate.teardown.teardown",
    "resolve_scope": "cleanslate.teardown.teardown",
    "scan_scope": "cleanslate.teardown.teardown",
    "skip_teardown": "cleanslate.teardown.teardown",
})

__all__ = [
    "ScopeSpec",
    "SignalRound",
    "Target",
    "TargetRecord",
    "TeardownReport",
    "resolve_scope",
    "scan_scope",
    "skip_teardown",
]
