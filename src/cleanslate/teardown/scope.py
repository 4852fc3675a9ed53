"""What a teardown may end: the pure selection over a snapshot (``docs/teardown.md``).

**Scope** (:func:`resolve_scope`; reads nothing but its arguments).
A process is in scope when one of these selects it:

- ``root`` / ``supervisor``: the recorded PID *with* its recorded start time;
- ``cgroup``: a member of the run's own cgroup (v2), which no descendant leaves by forking,
  renaming or re-executing itself;
- ``marker``: ``CLEANSLATE_RUN=<run id>`` in its environment;
- ``recorded`` (only while the run has no cgroup): its PID *and* start time are in the tree its
  supervisor recorded (:mod:`cleanslate.teardown._tree`), on this boot, and it started after
  the run (less :data:`START_SLACK_S`);
- ``process group`` / ``session`` numbers select **nothing**: a number can be reused (PID
  reuse, a store shared between machines) by a process of the same user, in the run's time
  window, holding the run's GPU. A process carrying the run's number that looks like the run's
  (it holds the run's GPUs or port, its environment cannot be read, or it carries the engine's
  signature) is *reported* (``left_alone``, with why it is not verified as the run's: the
  number was reused, it is another user's, or the supervisor did not record it), never
  signalled. When the run has a cgroup the number and tree paths are off: the cgroup says who
  is the run's. A recorded cgroup is used only when, on the host, it is a directory of a cgroup
  v2 file system (``statfs``), owned by the run's user, the very one its supervisor created
  (:mod:`cleanslate.teardown._cgroup_script`); else it is ignored (``cgroup_refused``);
- ``named`` / ``engine``: what ``clean --pid`` / ``clean --engine`` ask for;
- ``descendant``: a child, at any depth, of a selected process, found *before the first signal*.

**Never** selected, by any path: PID 1, kernel threads, this process's ancestors (locally; the
collector's ancestors on a remote host), the members of this process's session, and this
process's own children (:func:`protected_pids`).
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Collection
from datetime import UTC, datetime

from cleanslate.engines import find_signature, match_engine
from cleanslate.probe.snapshot import ProcessInfo, Snapshot, is_kernel_thread
from cleanslate.teardown import _signal_script
from cleanslate.teardown._records import Protected, ScopeSpec, Selected, Target
from cleanslate.teardown._tree import RecordedTree
from cleanslate.verdict.rules import excluded_pids

#: The selection paths by name (:class:`Selected`).
ROOT, SUPERVISOR, GROUP, SESSION, MARKER, DESCENDANT, NAMED, ENGINE, CGROUP, RECORDED = (
    Selected.ROOT, Selected.SUPERVISOR, Selected.GROUP, Selected.SESSION, Selected.MARKER,
    Selected.DESCENDANT, Selected.NAMED, Selected.ENGINE, Selected.CGROUP, Selected.RECORDED)

#: Seconds before the run's recorded start that a process found by its group, session or cgroup
#: may have started: ``/proc/stat``'s boot time is whole seconds, so a start time read from
#: ``/proc`` can be up to one second early, and the run's start is taken just before launch.
START_SLACK_S = 2.0
#: Seconds after the run's recorded end that a process found by its group or session may start.
END_SLACK_S = 2.0


def protected_pids(snapshot: Snapshot, exclude_roots: Collection[int] = ()) -> dict[int, str]:
    """``{pid: reason}`` for the processes teardown never selects, by any path: PID 1, kernel
    threads, the ancestors of ``exclude_roots`` (this process, locally) and of the collector
    (its SSH session on a remote host), the members of their sessions, and the trees under
    ``exclude_roots`` (the commands this process started). A session number of 0 (the leader
    is outside this PID namespace) names no session and protects nothing."""
    tree = snapshot.tree
    out: dict[int, str] = {}
    for proc in snapshot.processes:
        if proc.pid == 1:
            out[proc.pid] = Protected.INIT
        elif is_kernel_thread(proc):
            out[proc.pid] = Protected.KTHREAD
    for pid in excluded_pids(snapshot, exclude_roots):
        out.setdefault(pid, Protected.OWN)
    starts = [*exclude_roots]
    if snapshot.collector_pid is not None:
        starts.append(snapshot.collector_pid)
    sessions: set[int] = set()
    for start in starts:
        me = tree.by_pid.get(start)
        if me is None:
            continue
        if me.sid > 0:
            sessions.add(me.sid)
        for parent in tree.ancestors(start):
            out.setdefault(parent.pid, Protected.ANCESTOR)
    if sessions:
        for proc in snapshot.processes:
            if proc.sid in sessions:
                out.setdefault(proc.pid, Protected.SESSION)
    return out


def _gpu_holders(snapshot: Snapshot, gpus: frozenset[int] | None) -> set[int]:
    """PIDs that hold one of ``gpus`` (``None``: any GPU): compute processes the GPU backend
    listed, and holders of ``/dev/nvidiaN``."""
    out: set[int] = set()
    for gpu in snapshot.gpu.gpus:
        if gpus is None or gpu.index in gpus:
            out.update(p.pid for p in gpu.processes)
    for holder in snapshot.device_holders:
        for device in holder.devices:
            suffix = device.removeprefix("/dev/nvidia")
            if suffix.isdigit() and (gpus is None or int(suffix) in gpus):
                out.add(holder.pid)
    return out


def _port_owners(snapshot: Snapshot, port: int | None) -> set[int]:
    if port is None:
        return set()
    return {pid for sock in snapshot.sockets if sock.port == port for pid in sock.pids}


def resolve_scope(snapshot: Snapshot, spec: ScopeSpec, *,
                  cgroup_members: Collection[int] | None = None,
                  recorded: RecordedTree | None = None,
                  now: float | None = None) -> list[Target]:
    """The processes of the snapshot that ``spec`` owns, with their descendants (see the module
    docstring). ``cgroup_members`` are the PIDs read from the run's ``cgroup.procs`` (``None``:
    the run has no cgroup, or it could not be read); ``recorded`` the run's recorded tree
    (used only without ``cgroup_members``). Pure: reads nothing but its arguments."""
    return scope_and_protected(snapshot, spec, cgroup_members=cgroup_members,
                               recorded=recorded, now=now)[0]


def recorded_pids(snapshot: Snapshot, recorded: RecordedTree | None,
                  start: float | None) -> set[int]:
    """The live processes of ``snapshot`` that ``recorded`` names: the same boot, the same PID
    and the same start time (:data:`SAME_START_S`), started at ``start`` or later."""
    boot = snapshot.boot_time
    if recorded is None or boot is None or snapshot.boot_id is None \
            or recorded.boot_id != snapshot.boot_id:
        return set()
    out: set[int] = set()
    for pid, since_boot in recorded.entries:
        proc = snapshot.process(pid)
        if proc is None or abs(proc.create_time - boot - since_boot) > SAME_START_S:
            continue
        if start is None or boot + since_boot >= start:
            out.add(pid)
    return out


def scope_and_protected(snapshot: Snapshot, spec: ScopeSpec, *,
                        cgroup_members: Collection[int] | None = None,
                        recorded: RecordedTree | None = None,
                        now: float | None = None) -> tuple[list[Target], list[Target]]:
    """:func:`resolve_scope`, plus the processes a selection path matched but that are
    protected, or that carry the run's group or session number and look like the run's, but
    nothing verifies as the run's (each with ``protected`` saying why)."""
    protected = protected_pids(snapshot, spec.exclude_roots)
    by_pid = snapshot.by_pid
    members = frozenset(cgroup_members) if cgroup_members is not None else None
    by_number = members is None  # a known cgroup replaces group and session numbers
    end = (spec.not_after if spec.not_after is not None else
           (time.time() if now is None else now)) + END_SLACK_S
    start = None if spec.not_before is None else spec.not_before - START_SLACK_S
    holders = _gpu_holders(snapshot, spec.gpus) | _port_owners(snapshot, spec.port)
    # None for an engine without a signature (``command``): only holdings are evidence then.
    signature = find_signature(spec.signature) if spec.signature is not None else None
    own = recorded_pids(snapshot, recorded, start) if by_number else set()

    def in_window(proc: ProcessInfo) -> bool:
        return (start is None or proc.create_time >= start) and proc.create_time <= end

    reused: dict[str, str | None] = {
        kind: _reused_number(snapshot, spec, kind, number, start)
        for kind, number in ((GROUP, spec.pgid), (SESSION, spec.sid))
        if number is not None and by_number}
    unverified: dict[int, tuple[str, str]] = {}

    def by_numbers(proc: ProcessInfo) -> None:
        """The number path (no cgroup) selects nothing: a process carrying the run's group or
        session number that looks like the run's lands in ``unverified`` with why it is not
        verified as the run's."""
        kinds = [kind for kind, number in ((GROUP, spec.pgid), (SESSION, spec.sid))
                 if number is not None and (proc.pgid if kind == GROUP else proc.sid) == number]
        if not kinds or not in_window(proc):
            return
        held = proc.pid in holders
        looks = held or not proc.environ_readable or (
            signature is not None and signature.matches(proc.comm, proc.cmdline))
        if not looks:
            return
        why = kinds[0]
        numbered = f"found only by its {why} number"
        stale = next(((kind, reused[kind]) for kind in kinds if reused.get(kind)), None)
        if stale is not None:
            why, reason = stale[0], str(stale[1])
        elif spec.uid is not None and proc.uid is not None and proc.uid != spec.uid:
            reason = (f"{numbered}, and owned by uid {proc.uid}, not the run's user (uid "
                      f"{spec.uid})")
        else:
            reason = (f"{numbered}, "
                      + ("holding the run's GPU or port" if held else
                         "its environment cannot be read" if not proc.environ_readable
                         else "without the run's marker")
                      + ", not among the processes the run's supervisor recorded: not verified "
                      "as the run's (a reused number can carry all of that)")
        unverified[proc.pid] = (why, reason)

    def select(proc: ProcessInfo) -> str | None:
        if spec.root and proc.pid == spec.root[0] and same_process(proc, spec.root[1]):
            return ROOT
        if spec.supervisor and proc.pid == spec.supervisor[0] \
                and same_process(proc, spec.supervisor[1]):
            return SUPERVISOR
        if members is not None and proc.pid in members and (
                start is None or proc.create_time >= start):
            return CGROUP
        if spec.marker is not None and proc.run_marker == spec.marker:
            return MARKER
        if proc.pid in own:
            return RECORDED
        if by_number:
            by_numbers(proc)
        if proc.pid in spec.pids:
            return NAMED
        if spec.engine is not None and match_engine(proc.comm, proc.cmdline, [spec.engine]):
            return ENGINE
        return None

    chosen: dict[int, str] = {}
    refused: dict[int, str] = {}
    for proc in snapshot.processes:
        why = select(proc)
        if why is None:
            continue
        if proc.pid in protected:
            refused[proc.pid] = why
        else:
            chosen[proc.pid] = why
    tree = snapshot.tree
    stack = list(chosen)
    while stack:
        for child in tree.children(stack.pop()):
            if child.pid in chosen or child.pid in refused:
                continue
            if child.pid in protected:
                refused[child.pid] = DESCENDANT  # and its own children are not walked into
                continue
            chosen[child.pid] = DESCENDANT
            stack.append(child.pid)

    def target(pid: int, why: str, reason: str | None = None) -> Target:
        proc = by_pid[pid]
        return Target(pid, proc.create_time, proc.comm, proc.command, why, uid=proc.uid,
                      protected=reason, boot_time=snapshot.boot_time)

    return (
        [target(pid, why) for pid, why in chosen.items() if not by_pid[pid].is_zombie],
        [target(pid, why, protected[pid]) for pid, why in refused.items()]
        + [target(pid, why, protected.get(pid, reason))
           for pid, (why, reason) in unverified.items()
           if pid not in chosen and pid not in refused and not by_pid[pid].is_zombie],
    )


#: Seconds two readings of one process's start time may differ: start times are read in clock
#: ticks (10 ms at 100 Hz) and kept to 0.01 s.
SAME_START_S = 0.02

#: How far two snapshots' ``btime`` may differ and still be one boot (the signal script's
#: :data:`~cleanslate.teardown._signal_script.BOOT_SHIFT_S`).
BOOT_SHIFT_S = _signal_script.BOOT_SHIFT_S


def same_process(proc: ProcessInfo, create_time: float, boot: float | None = None,
                 proc_boot: float | None = None) -> bool:
    """Whether ``proc`` is the process that started at ``create_time`` (:data:`SAME_START_S`
    apart at most). With ``boot`` (the boot time ``create_time`` was computed against) and
    ``proc_boot`` (``proc``'s snapshot's), the times since boot are compared: ``btime`` moves by
    a whole second when the clock is adjusted between two snapshots; boot times further apart
    than :data:`BOOT_SHIFT_S` are two boots, and a process of the later one is another."""
    if boot is not None and proc_boot is not None:
        if abs(proc_boot - boot) > BOOT_SHIFT_S:
            return False
        return abs((proc.create_time - proc_boot) - (create_time - boot)) <= SAME_START_S
    return abs(proc.create_time - create_time) <= SAME_START_S


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _reused_number(snapshot: Snapshot, spec: ScopeSpec, kind: str, number: int,
                   start: float | None) -> str | None:
    """Why the run's recorded group (``kind`` ``GROUP``) or session number is no longer the
    run's, or ``None`` when nothing says so. The number names its leader: the recorded root or
    supervisor whose PID it is, with its start time. The kernel does not give a PID to a new
    process while a group or session of that number has a member, so every process carrying
    the number is the run's or none is: the number was reused when its PID is alive with
    another start time, or when a process carrying it started before the run."""
    leader: float | None = None
    for recorded in (spec.root, spec.supervisor):
        if recorded is not None and recorded[0] == number:
            leader = recorded[1]
            break
    current = snapshot.process(number)
    if current is not None and leader is not None and not same_process(current, leader):
        return (f"its {kind} number {number} was reused: PID {number} is a process started "
                f"{_when(current.create_time)}, not the run's (started {_when(leader)})")
    if start is not None:
        for proc in snapshot.processes:
            if (proc.pgid if kind == GROUP else proc.sid) == number \
                    and proc.create_time < start:
                return (f"its {kind} number {number} was reused: PID {proc.pid} carries it "
                        f"and started {_when(proc.create_time)}, before the run")
    return None


def valid_cgroup(path: str | None, run_id: str) -> str | None:
    """``path`` when it can be the run's own cgroup (an absolute, normalised path whose last
    part is ``cleanslate-<run id>``), else ``None``: a record from a shared store must not be
    able to point teardown at another cgroup (``cgroup.kill`` ends everything in it)."""
    if not path or not path.startswith("/") or posixpath.normpath(path) != path:
        return None
    return path if posixpath.basename(path) == f"cleanslate-{run_id}" else None


__all__ = [
    "CGROUP", "DESCENDANT", "END_SLACK_S", "ENGINE", "GROUP", "MARKER", "NAMED", "RECORDED",
    "ROOT", "SAME_START_S", "SESSION", "START_SLACK_S", "SUPERVISOR", "Protected", "Selected",
    "protected_pids", "recorded_pids", "resolve_scope", "same_process", "scope_and_protected",
    "valid_cgroup",
]
