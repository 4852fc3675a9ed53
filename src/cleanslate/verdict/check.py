"""Check hosts: probe, apply the rules, and optionally re-probe until clean.

This is what ``cleanslate check`` runs, and what teardown and the tuner call to verify a state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.base import resolve_backend
from cleanslate.probe.host import DEFAULT_TIMEOUT_S, probe_host
from cleanslate.probe.snapshot import Snapshot
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.findings import HostVerdict, Verdict
from cleanslate.verdict.rules import Scope, evaluate


@dataclass(frozen=True)
class CheckOptions:
    """How to check a host. ``timeout`` bounds each probe source, in seconds."""

    scope: Scope = field(default_factory=Scope)
    ports: tuple[int, ...] = ()
    gpu_backend: str = "auto"
    timeout: float = DEFAULT_TIMEOUT_S
    baseline: Baseline | None = None


class UntilClean(BaseModel):
    """How ``--until-clean`` went: attempts made and when the host first read clean."""

    model_config = ConfigDict(frozen=True)

    deadline_s: float
    interval_s: float
    attempts: int
    clean_after_s: float | None


class CheckReport(BaseModel):
    """The document ``check --json`` prints (DESIGN section 2)."""

    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    checked_at: str
    elapsed_s: float
    hosts: tuple[HostVerdict, ...]
    until_clean: UntilClean | None = None

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


async def check_host(executor: Executor, options: CheckOptions) -> tuple[HostVerdict, Snapshot]:
    """Probe one host and judge it."""
    backend = await resolve_backend(options.gpu_backend, executor)
    since = options.baseline.kmsg_last_us if options.baseline else None
    snapshot = await probe_host(executor, backend, ports=list(options.ports),
                                timeout=options.timeout, kmsg_since_us=since)
    scope = options.scope
    if not executor.is_local:
        # Our PIDs mean nothing on another host; the collector excludes itself and its SSH
        # ancestors there (``collector_pid``).
        scope = dataclasses.replace(scope, exclude_roots=frozenset())
    return evaluate(snapshot, scope, options.baseline), snapshot


async def check_hosts(executors: list[Executor], options: CheckOptions) -> CheckReport:
    """Probe every host concurrently; the overall verdict is the worst one."""
    started = time.monotonic()
    checked_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    results = await asyncio.gather(*(check_host(e, options) for e in executors))
    hosts = tuple(r[0] for r in results)
    return CheckReport(
        verdict=Verdict.worst([h.verdict for h in hosts]),
        checked_at=checked_at,
        elapsed_s=round(time.monotonic() - started, 3),
        hosts=hosts,
    )


async def check_until_clean(
    executors: list[Executor], options: CheckOptions, *, deadline_s: float, interval_s: float = 0.5
) -> CheckReport:
    """Re-probe until every host is CLEAN or ``deadline_s`` seconds have passed.

    Memory is released asynchronously after a kill (milliseconds to minutes), so one reading
    proves nothing; this returns the first CLEAN report, or the last one at the deadline.
    """
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        report = await check_hosts(executors, options)
        elapsed = time.monotonic() - started
        done = report.verdict == Verdict.CLEAN or elapsed + interval_s > deadline_s
        if done:
            return report.model_copy(update={
                "elapsed_s": round(elapsed, 3),
                "until_clean": UntilClean(
                    deadline_s=deadline_s, interval_s=interval_s, attempts=attempts,
                    clean_after_s=round(elapsed, 3) if report.verdict == Verdict.CLEAN else None,
                ),
            })
        await asyncio.sleep(interval_s)
