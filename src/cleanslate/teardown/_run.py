"""A teardown, phase by phase (``docs/teardown.md``): who is in scope (:mod:`.scope`) is
decided on a fresh snapshot before the first signal, and every signal goes through
:mod:`cleanslate.teardown._signal_script`, which checks PID and start time, so a reused PID is
never hit.

1. **scan**: the scope now (a recorded cgroup that is not the run's own is ignored; without
   a cgroup, the tree the run's supervisor recorded is read beside the probe);
2. **roots**: SIGTERM the run's root and wait up to ``grace_s`` (engines free and unpin memory
   here);
3. **the rest**: SIGTERM what is left, the supervisor last, and wait ``term_wait_s``;
4. **until gone**: re-scan (markers and the cgroup catch setsid'd grandchildren) and SIGKILL
   whatever is still in scope (``cgroup.kill`` too, race-free against forks), until a scan
   finds nothing; D-state survivors are reported, not waited on forever;
5. **supervisors**: the subreaper exits once its children are reaped, else it is ended;
6. **cgroup**: the run's empty cgroup is removed;
7. **shm**: the run's own ``/dev/shm`` files are removed, except one that a live process still
   maps or holds open (once the scope is gone, its holder is someone else's, whatever its name
   and time say);
8. **verify**: ``check --until-clean`` on the run's GPUs and port.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.base import GpuBackend
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import Snapshot
from cleanslate.teardown._host import (
    cgroup_kill,
    cgroup_members,
    cgroup_op,
    send_signal,
    shm_in_use,
    user_names,
    wait_gone,
)
from cleanslate.teardown._records import (
    ScopeSpec,
    Selected,
    SignalRound,
    Target,
    TeardownReport,
)
from cleanslate.teardown._tree import read_tree
from cleanslate.teardown.scope import same_process, scope_and_protected
from cleanslate.verdict.check import (
    DEFAULT_SETTLE_S,
    CheckOptions,
    CheckReport,
    check_one,
    check_until_clean,
)

#: Rescans (each followed by SIGKILL to what it still finds) before a teardown gives up.
KILL_ROUNDS = 5


@dataclass
class _Scan:
    targets: list[Target]
    protected: list[Target]
    members: frozenset[int] | None
    snapshot: Snapshot
    reading: CheckReport | None = None  # the verification's reading of the same snapshot
    cgroup_refused: str | None = None  # why the recorded cgroup is not the run's
    tree_refused: str | None = None  # why the run's recorded tree file is not used

    def living(self, targets: Iterable[Target]) -> list[Target]:
        """The targets that this scan saw alive (same start time, not a zombie)."""
        by_pid = self.snapshot.by_pid
        boot = self.snapshot.boot_time
        return [t for t in targets if (p := by_pid.get(t.pid)) is not None
                and not p.is_zombie and same_process(p, t.create_time, t.boot_time, boot)]


async def _scan(executor: Executor, spec: ScopeSpec, *, gpu: GpuBackend | None = None,
                users: dict[int, str | None] | None = None,
                verify: CheckOptions | None = None, cgroup_checked: bool = False) -> _Scan:
    """The scope now. With ``verify`` (and no port to read that verification does not read),
    the snapshot is the one a verification reading judges, and that reading comes with it.
    ``cgroup_checked``: see :func:`cleanslate.teardown._host.cgroup_members`."""
    if not executor.is_local:
        spec = replace(spec, exclude_roots=frozenset())  # our PIDs mean nothing there
    ports = [spec.port] if spec.port is not None and (spec.pgid or spec.sid) else []
    verified: CheckReport | None = None
    taken: Snapshot | None = None
    # The cgroup is read beside the probe: unchecked, that is a command on the host.
    cgroup = asyncio.ensure_future(cgroup_members(executor, spec, checked=cgroup_checked)) \
        if spec.cgroup else None
    # Without a (checked) cgroup, the tree the supervisor recorded says who the run's are.
    tree = asyncio.ensure_future(read_tree(executor, spec.tree, spec.uid)) \
        if spec.tree is not None and not cgroup_checked else None
    try:
        if verify is not None and set(ports) <= set(verify.ports):
            verified, taken = await check_one(executor, verify)
        snapshot = taken if taken is not None else \
            await probe_host(executor, NoGpuBackend(), ports=ports, timeout=15.0)
    except BaseException:
        for pending in (cgroup, tree):
            if pending is not None:
                pending.cancel()  # the executor ends the command it was running
                with contextlib.suppress(BaseException):
                    await pending
        raise
    members, refused = await cgroup if cgroup is not None else (None, None)
    recorded, tree_refused = await tree if tree is not None else (None, None)
    if not snapshot.sources or not all(s.ok for s in snapshot.sources if s.name == "processes"):
        raise OSError(f"could not list processes on {executor.name}: "
                      + "; ".join(str(s.error) for s in snapshot.sources if not s.ok))
    if gpu is not None and members is None and (spec.pgid or spec.sid) \
            and not isinstance(gpu, NoGpuBackend) \
            and not (taken is not None and taken.gpu.ok and taken.gpu.backend == gpu.name):
        # GPU holdings are evidence for group and session members; read them only when needed
        # (a verification snapshot has them already). A failed reading only means no evidence.
        with contextlib.suppress(Exception):
            reading = await asyncio.wait_for(gpu.read(executor, 15.0), 17.0)
            if reading.ok:
                snapshot = snapshot.model_copy(update={"gpu": reading})
    targets, protected = scope_and_protected(snapshot, spec, cgroup_members=members,
                                             recorded=recorded)
    if users is not None:
        await user_names(executor, [t.uid for t in (*targets, *protected)], users)
        targets = [replace(t, user=users.get(t.uid) if t.uid is not None else None)
                   for t in targets]
        protected = [replace(t, user=users.get(t.uid) if t.uid is not None else None)
                     for t in protected]
    return _Scan(targets, protected, members, snapshot, verified if taken else None, refused,
                 tree_refused if members is None else None)


async def scan_scope(executor: Executor, spec: ScopeSpec) -> tuple[list[Target], list[Target]]:
    """The scope on the host now, and the protected processes a path matched (with owners)."""
    scan = await _scan(executor, spec, users={})
    return scan.targets, scan.protected


@dataclass
class _Teardown:
    """One teardown as it goes through its phases: what it has seen, sent and found."""

    executor: Executor
    spec: ScopeSpec
    say: Callable[[str], None]
    gpu: GpuBackend | None
    started: float = field(default_factory=time.monotonic)
    rounds: list[SignalRound] = field(default_factory=list)
    users: dict[int, str | None] = field(default_factory=dict)
    every: dict[int, Target] = field(default_factory=dict)  # every target seen, by PID
    left_alone: dict[int, Target] = field(default_factory=dict)
    killed: list[int] = field(default_factory=list)
    d_state: set[int] = field(default_factory=set)
    cgroup_killed: bool = False
    cgroup_refused: str | None = None
    root_exit_s: float | None = None
    #: The last rescan, while nothing was signalled after it: its snapshot (and verification
    #: reading) is still current.
    last: _Scan | None = None

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 3)

    async def signal(self, targets: list[Target], signal: str) -> list[int]:
        """Send ``signal`` to the targets that are still themselves; the PIDs it reached."""
        sent = (await send_signal(self.executor, targets, signal))["sent"]
        self.rounds.append(SignalRound(at_s=self.elapsed(), signal=signal, sent=tuple(sent)))
        return sent

    def saw(self, scan: _Scan) -> None:
        for t in scan.targets:
            self.every.setdefault(t.pid, t)
        for t in scan.protected:
            self.left_alone.setdefault(t.pid, t)

    async def scan(self) -> _Scan:
        """Phase 1: the scope before the first signal."""
        first = await _scan(self.executor, self.spec, gpu=self.gpu, users=self.users)
        self.cgroup_refused = first.cgroup_refused
        if first.cgroup_refused is not None:
            # Not the run's cgroup: the scan read no members, so the number paths were on.
            self.say(f"ignoring the recorded cgroup {self.spec.cgroup}: {first.cgroup_refused}")
            self.spec = replace(self.spec, cgroup=None)
        if first.tree_refused is not None:
            self.say(first.tree_refused)
        self.saw(first)
        self.say(f"{len(first.targets)} processes in scope"
                 + (f" (cgroup {self.spec.cgroup}: {len(first.members)} members)"
                    if first.members is not None else ""))
        if self.left_alone:
            self.say(f"left alone (protected): {', '.join(map(str, sorted(self.left_alone)))}")
        return first

    async def end_roots(self, scope: list[Target], grace_s: float) -> list[Target]:
        """Phase 2: SIGTERM to the run's root (or the processes named), then up to
        ``grace_s`` for it to exit. Returns the roots."""
        roots = [t for t in scope if t.why == Selected.ROOT] \
            or [t for t in scope if t.why == Selected.NAMED]
        if roots:
            await self.signal(roots, "SIGTERM")
            self.say(f"SIGTERM to {', '.join(str(t.pid) for t in roots)}; "
                     f"waiting up to {grace_s:g} s")
            if not await wait_gone(self.executor, roots, grace_s):
                self.root_exit_s = self.elapsed()
        return roots

    async def end_the_rest(self, rest: list[Target], term_wait_s: float) -> None:
        """Phase 3: SIGTERM to the rest still alive (the supervisor last: it reaps the
        others), then up to ``term_wait_s``."""
        living = await wait_gone(self.executor, rest, 0.0) if rest else []
        if living:
            ordered = [t for t in living if t.why != Selected.SUPERVISOR]
            await self.signal(ordered, "SIGTERM")
            await wait_gone(self.executor, ordered, term_wait_s)

    async def kill_until_gone(self, first: _Scan, kill_wait_s: float,
                              verify: CheckOptions | None) -> None:
        """Phase 4: rescan and SIGKILL (and ``cgroup.kill``) until a scan finds nothing of
        the scope but supervisors, or only processes in uninterruptible sleep are left."""
        scope = first.targets
        spec = self.spec
        for attempt in range(KILL_ROUNDS):
            # The first rescan is also the verification's first reading when nothing is left.
            rescan = await _scan(self.executor, spec, gpu=self.gpu, users=self.users,
                                 verify=verify if attempt == 0 else None,
                                 cgroup_checked=first.members is not None)
            self.last = rescan
            members = rescan.members
            self.saw(rescan)
            alive = rescan.living({**{t.pid: t for t in scope},
                                   **{t.pid: t for t in rescan.targets}}.values())
            workers = [t for t in alive if t.why != Selected.SUPERVISOR]
            if not workers and not members:
                return
            self.last = None
            # Race-free against forks: the kernel kills every member, new children included.
            if spec.cgroup and members and not members & set(self.left_alone) \
                    and await cgroup_kill(self.executor, spec):
                self.cgroup_killed = True
                self.rounds.append(SignalRound(at_s=self.elapsed(), signal="cgroup.kill",
                                               sent=tuple(sorted(members))))
                self.killed += [pid for pid in sorted(members) if pid not in self.killed]
                self.say(f"cgroup.kill on {spec.cgroup} ({len(members)} members)")
            if not workers:
                await asyncio.sleep(0.1)  # members not yet reaped (after a cgroup.kill)
                continue
            sent = await self.signal(workers, "SIGKILL")
            self.killed += [pid for pid in sent if pid not in self.killed]
            if sent:
                self.say(f"SIGKILL to {', '.join(map(str, sent))}")
            still = await wait_gone(self.executor, workers, kill_wait_s)
            self.d_state |= set((await send_signal(self.executor, still, "0"))["d_state"])
            if still and {t.pid for t in still} <= self.d_state:
                return  # uninterruptible: report, do not hang
            scope = rescan.targets

    async def end_supervisors(self) -> list[Target]:
        """Phase 5: the supervisor (a subreaper) exits by itself once its children are reaped;
        ended if it has not within 2 s. Returns the survivors of the whole scope."""
        supervisors = [t for t in self.every.values() if t.why == Selected.SUPERVISOR]
        if self.last is not None:
            supervisors = self.last.living(supervisors)
        if supervisors and await wait_gone(self.executor, supervisors, 2.0):
            await self.signal(supervisors, "SIGKILL")
            self.last = None
        # The last rescan saw every target gone but the supervisors, which are waited on above.
        if self.last is not None:
            return []
        return await wait_gone(self.executor, list(self.every.values()), 0.0)

    async def remove_cgroup(self) -> tuple[bool, frozenset[int]]:
        """Phase 6: remove the run's cgroup once empty (one command on the host that waits up
        to 5 s for the last members to be reaped). Returns (removed, PIDs still in it)."""
        spec = self.spec
        if not spec.cgroup:
            return False, frozenset()
        done = await cgroup_op(self.executor, spec.cgroup, "remove", uid=spec.uid,
                               cgroup_id=spec.cgroup_id, wait_s=5.0)
        left: frozenset[int] = frozenset()
        removed = False
        if done.get("ok"):
            left = frozenset(done.get("members", []))
            removed = bool(done.get("removed")) or not done.get("exists", True)
        elif done.get("refused"):
            self.say(f"not removing the cgroup {spec.cgroup}: {done['refused']}")
        if left:
            self.say(f"cgroup {spec.cgroup} still has {sorted(left)}: not removed")
        return removed, left

    async def remove_shm(self, choose: Callable[[Snapshot], list[str]]
                         ) -> tuple[list[str], list[str]]:
        """Phase 7: remove the run's ``/dev/shm`` files (``choose`` names them from a current
        snapshot) that no live process holds. Returns (removed, left in use)."""
        snapshot = self.last.snapshot if self.last is not None \
            else await probe_host(self.executor, NoGpuBackend(), timeout=15.0)
        candidates = choose(snapshot)
        # The scope is gone: a candidate still mapped or open is another process's live file.
        try:
            holders = await shm_in_use(self.executor, candidates)
        except OSError as exc:
            self.say(f"not removing /dev/shm files: {exc}")
            holders = {name: [] for name in candidates}
        held = [name for name in candidates if name in holders]
        removed = [name for name in candidates if name not in holders]
        if held:
            self.say(f"left /dev/shm/{{{', '.join(held)}}}: still in use by another process")
        if removed:
            await self.executor.run(["rm", "-f", "--", *(f"/dev/shm/{n}" for n in removed)],
                                    timeout=15.0)
        return removed, held

    async def verify(self, options: CheckOptions, deadline_s: float, settle_s: float,
                     shm_removed: bool) -> CheckReport:
        """Phase 8: check until clean. The last rescan's reading is the first when it saw
        nothing of the scope alive (not even a supervisor about to exit) and nothing was
        signalled or removed since."""
        self.say(f"verifying (until clean, deadline {deadline_s:g} s)")
        current = self.last.reading if self.last is not None and not shm_removed \
            and not self.last.living(self.every.values()) else None
        return await check_until_clean([self.executor], options, deadline_s=deadline_s,
                                       interval_s=0.25, settle_s=settle_s, first=current)


async def teardown(
    executor: Executor,
    spec: ScopeSpec,
    *,
    grace_s: float = 30.0,
    term_wait_s: float = 5.0,
    kill_wait_s: float = 10.0,
    verify: CheckOptions | None = None,
    verify_deadline_s: float = 60.0,
    verify_settle_s: float = DEFAULT_SETTLE_S,
    remove_shm: Callable[[Snapshot], list[str]] | None = None,
    progress: Callable[[str], None] | None = None,
    gpu: GpuBackend | None = None,
) -> TeardownReport:
    """Tear down the scope (see the module docstring) and verify. Never signals outside it.

    ``gpu`` reads GPU holdings, the evidence that admits a process found only by its group or
    session number when it does not carry the engine's signature.
    """
    run = _Teardown(executor, spec, progress or (lambda _msg: None), gpu)
    first = await run.scan()
    roots = await run.end_roots(first.targets, grace_s)
    await run.end_the_rest([t for t in first.targets if t not in roots], term_wait_s)
    await run.kill_until_gone(first, kill_wait_s, verify)
    survivors = await run.end_supervisors()
    cgroup_removed, cgroup_left = await run.remove_cgroup()
    shm_removed, held = await run.remove_shm(remove_shm) if remove_shm is not None else ([], [])
    report = await run.verify(verify, verify_deadline_s, verify_settle_s, bool(shm_removed)) \
        if verify is not None else None
    return TeardownReport(
        targets=tuple(t.record() for t in run.every.values()),
        left_alone=tuple(t.record() for t in run.left_alone.values()),
        rounds=tuple(run.rounds),
        killed=tuple(run.killed),
        root_exit_s=run.root_exit_s,
        d_state=tuple(sorted(run.d_state)),
        survivors=tuple(t.pid for t in survivors),
        cgroup=run.spec.cgroup,
        cgroup_refused=run.cgroup_refused,
        cgroup_killed=run.cgroup_killed,
        cgroup_removed=cgroup_removed,
        cgroup_left=tuple(sorted(cgroup_left)),
        shm_removed=tuple(shm_removed),
        shm_in_use=tuple(held),
        elapsed_s=run.elapsed(),
        verify=report,
    )


async def skip_teardown(
    executor: Executor,
    reason: str,
    code: int | None,
    *,
    verify: CheckOptions | None = None,
    verify_deadline_s: float = 60.0,
    verify_settle_s: float = DEFAULT_SETTLE_S,
    progress: Callable[[str], None] | None = None,
) -> TeardownReport:
    """A teardown that signals nothing (the record names no process of this host), with the
    verification still run when ``verify`` is given."""
    started = time.monotonic()
    say = progress or (lambda _msg: None)
    say(f"not signalling anything: {reason}")
    report: CheckReport | None = None
    if verify is not None:
        say(f"verifying (until clean, deadline {verify_deadline_s:g} s)")
        report = await check_until_clean([executor], verify, deadline_s=verify_deadline_s,
                                         interval_s=0.25, settle_s=verify_settle_s)
    return TeardownReport(targets=(), refused=reason, refused_code=code,
                          elapsed_s=round(time.monotonic() - started, 3), verify=report)


__all__ = ["KILL_ROUNDS", "scan_scope", "skip_teardown", "teardown"]
