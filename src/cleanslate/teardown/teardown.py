"""Teardown: end exactly what a run owns, then verify the host is clean (DESIGN section 4).

Scope is what the run owns: its recorded root PID, its process group and session, every process
carrying its ``CLEANSLATE_RUN`` marker, and the descendants of all of these found *before the
first signal* (after a parent dies, parent links are gone). Nothing outside the scope is ever
signalled; every signal goes through :mod:`cleanslate.teardown._signal`, which checks PID and
start time so a reused PID is never hit.

1. snapshot the scope; 2. SIGTERM the root and wait up to ``grace_s`` (engines free and unpin
memory here); 3. SIGTERM the rest, wait ``term_wait_s``; re-scan (markers catch setsid'd
grandchildren) and SIGKILL whatever is still in scope, until a scan finds nothing; 4. report
D-state survivors instead of hanging; 5. remove the run's own ``/dev/shm`` files and verify with
``check --until-clean`` on the run's GPUs and port. A ``/dev/shm`` file that a live process
still maps or holds open is never removed: once the scope is gone, its holder is someone else's
(another run, a benchmark client), whatever its name and time say.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import ProcessInfo, Snapshot
from cleanslate.verdict.check import CheckOptions, CheckReport, check_until_clean
from cleanslate.verdict.rules import excluded_pids

#: Why a process is in scope.
ROOT, SUPERVISOR, GROUP, SESSION, MARKER, DESCENDANT, NAMED, ENGINE = (
    "root", "supervisor", "process group", "session", "marker", "descendant", "named", "engine",
)


@dataclass(frozen=True)
class Target:
    """A process in scope, identified by PID *and* start time."""

    pid: int
    create_time: float
    comm: str
    command: str
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time, "comm": self.comm,
                "command": self.command[:200], "why": self.why}


@dataclass(frozen=True)
class ScopeSpec:
    """What to tear down. Any combination; the scope is the union plus descendants.

    ``not_before``: processes created earlier than this epoch time are not the run's even if
    they share a (reused) process group or session number.
    """

    root: tuple[int, float] | None = None
    supervisor: tuple[int, float] | None = None
    pgid: int | None = None
    sid: int | None = None
    marker: str | None = None
    pids: tuple[int, ...] = ()
    engine: str | None = None
    not_before: float | None = None
    exclude_roots: frozenset[int] = frozenset()


class SignalRound(BaseModel):
    model_config = ConfigDict(frozen=True)

    at_s: float
    signal: str
    sent: tuple[int, ...]


class TeardownReport(BaseModel):
    """What teardown did, and the verification that followed."""

    model_config = ConfigDict(frozen=True)

    targets: tuple[dict[str, Any], ...]
    rounds: tuple[SignalRound, ...] = ()
    killed: tuple[int, ...] = Field(default=(), description="PIDs that needed SIGKILL")
    root_exit_s: float | None = None
    d_state: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    shm_removed: tuple[str, ...] = ()
    shm_in_use: tuple[str, ...] = Field(
        default=(), description="the run's candidates left alone: a live process holds them")
    elapsed_s: float
    verify: CheckReport | None = None

    @property
    def exit_code(self) -> int:
        if self.verify is not None:
            return self.verify.exit_code
        return 1 if self.survivors else 0


@cache
def _signal_source() -> bytes:
    return resources.files("cleanslate.teardown").joinpath("_signal.py").read_bytes()


async def send_signal(executor: Executor, targets: Iterable[Target], signal: str,
                      timeout: float = 15.0) -> dict[str, Any]:
    """Signal targets that are still the same processes; ``signal`` ``"0"`` only tests them."""
    spec = {"signal": signal,
            "targets": [{"pid": t.pid, "create_time": t.create_time} for t in targets]}
    if not spec["targets"]:
        return {"sent": [], "gone": [], "reused": [], "zombie": [], "d_state": [], "errors": {}}
    result = await executor.run([executor.python, "-I", "-S", "-", json.dumps(spec)],
                                timeout=timeout, stdin=_signal_source())
    if not result.ok:
        raise OSError(f"could not signal processes on {executor.name}: "
                      f"{result.describe_failure()}")
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@cache
def _shm_holders_source() -> bytes:
    return resources.files("cleanslate.teardown").joinpath("_shm_holders.py").read_bytes()


async def shm_in_use(executor: Executor, names: Iterable[str], directory: str = "/dev/shm",
                     timeout: float = 15.0) -> dict[str, list[int]]:
    """``{name: [pid, ..]}`` for the named ``/dev/shm`` files that a live process maps or holds
    open (matched by inode). Raises :class:`OSError` when the host cannot be read."""
    spec = {"dir": directory, "names": sorted(set(names))}
    if not spec["names"]:
        return {}
    result = await executor.run([executor.python, "-I", "-S", "-", json.dumps(spec)],
                                timeout=timeout, stdin=_shm_holders_source())
    if not result.ok:
        raise OSError(f"could not read /dev/shm holders on {executor.name}: "
                      f"{result.describe_failure()}")
    held: dict[str, list[int]] = json.loads(result.stdout)["held"]
    return held


def resolve_scope(snapshot: Snapshot, spec: ScopeSpec) -> list[Target]:
    """The processes of the snapshot that ``spec`` owns, with their descendants."""
    own = excluded_pids(snapshot, spec.exclude_roots)
    by_pid = {p.pid: p for p in snapshot.processes}
    chosen: dict[int, str] = {}

    def recent(proc: ProcessInfo) -> bool:
        return spec.not_before is None or proc.create_time >= spec.not_before - 1.0

    for proc in snapshot.processes:
        if proc.pid in own:
            continue
        why = None
        if spec.root and proc.pid == spec.root[0] and _same(proc, spec.root[1]):
            why = ROOT
        elif spec.supervisor and proc.pid == spec.supervisor[0] and _same(proc, spec.supervisor[1]):
            why = SUPERVISOR
        elif spec.marker is not None and proc.run_marker == spec.marker:
            why = MARKER
        elif spec.pgid is not None and proc.pgid == spec.pgid and recent(proc):
            why = GROUP
        elif spec.sid is not None and proc.sid == spec.sid and recent(proc):
            why = SESSION
        elif proc.pid in spec.pids:
            why = NAMED
        elif spec.engine is not None:
            from cleanslate.engines.signatures import match_engine

            if match_engine(proc.comm, proc.cmdline, [spec.engine]):
                why = ENGINE
        if why is not None:
            chosen[proc.pid] = why
    children: dict[int, list[int]] = {}
    for proc in snapshot.processes:
        children.setdefault(proc.ppid, []).append(proc.pid)
    stack = list(chosen)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in chosen and child not in own:
                chosen[child] = DESCENDANT
                stack.append(child)
    return [
        Target(pid, by_pid[pid].create_time, by_pid[pid].comm, by_pid[pid].command, why)
        for pid, why in chosen.items()
        if by_pid[pid].state != "Z"
    ]


def _same(proc: ProcessInfo, create_time: float) -> bool:
    return abs(proc.create_time - create_time) <= 0.02


async def _scan(executor: Executor, spec: ScopeSpec) -> list[Target]:
    snapshot = await probe_host(executor, NoGpuBackend(), timeout=15.0)
    if not snapshot.sources or not all(s.ok for s in snapshot.sources if s.name == "processes"):
        raise OSError(f"could not list processes on {executor.name}: "
                      + "; ".join(str(s.error) for s in snapshot.sources if not s.ok))
    return resolve_scope(snapshot, spec)


async def _wait_gone(executor: Executor, targets: list[Target], seconds: float,
                     interval: float = 0.1) -> list[Target]:
    """Wait until every target is gone (or a zombie) or ``seconds`` pass; return the living."""
    deadline = time.monotonic() + seconds
    alive = list(targets)
    while alive:
        state = await send_signal(executor, alive, "0")
        dead = set(state["gone"]) | set(state["reused"]) | set(state["zombie"])
        alive = [t for t in alive if t.pid not in dead]
        if not alive or time.monotonic() >= deadline:
            break
        await asyncio.sleep(interval)
    return alive


async def teardown(
    executor: Executor,
    spec: ScopeSpec,
    *,
    grace_s: float = 30.0,
    term_wait_s: float = 5.0,
    kill_wait_s: float = 10.0,
    verify: CheckOptions | None = None,
    verify_deadline_s: float = 60.0,
    remove_shm: Callable[[Snapshot], list[str]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TeardownReport:
    """Tear down the scope (see the module docstring) and verify. Never signals outside it."""
    started = time.monotonic()
    say = progress or (lambda _msg: None)
    rounds: list[SignalRound] = []

    def stamp(signal: str, sent: Iterable[int]) -> None:
        rounds.append(SignalRound(at_s=round(time.monotonic() - started, 3), signal=signal,
                                  sent=tuple(sent)))

    scope = await _scan(executor, spec)
    every: dict[int, Target] = {t.pid: t for t in scope}
    say(f"{len(scope)} processes in scope")
    root_exit: float | None = None
    roots = [t for t in scope if t.why == ROOT] or [t for t in scope if t.why == NAMED]
    if roots:
        sent = await send_signal(executor, roots, "SIGTERM")
        stamp("SIGTERM", sent["sent"])
        say(f"SIGTERM to {', '.join(str(t.pid) for t in roots)}; waiting up to {grace_s:g} s")
        alive_roots = await _wait_gone(executor, roots, grace_s)
        if not alive_roots:
            root_exit = round(time.monotonic() - started, 3)
    rest = [t for t in scope if t not in roots]
    living = await _wait_gone(executor, rest, 0.0) if rest else []
    if living:
        # The supervisor goes last: it reaps the others.
        ordered = [t for t in living if t.why != SUPERVISOR]
        sent = await send_signal(executor, ordered, "SIGTERM")
        stamp("SIGTERM", sent["sent"])
        await _wait_gone(executor, ordered, term_wait_s)
    killed: list[int] = []
    d_state: set[int] = set()
    for _attempt in range(5):
        rescan = await _scan(executor, spec)
        for t in rescan:
            every.setdefault(t.pid, t)
        alive = await _wait_gone(executor, list({**{t.pid: t for t in scope},
                                                  **{t.pid: t for t in rescan}}.values()), 0.0)
        workers = [t for t in alive if t.why != SUPERVISOR]
        if not workers:
            break
        sent = await send_signal(executor, workers, "SIGKILL")
        stamp("SIGKILL", sent["sent"])
        killed += [pid for pid in sent["sent"] if pid not in killed]
        say(f"SIGKILL to {', '.join(map(str, sent['sent']))}")
        still = await _wait_gone(executor, workers, kill_wait_s)
        d_state |= set((await send_signal(executor, still, "0"))["d_state"])
        if still and {t.pid for t in still} <= d_state:
            break  # uninterruptible: report, do not hang
        scope = rescan
    # The supervisor (subreaper) exits by itself once its children are reaped; end it if not.
    supervisors = [t for t in every.values() if t.why == SUPERVISOR]
    if supervisors and await _wait_gone(executor, supervisors, 2.0):
        sent = await send_signal(executor, supervisors, "SIGKILL")
        stamp("SIGKILL", sent["sent"])
    survivors = await _wait_gone(executor, list(every.values()), 0.0)
    shm_removed: list[str] = []
    held: list[str] = []
    if remove_shm is not None:
        snapshot = await probe_host(executor, NoGpuBackend(), timeout=15.0)
        candidates = remove_shm(snapshot)
        # The scope is gone: a candidate still mapped or open is another process's live file.
        try:
            holders = await shm_in_use(executor, candidates)
        except OSError as exc:
            say(f"not removing /dev/shm files: {exc}")
            holders = {name: [] for name in candidates}
        held = [name for name in candidates if name in holders]
        shm_removed = [name for name in candidates if name not in holders]
        if held:
            say(f"left /dev/shm/{{{', '.join(held)}}}: still in use by another process")
        if shm_removed:
            await executor.run(["rm", "-f", "--", *(f"/dev/shm/{n}" for n in shm_removed)],
                               timeout=15.0)
    report: CheckReport | None = None
    if verify is not None:
        say(f"verifying (until clean, deadline {verify_deadline_s:g} s)")
        report = await check_until_clean([executor], verify, deadline_s=verify_deadline_s,
                                         interval_s=0.25)
    return TeardownReport(
        targets=tuple(t.as_dict() for t in every.values()),
        rounds=tuple(rounds),
        killed=tuple(killed),
        root_exit_s=root_exit,
        d_state=tuple(sorted(d_state)),
        survivors=tuple(t.pid for t in survivors),
        shm_removed=tuple(shm_removed),
        shm_in_use=tuple(held),
        elapsed_s=round(time.monotonic() - started, 3),
        verify=report,
    )
