"""Check hosts: probe, apply the rules, and optionally re-probe until clean.

This is what ``cleanslate check`` runs, and what teardown and the tuner call to verify a state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cleanslate.errors import InputError
from cleanslate.hosts.base import Executor
from cleanslate.models import Frozen
from cleanslate.probe.gpu.base import GpuBackend, resolve_backend
from cleanslate.probe.host import DEFAULT_TIMEOUT_S, probe_host
from cleanslate.probe.snapshot import Snapshot
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.findings import Finding, FindingKind, HostVerdict, Severity, Verdict
from cleanslate.verdict.rules import Scope, evaluate

#: Seconds the host must keep reading clean before ``--until-clean`` (and the verification after
#: a teardown) reports CLEAN. Measured with ``benchmarks/settle_window.py`` on a 2-core machine
#: (docs/check.md): against a stray restarted by its parent (lives 0.05-0.3 s, away 0.1-0.3 s),
#: the first clean reading gave a false CLEAN in 120 of 120 trials, a 0.25 s window in 5 of
#: 120, a 0.5 s window in 0 of 120; on a clean host the 0.5 s window takes 0.60 s (p50) where
#: one reading takes 0.04 s.
DEFAULT_SETTLE_S = 0.5

#: Clean readings a settle window needs at least (besides lasting ``settle_s``).
MIN_SETTLE_READINGS = 3

#: Seconds between readings inside a settle window: back to back, so that a stray that lives
#: only between two slow readings is still seen.
SETTLE_PAUSE_S = 0.02

#: Seconds for which readings stay back to back while only a release is awaited (GPU memory
#: held by no process, a zombie not yet reaped); after that they come every ``interval_s``.
FAST_RELEASE_S = 10.0

#: Findings that a host's own release clears without anyone acting: after the last process of
#: a run is gone, the driver returns its memory and its parent reaps its zombies. GPU memory
#: that a visible process holds is not a release (``evidence["pids"]``). Readings with only
#: these are taken back to back but never count toward the settle window (issue 23: a window
#: opened on a release let a stray restarted just after it read CLEAN).
RELEASING = frozenset({FindingKind.GPU_MEMORY_HELD, FindingKind.ZOMBIE})


@dataclass(frozen=True)
class CheckOptions:
    """How to check a host. ``timeout`` bounds each probe source, in seconds. ``listeners``:
    read every listening socket, on any port (a baseline records them; a check against a
    baseline always reads them). ``gpu_backend``: a backend name (``auto`` resolved per host)
    or an instance already configured for a run (the sim engine's ledger). ``exclusions``:
    read after each probe, markers of runs that are not this check's business, added to the
    scope's ``exclude_markers`` (a study's other slots on the host: a run that launched while
    the probe ran is known by then, since its marker is recorded before its launch)."""

    scope: Scope = field(default_factory=Scope)
    ports: tuple[int, ...] = ()
    gpu_backend: str | GpuBackend = "auto"
    timeout: float = DEFAULT_TIMEOUT_S
    baseline: Baseline | None = None
    listeners: bool = False
    exclusions: Callable[[], frozenset[str]] | None = None


class UntilClean(Frozen):
    """How ``--until-clean`` went.

    ``attempts``: readings taken. ``clean_after_s``: seconds from the start to the first clean
    reading of the window that held (``None``: it never held). ``settle_s``: how long the window
    had to hold; ``window_after_s``: when its first reading ended (the window opens only on a
    clean reading, so it equals ``clean_after_s``; kept for the document's readers);
    ``clean_for_s`` and ``clean_readings``: how long (from the window's first reading to its
    last) and over how many readings it held at the end (0 when the last reading was not
    clean). ``respawned``: an engine process appeared after the window had opened, or after
    readings that showed only a release (the verdict is then DIRTY, with a ``respawned``
    finding).
    """

    deadline_s: float
    interval_s: float
    attempts: int
    clean_after_s: float | None
    settle_s: float = 0.0
    clean_for_s: float = 0.0
    clean_readings: int = 0
    window_after_s: float | None = None
    respawned: bool = False


class CheckReport(Frozen):
    """The document ``check --json`` prints (a contract: fields may be added, never renamed;
    ``docs/check.md``)."""

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
    baseline = options.baseline
    snapshot = await probe_host(
        executor, backend, ports=list(options.ports), timeout=options.timeout,
        kmsg_since_us=baseline.kmsg_last_us if baseline else None,
        kmsg_since_boot_id=baseline.boot_id if baseline else None,
        listeners=options.listeners or baseline is not None,
    )
    scope = options.scope
    if not executor.is_local:
        # Our PIDs mean nothing on another host; the collector excludes itself and its SSH
        # ancestors there (``collector_pid``).
        scope = dataclasses.replace(scope, exclude_roots=frozenset())
    if options.exclusions is not None:
        scope = dataclasses.replace(
            scope, exclude_markers=scope.exclude_markers | options.exclusions())
    return evaluate(snapshot, scope, baseline), snapshot


async def _checked(executor: Executor, options: CheckOptions) -> HostVerdict:
    return (await _checked_with_snapshot(executor, options))[0]


async def _checked_with_snapshot(executor: Executor, options: CheckOptions
                                 ) -> tuple[HostVerdict, Snapshot | None]:
    """:func:`check_host`, where a failure of the checker itself (a bug, a backend that raised)
    makes the host UNKNOWN with the reason instead of ending the whole check."""
    started = time.monotonic()
    try:
        return await check_host(executor, options)
    except InputError:
        raise  # bad input: the caller reports it
    except Exception as exc:
        return HostVerdict(
            host=executor.name, verdict=Verdict.UNKNOWN,
            gpu_backend=options.gpu_backend if isinstance(options.gpu_backend, str)
            else options.gpu_backend.name,
            findings=(Finding(kind=FindingKind.PROBE_ERROR, severity=Severity.UNKNOWN,
                              message=f"the check failed: {type(exc).__name__}: {exc}",
                              evidence={"error": f"{type(exc).__name__}: {exc}"}),),
            probed_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            probe_elapsed_s=round(time.monotonic() - started, 4),
        ), None


async def check_hosts(executors: list[Executor], options: CheckOptions) -> CheckReport:
    """Probe every host concurrently; the overall verdict is the worst one."""
    started = time.monotonic()
    checked_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    hosts = tuple(await asyncio.gather(*(_checked(e, options) for e in executors)))
    return _report(hosts, checked_at, started)


def _report(hosts: tuple[HostVerdict, ...], checked_at: str, started: float) -> CheckReport:
    return CheckReport(
        verdict=Verdict.worst([h.verdict for h in hosts]),
        checked_at=checked_at,
        elapsed_s=round(time.monotonic() - started, 3),
        hosts=hosts,
    )


async def check_one(executor: Executor, options: CheckOptions
                    ) -> tuple[CheckReport, Snapshot | None]:
    """One host's check report, with the snapshot it judged (``None`` when the check itself
    failed): a teardown reads its scope from the same snapshot that verifies it."""
    started = time.monotonic()
    checked_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    host, snapshot = await _checked_with_snapshot(executor, options)
    return _report((host,), checked_at, started), snapshot


def _strays(report: CheckReport) -> list[tuple[str, Finding]]:
    return [(host.host, f) for host in report.hosts for f in host.findings
            if f.kind == FindingKind.STRAY_PROCESS and f.severity == Severity.ERROR]


def _mark_respawned(report: CheckReport, clean_for_s: float, *, clean: bool = True
                    ) -> CheckReport:
    """Add a ``respawned`` finding for each engine process seen after the settle window
    opened: on a clean reading (``clean``), or on one where only a release was under way."""
    since = "the host had read clean" if clean else \
        "the host had read with no process left (only a release under way)"
    hosts = []
    for host in report.hosts:
        extra = []
        for finding in host.findings:
            if finding.kind != FindingKind.STRAY_PROCESS or finding.severity != Severity.ERROR:
                continue
            parent = finding.evidence.get("ppid")
            extra.append(Finding(
                kind=FindingKind.RESPAWNED, severity=Severity.ERROR, pid=finding.pid,
                message=f"an engine process appeared {clean_for_s:.2f} s after {since} "
                        f"(PID {finding.pid}, parent PID {parent}): something keeps "
                        "starting it; " + finding.message,
                evidence={**finding.evidence, "clean_for_s": round(clean_for_s, 3)},
            ))
        if extra:
            host = host.model_copy(update={"findings": (*host.findings, *extra),
                                           "verdict": Verdict.DIRTY})
        hosts.append(host)
    return report.model_copy(update={"hosts": tuple(hosts), "verdict": Verdict.DIRTY})


async def check_until_clean(
    executors: list[Executor], options: CheckOptions, *, deadline_s: float,
    interval_s: float = 0.5, settle_s: float = DEFAULT_SETTLE_S,
    first: CheckReport | None = None,
) -> CheckReport:
    """Re-probe until every host has read CLEAN at the end of a settle window of ``settle_s``
    seconds, or ``deadline_s`` seconds have passed.

    Memory is released asynchronously after a kill (milliseconds to minutes), so one reading
    proves nothing, and one clean reading proves little: a parent that keeps restarting a stray
    leaves gaps in which the host reads clean. So a *settle window* must hold before CLEAN: it
    opens on a CLEAN reading, readings follow back to back, none may show a process or anything
    else wrong, and the window must last ``settle_s`` seconds (from the end of its first reading
    to the end of its last) over at least :data:`MIN_SETTLE_READINGS` readings.

    A reading whose only errors are a release still under way (:data:`RELEASING`: GPU memory
    held by no process, a zombie) does not open the window: a release shortens nothing but
    itself. While only a release is awaited, readings stay back to back for
    :data:`FAST_RELEASE_S` seconds (then come every ``interval_s``), so the window opens with
    the first reading after the memory is back. An engine process (a ``stray_process`` error)
    seen while the window is open, or after release readings, ends the wait at once as DIRTY,
    with a ``respawned`` finding: a parent that restarts a stray just after its memory is freed
    is caught inside the window that the first clean reading opens. Any other error closes the
    window (memory that comes back after a clean reading too); the next clean reading opens a
    new one.

    Readings start only before the deadline; a window they open may finish after it, by at
    most ``settle_s`` plus one reading. ``settle_s=0`` accepts the first clean reading (not
    recommended). ``first``: a reading of every host taken just before the call, used as the
    first one. Returns the last report, with :class:`UntilClean` saying how it went.
    """
    started = time.monotonic()
    attempts = 0
    window_start: float | None = None  # when the window's first (clean) reading ended
    releasing_since: float | None = None  # when the release readings before it began
    readings = 0

    def done(report: CheckReport, elapsed: float, *, respawned: bool = False) -> CheckReport:
        clean = report.verdict == Verdict.CLEAN and window_start is not None
        return report.model_copy(update={
            "elapsed_s": round(elapsed, 3),
            "until_clean": UntilClean(
                deadline_s=deadline_s, interval_s=interval_s, attempts=attempts,
                clean_after_s=round(window_start, 3) if clean and window_start is not None
                else None,
                settle_s=settle_s,
                clean_for_s=round(elapsed - window_start, 3) if clean and window_start
                is not None else 0.0,
                clean_readings=readings if clean else 0,
                window_after_s=round(window_start, 3) if clean and window_start is not None
                else None,
                respawned=respawned,
            ),
        })

    while True:
        attempts += 1
        report = first if first is not None and attempts == 1 \
            else await check_hosts(executors, options)
        elapsed = time.monotonic() - started
        if report.verdict == Verdict.CLEAN:
            if window_start is None:
                window_start, readings, releasing_since = elapsed, 0, None
            readings += 1
            if elapsed - window_start >= settle_s and (
                    settle_s <= 0 or readings >= MIN_SETTLE_READINGS):
                return done(report, elapsed)
            await asyncio.sleep(min(interval_s, SETTLE_PAUSE_S))
            continue
        if (window_start is not None or releasing_since is not None) and _strays(report):
            since = window_start if window_start is not None else releasing_since
            assert since is not None
            return done(_mark_respawned(report, elapsed - since, clean=window_start is not None),
                        elapsed, respawned=True)
        if window_start is None and _releasing(report):
            # Only the release itself is waited for, back to back; the window has not opened.
            if releasing_since is None:
                releasing_since = elapsed
            if elapsed + SETTLE_PAUSE_S > deadline_s:
                return done(report, elapsed)
            fast = elapsed - releasing_since < FAST_RELEASE_S
            await asyncio.sleep(min(interval_s, SETTLE_PAUSE_S) if fast else interval_s)
            continue
        window_start, releasing_since, readings = None, None, 0
        if elapsed + interval_s > deadline_s:
            return done(report, elapsed)
        await asyncio.sleep(interval_s)


def _releasing(report: CheckReport) -> bool:
    """Is every error of this reading a release still under way (and every host read)?"""
    return report.verdict == Verdict.DIRTY and all(
        host.verdict != Verdict.UNKNOWN
        and all(f.kind in RELEASING and not f.evidence.get("pids")
                for f in host.findings if f.severity == Severity.ERROR)
        for host in report.hosts)
