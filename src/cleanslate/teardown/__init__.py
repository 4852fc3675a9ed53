"""Teardown: end exactly what a run owns, then verify the host is clean.

:func:`teardown` signals the processes in a :class:`ScopeSpec`'s scope, escalates from
SIGTERM to SIGKILL, removes the run's cgroup and its own ``/dev/shm`` files, and verifies; the
:class:`TeardownReport` says what it did. :func:`scan_scope` lists the targets without
signalling (``clean --engine`` shows them first); :func:`resolve_scope` is the pure selection
over a snapshot.

The package's rooms: :mod:`.scope` (what selects a process and what is never touched; pure),
:mod:`._host` (the commands sent to a host), :mod:`._records` (the records) and :mod:`._run`
(the teardown in its phases). The names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.teardown._host import read_cgroup_members
    from cleanslate.teardown._records import (
        Protected,
        ScopeSpec,
        Selected,
        SignalRound,
        Target,
        TargetRecord,
        TeardownReport,
    )
    from cleanslate.teardown._run import scan_scope, skip_teardown, teardown
    from cleanslate.teardown._tree import TREE_FILE
    from cleanslate.teardown.scope import resolve_scope, valid_cgroup

__getattr__, __dir__ = lazy_exports(__name__, {
    "Protected": "cleanslate.teardown._records",
    "TREE_FILE": "cleanslate.teardown._tree",
    "ScopeSpec": "cleanslate.teardown._records",
    "Selected": "cleanslate.teardown._records",
    "SignalRound": "cleanslate.teardown._records",
    "Target": "cleanslate.teardown._records",
    "TargetRecord": "cleanslate.teardown._records",
    "TeardownReport": "cleanslate.teardown._records",
    "read_cgroup_members": "cleanslate.teardown._host",
    "resolve_scope": "cleanslate.teardown.scope",
    "scan_scope": "cleanslate.teardown._run",
    "skip_teardown": "cleanslate.teardown._run",
    "teardown": "cleanslate.teardown._run",
    "valid_cgroup": "cleanslate.teardown.scope",
})

__all__ = [
    "TREE_FILE",
    "Protected",
    "ScopeSpec",
    "Selected",
    "SignalRound",
    "Target",
    "TargetRecord",
    "TeardownReport",
    "read_cgroup_members",
    "resolve_scope",
    "scan_scope",
    "skip_teardown",
    "teardown",
    "valid_cgroup",
]
