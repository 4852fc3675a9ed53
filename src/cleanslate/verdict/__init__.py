"""Is a host clean: rules over a snapshot (and a baseline), and the checks that run them.

- :mod:`~cleanslate.verdict.rules`: :func:`evaluate`, the rules over one snapshot within a
  :class:`Scope` (GPUs, engines, ports, markers, tolerance, strictness).
- :mod:`~cleanslate.verdict.findings`: what the rules produce (:class:`Finding`, its
  :class:`FindingKind` and :class:`Severity`, :class:`HostVerdict`, :class:`Verdict`).
- :mod:`~cleanslate.verdict.check`: :func:`check_hosts` (what ``cleanslate check`` runs) and
  :func:`check_until_clean` (re-probe until clean and settled, or the deadline); the
  :class:`CheckReport` is the ``check --json`` document.
- :mod:`~cleanslate.verdict.baseline`: an idle host's reading to compare with later.
- :mod:`~cleanslate.verdict.ports`: the ports a check requires free without being asked.

The names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.verdict.baseline import Baseline
    from cleanslate.verdict.check import (
        DEFAULT_SETTLE_S,
        CheckOptions,
        CheckReport,
        UntilClean,
        check_host,
        check_hosts,
        check_until_clean,
    )
    from cleanslate.verdict.findings import Finding, FindingKind, HostVerdict, Severity, Verdict
    from cleanslate.verdict.ports import implicit_ports
    from cleanslate.verdict.rules import DEFAULT_IDLE_TOLERANCE_MIB, Scope, evaluate

__getattr__, __dir__ = lazy_exports(__name__, {
    "DEFAULT_SETTLE_S": "cleanslate.verdict.check",
    "CheckOptions": "cleanslate.verdict.check",
    "CheckReport": "cleanslate.verdict.check",
    "UntilClean": "cleanslate.verdict.check",
    "check_host": "cleanslate.verdict.check",
    "check_hosts": "cleanslate.verdict.check",
    "check_until_clean": "cleanslate.verdict.check",
    "DEFAULT_IDLE_TOLERANCE_MIB": "cleanslate.verdict.rules",
    "Scope": "cleanslate.verdict.rules",
    "evaluate": "cleanslate.verdict.rules",
    "Finding": "cleanslate.verdict.findings",
    "FindingKind": "cleanslate.verdict.findings",
    "HostVerdict": "cleanslate.verdict.findings",
    "Severity": "cleanslate.verdict.findings",
    "Verdict": "cleanslate.verdict.findings",
    "Baseline": "cleanslate.verdict.baseline",
    "implicit_ports": "cleanslate.verdict.ports",
})

__all__ = [
    "DEFAULT_IDLE_TOLERANCE_MIB",
    "DEFAULT_SETTLE_S",
    "Baseline",
    "CheckOptions",
    "CheckReport",
    "Finding",
    "FindingKind",
    "HostVerdict",
    "Scope",
    "Severity",
    "UntilClean",
    "Verdict",
    "check_host",
    "check_hosts",
    "check_until_clean",
    "evaluate",
    "implicit_ports",
]
