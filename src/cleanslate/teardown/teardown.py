"""Teardown: end exactly what a run owns, then verify the host is clean (``docs/teardown.md``).

**Scope** (:func:`resolve_scope`, pure over a snapshot; the rules are in ``docs/teardown.md``).
A process is in scope when one of these selects it:

- ``root`` / ``supervisor``: the recorded PID *with* its recorded start time;
- ``cgroup``: a member of the run's own cgroup (v2), which no descendant leaves by forking,
  renaming or re-executing itself;
- ``marker``: ``CLEANSLATE_RUN=<run id>`` in its environment;
- ``process group`` / ``session`` (only while the run has no cgroup): its group or session
  number equals the run's, *and* that number is still the run's (the number names its leader,
  the recorded root or supervisor with its start time: when a process with that PID is alive
  with another start time, or a process carrying the number started before the run, the
  number was reused and selects nothing), *and* it started between the run's start (less
  :data:`START_SLACK_S`) and its end (``stopped_at``, else now), *and* it is not another user's
  (``uid``), *and* it holds the run's GPUs or port. A process that passes all but the last,
  whose environment cannot be read or that carries the engine's signature (vLLM's and SGLang's
  workers rename themselves with ``setproctitle``, which can leave their marker unreadable), is
  *reported* (``left_alone``, with the reason), not signalled: nothing read says it is the
  run's. A bare number match never selects anything (PID reuse, a store shared between
  machines). When the run has a cgroup these two paths are off: the cgroup says who is the
  run's. A recorded cgroup is used only when, on the host, it is a directory of a cgroup v2
  file system (``statfs``), owned by the run's user, the very one its supervisor created
  (:mod:`cleanslate.teardown._cgroup_script`); else it is ignored (``cgroup_refused``);
- ``named`` / ``engine``: what ``clean --pid`` / ``clean --engine`` ask for;
- ``descendant``: a child, at any depth, of a selected process, found *before the first signal*.

**Never** selected, by any path: PID 1, kernel threads, this process's ancestors (locally; the
collector's ancestors on a remote host), the members of this process's session, and this
process's own children (:func:`protected_pids`).

Every signal goes through :mod:`cleanslate.teardown._signal_script`, which checks PID and start
time so a reused PID is never hit. 1. snapshot the scope; 2. SIGTERM the root and wait up to
``grace_s`` (engines free and unpin memory here); 3. SIGTERM the rest, wait ``term_wait_s``;
re-scan (markers and the cgroup catch setsid'd grandchildren) and SIGKILL whatever is still in
scope (``cgroup.kill`` too, race-free against forks), until a scan finds nothing; 4. report
D-state survivors instead of hanging; 5. remove the run's empty cgroup and its own ``/dev/shm``
files and verify with ``check --until-clean`` on the run's GPUs and port. A ``/dev/shm`` file
that a live process still maps or holds open is never removed: once the scope is gone, its
holder is someone else's (another run, a benchmark client), whatever its name and time say.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from cleanslate.engines import find_signature, match_engine
from cleanslate.errors import ExitCode
from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu.base import GpuBackend
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import ProcessInfo, Snapshot
from cleanslate.verdict.check import (
    DEFAULT_SETTLE_S,
    CheckOptions,
    CheckReport,
    check_one,
    check_until_clean,
)
from cleanslate.verdict.rules import excluded_pids

#: Why a process is in scope.
ROOT, SUPERVISOR, GROUP, SESSION, MARKER, DESCENDANT, NAMED, ENGINE, CGROUP = (
    "root", "supervisor", "process group", "session", "marker", "descendant", "named", "engine",
    "cgroup",
)

#: Seconds before the run's recorded start that a process found by its group, session or cgroup
#: may have started: ``/proc/stat``'s boot time is whole seconds, so a start time read from
#: ``/proc`` can be up to one second early, and the run's start is taken just before launch.
START_SLACK_S = 2.0
#: Seconds after the run's recorded end that a process found by its group or session may start.
END_SLACK_S = 2.0

#: Why a process is never selected (:func:`protected_pids`).
PROTECTED_INIT = "PID 1 (init)"
PROTECTED_KTHREAD = "a kernel thread"
PROTECTED_ANCESTOR = "an ancestor of this cleanslate process (its shell, terminal or login)"
PROTECTED_SESSION = "in this cleanslate process's session (the terminal session it runs in)"
PROTECTED_OWN = "this cleanslate process or a command it started"


@dataclass(frozen=True)
class Target:
    """A process in scope, identified by PID *and* start time. ``protected`` says why a process
    that a selection path matched was left alone (``None`` for a real target)."""

    pid: int
    create_time: float
    comm: str
    command: str
    why: str
    uid: int | None = None
    user: str | None = None
    protected: str | None = None

    def record(self) -> TargetRecord:
        """This process as a :class:`TeardownReport` keeps it."""
        return TargetRecord(pid=self.pid, create_time=self.create_time, comm=self.comm,
                            command=self.command[:TargetRecord.COMMAND_CHARS], why=self.why,
                            uid=self.uid, user=self.user, protected=self.protected)

    def as_dict(self) -> dict[str, Any]:
        """:meth:`record` as JSON (``clean --json``)."""
        return self.record().model_dump(mode="json")


class TargetRecord(BaseModel):
    """A process in a teardown's scope as its report keeps it: a :class:`Target` with its
    command line cut at :attr:`COMMAND_CHARS` characters. In JSON, ``protected`` is present
    only for a process that was left alone."""

    model_config = ConfigDict(frozen=True)

    COMMAND_CHARS: ClassVar[int] = 200

    pid: int
    create_time: float
    comm: str
    command: str
    why: str
    uid: int | None = None
    user: str | None = None
    protected: str | None = None

    @model_serializer(mode="wrap")
    def _protected_only_when_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("protected") is None:
            data.pop("protected", None)
        return data


@dataclass(frozen=True)
class ScopeSpec:
    """What to tear down. Any combination; the scope is the union plus descendants.

    ``pgid`` / ``sid`` select a process only with the evidence described in the module
    docstring: the number not reused (its leader is ``root`` or ``supervisor``, whichever has
    that PID), a start time in ``[not_before - START_SLACK_S, (not_after or now) +
    END_SLACK_S]``, the owner ``uid`` (the run's user; ``None``: not known) and a holding of
    ``gpus`` (``None``: any GPU) or of ``port``; without a holding, a process whose environment
    is unreadable or that matches ``signature`` (an engine name) is reported, not selected.
    ``cgroup`` is the run's cgroup directory (``cgroup_id`` its inode number as created, and
    ``uid`` its owner, checked on the host); while it is known, group and session numbers
    select nothing. ``engine`` selects every process with that engine's signature (``clean
    --engine``); ``pids`` names processes (``clean --pid``). ``exclude_roots`` are this
    process's PIDs (local executors only): their trees, ancestors and session are protected.
    """

    root: tuple[int, float] | None = None
    supervisor: tuple[int, float] | None = None
    pgid: int | None = None
    sid: int | None = None
    marker: str | None = None
    pids: tuple[int, ...] = ()
    engine: str | None = None
    signature: str | None = None
    gpus: frozenset[int] | None = None
    port: int | None = None
    cgroup: str | None = None
    cgroup_id: int | None = None
    uid: int | None = None
    not_before: float | None = None
    not_after: float | None = None
    exclude_roots: frozenset[int] = frozenset()


class SignalRound(BaseModel):
    model_config = ConfigDict(frozen=True)

    at_s: float
    signal: str
    sent: tuple[int, ...]


class TeardownReport(BaseModel):
    """What teardown did, and the verification that followed.

    ``refused`` is set when nothing was signalled because the record cannot name processes of
    this host (another boot or another machine); ``refused_code`` is then the exit code (2 for
    another machine: the run may be alive there; the verification's code for another boot).
    """

    model_config = ConfigDict(frozen=True)

    targets: tuple[TargetRecord, ...]
    left_alone: tuple[TargetRecord, ...] = Field(
        default=(), description="processes a selection path matched but that are protected")
    rounds: tuple[SignalRound, ...] = ()
    killed: tuple[int, ...] = Field(default=(), description="PIDs that needed SIGKILL")
    root_exit_s: float | None = None
    d_state: tuple[int, ...] = ()
    survivors: tuple[int, ...] = ()
    cgroup: str | None = None
    cgroup_refused: str | None = Field(
        default=None, description="why the recorded cgroup was not used (not the run's own)")
    cgroup_killed: bool = False
    cgroup_removed: bool = False
    cgroup_left: tuple[int, ...] = Field(
        default=(), description="PIDs still in the run's cgroup at the end")
    shm_removed: tuple[str, ...] = ()
    shm_in_use: tuple[str, ...] = Field(
        default=(), description="the run's candidates left alone: a live process holds them")
    refused: str | None = None
    refused_code: int | None = None
    elapsed_s: float
    verify: CheckReport | None = None

    @property
    def exit_code(self) -> ExitCode:
        """``INPUT`` when refused as another machine's run; else the verification's, and
        ``FAILED`` when a process survived (or the cgroup still holds one)."""
        if self.refused_code == ExitCode.INPUT:
            return ExitCode.INPUT
        left = bool(self.survivors or self.cgroup_left)
        if self.verify is not None:
            code = self.verify.exit_code
            return ExitCode.FAILED if code == ExitCode.OK and left else ExitCode(code)
        return ExitCode.FAILED if left else ExitCode.OK


@cache
def _signal_source() -> bytes:
    return resources.files("cleanslate.teardown").joinpath("_signal_script.py").read_bytes()


async def send_signal(executor: Executor, targets: Iterable[Target], signal: str,
                      timeout: float = 15.0, *, wait_s: float = 0.0) -> dict[str, Any]:
    """Signal targets that are still the same processes; ``signal`` ``"0"`` only tests them,
    after waiting up to ``wait_s`` seconds for all of them to exit (on the host, event-driven:
    see ``_signal_script.py``)."""
    spec: dict[str, Any] = {
        "signal": signal, "targets": [{"pid": t.pid, "create_time": t.create_time}
                                      for t in targets]}
    if not spec["targets"]:
        return {"sent": [], "gone": [], "reused": [], "zombie": [], "d_state": [], "errors": {}}
    if signal == "0" and wait_s > 0:
        spec["wait_s"] = wait_s
    result = await executor.run([executor.python, "-I", "-S", "-", json.dumps(spec)],
                                timeout=timeout + (wait_s if signal == "0" else 0.0),
                                stdin=_signal_source())
    if not result.ok:
        raise OSError(f"could not signal processes on {executor.name}: "
                      f"{result.describe_failure()}")
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@cache
def _shm_holders_source() -> bytes:
    return resources.files("cleanslate.teardown").joinpath("_shm_holders_script.py").read_bytes()


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


def is_kernel_thread(proc: ProcessInfo) -> bool:
    """kthreadd and its children: no command line, group and session 0, parent 0 or kthreadd
    (PID 2 on the host; in a PID namespace PID 2 is an ordinary process, with a command line)."""
    return (not proc.cmdline and proc.pgid == 0 and proc.sid == 0 and proc.ppid in (0, 2)
            and proc.pid != 1 and proc.state != "Z")


def protected_pids(snapshot: Snapshot, exclude_roots: Collection[int] = ()) -> dict[int, str]:
    """``{pid: reason}`` for the processes teardown never selects, by any path: PID 1, kernel
    threads, the ancestors of ``exclude_roots`` (this process, locally) and of the collector
    (its SSH session on a remote host), the members of their sessions, and the trees under
    ``exclude_roots`` (the commands this process started). A session number of 0 (the leader
    is outside this PID namespace) names no session and protects nothing."""
    by_pid = {p.pid: p for p in snapshot.processes}
    out: dict[int, str] = {}
    for proc in snapshot.processes:
        if proc.pid == 1:
            out[proc.pid] = PROTECTED_INIT
        elif is_kernel_thread(proc):
            out[proc.pid] = PROTECTED_KTHREAD
    for pid in excluded_pids(snapshot, exclude_roots):
        out.setdefault(pid, PROTECTED_OWN)
    starts = [*exclude_roots]
    if snapshot.collector_pid is not None:
        starts.append(snapshot.collector_pid)
    sessions: set[int] = set()
    for start in starts:
        me = by_pid.get(start)
        if me is None:
            continue
        if me.sid > 0:
            sessions.add(me.sid)
        seen = {start}
        parent = by_pid.get(me.ppid)
        while parent is not None and parent.pid not in seen:
            seen.add(parent.pid)
            out.setdefault(parent.pid, PROTECTED_ANCESTOR)
            parent = by_pid.get(parent.ppid)
    if sessions:
        for proc in snapshot.processes:
            if proc.sid in sessions:
                out.setdefault(proc.pid, PROTECTED_SESSION)
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
                  now: float | None = None) -> list[Target]:
    """The processes of the snapshot that ``spec`` owns, with their descendants (see the module
    docstring). ``cgroup_members`` are the PIDs read from the run's ``cgroup.procs`` (``None``:
    the run has no cgroup, or it could not be read). Pure: reads nothing but its arguments."""
    return scope_and_protected(snapshot, spec, cgroup_members=cgroup_members, now=now)[0]


def scope_and_protected(snapshot: Snapshot, spec: ScopeSpec, *,
                        cgroup_members: Collection[int] | None = None,
                        now: float | None = None) -> tuple[list[Target], list[Target]]:
    """:func:`resolve_scope`, plus the processes a selection path matched but that are
    protected (each with ``protected`` saying why)."""
    protected = protected_pids(snapshot, spec.exclude_roots)
    by_pid = {p.pid: p for p in snapshot.processes}
    members = frozenset(cgroup_members) if cgroup_members is not None else None
    by_number = members is None  # a known cgroup replaces group and session numbers
    end = (spec.not_after if spec.not_after is not None else
           (time.time() if now is None else now)) + END_SLACK_S
    start = None if spec.not_before is None else spec.not_before - START_SLACK_S
    holders = _gpu_holders(snapshot, spec.gpus) | _port_owners(snapshot, spec.port)
    # None for an engine without a signature (``command``): only holdings are evidence then.
    signature = find_signature(spec.signature) if spec.signature is not None else None

    def in_window(proc: ProcessInfo) -> bool:
        return (start is None or proc.create_time >= start) and proc.create_time <= end

    reused: dict[str, str | None] = {
        kind: _reused_number(snapshot, spec, kind, number, start)
        for kind, number in ((GROUP, spec.pgid), (SESSION, spec.sid))
        if number is not None and by_number}
    unverified: dict[int, tuple[str, str]] = {}

    def by_numbers(proc: ProcessInfo) -> str | None:
        """The number path (no cgroup): ``GROUP`` / ``SESSION`` with the evidence that the
        process is the run's; a candidate without it lands in ``unverified`` with why."""
        kinds = [kind for kind, number in ((GROUP, spec.pgid), (SESSION, spec.sid))
                 if number is not None and (proc.pgid if kind == GROUP else proc.sid) == number]
        if not kinds or not in_window(proc):
            return None
        held = proc.pid in holders
        looks = held or not proc.environ_readable or (
            signature is not None and signature.matches(proc.comm, proc.cmdline))
        why = kinds[0]
        numbered = f"found only by its {why} number"
        stale = next(((kind, reused[kind]) for kind in kinds if reused.get(kind)), None)
        if stale is not None:
            why, reason = stale[0], str(stale[1])
        elif spec.uid is not None and proc.uid is not None and proc.uid != spec.uid:
            reason = (f"{numbered}, and owned by uid {proc.uid}, not the run's user (uid "
                      f"{spec.uid})")
        elif held:
            return why
        else:
            reason = (f"{numbered}, "
                      + ("its environment cannot be read" if not proc.environ_readable
                         else "without the run's marker")
                      + ", and holding none of the run's GPUs or its port: not verified as the "
                      "run's")
        if looks:
            unverified[proc.pid] = (why, reason)
        return None

    def select(proc: ProcessInfo) -> str | None:
        if spec.root and proc.pid == spec.root[0] and _same(proc, spec.root[1]):
            return ROOT
        if spec.supervisor and proc.pid == spec.supervisor[0] \
                and _same(proc, spec.supervisor[1]):
            return SUPERVISOR
        if members is not None and proc.pid in members and (
                start is None or proc.create_time >= start):
            return CGROUP
        if spec.marker is not None and proc.run_marker == spec.marker:
            return MARKER
        if by_number and (found := by_numbers(proc)) is not None:
            return found
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
    children: dict[int, list[int]] = {}
    for proc in snapshot.processes:
        children.setdefault(proc.ppid, []).append(proc.pid)
    stack = list(chosen)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child in chosen or child in refused:
                continue
            if child in protected:
                refused[child] = DESCENDANT  # and its own children are not walked into
                continue
            chosen[child] = DESCENDANT
            stack.append(child)

    def target(pid: int, why: str, reason: str | None = None) -> Target:
        proc = by_pid[pid]
        return Target(pid, proc.create_time, proc.comm, proc.command, why, uid=proc.uid,
                      protected=reason)

    return (
        [target(pid, why) for pid, why in chosen.items() if by_pid[pid].state != "Z"],
        [target(pid, why, protected[pid]) for pid, why in refused.items()]
        + [target(pid, why, protected.get(pid, reason))
           for pid, (why, reason) in unverified.items()
           if pid not in chosen and pid not in refused and by_pid[pid].state != "Z"],
    )


def _same(proc: ProcessInfo, create_time: float) -> bool:
    return abs(proc.create_time - create_time) <= 0.02


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
    if current is not None and leader is not None and not _same(current, leader):
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


@cache
def _cgroup_source() -> bytes:
    return resources.files("cleanslate.teardown").joinpath("_cgroup_script.py").read_bytes()


async def cgroup_op(executor: Executor, cgroup: str, op: str = "members", *,
                    uid: int | None = None, cgroup_id: int | None = None, wait_s: float = 0.0,
                    timeout: float = 15.0) -> dict[str, Any]:
    """Run ``op`` (``members``, ``kill``, ``remove``) on the run's cgroup, on the host, after
    checking that ``cgroup`` is a cgroup v2 directory owned by ``uid`` and, when given, the very
    one of inode ``cgroup_id`` (:mod:`cleanslate.teardown._cgroup_script`, whose answer this is:
    ``refused`` when it is not the run's cgroup, ``error`` when it could not be read)."""
    spec = {"path": cgroup, "op": op, "uid": uid, "ino": cgroup_id, "wait_s": max(wait_s, 0.0)}
    result = await executor.run([executor.python, "-I", "-S", "-", json.dumps(spec)],
                                timeout=timeout + max(wait_s, 0.0), stdin=_cgroup_source())
    if not result.ok:
        return {"ok": False, "error": f"could not read the cgroup {cgroup} on {executor.name}: "
                                      f"{result.describe_failure()}"}
    try:
        data = json.loads(result.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("members", []), list) \
            or not all(isinstance(m, int) for m in data.get("members", [])):
        return {"ok": False, "error": f"an unreadable answer about the cgroup {cgroup}"}
    return data


async def _cgroup_members(executor: Executor, spec: ScopeSpec, *, checked: bool = False
                          ) -> tuple[frozenset[int] | None, str | None]:
    """(the PIDs in the run's cgroup, ``None``) ; (``None``, why the recorded path is not the
    run's cgroup); (``None``, ``None``) when it cannot be read.

    ``checked``: the path passed :func:`cgroup_op`'s check earlier in this teardown, so its
    ``cgroup.procs`` is read as a file (no command on the host). Every directory on that path is
    real (it was its own ``realpath``) and its last two are in a cgroup v2 file system, where no
    one can make a symbolic link and only a writer of the parent cgroup (the run's own user or
    root) can make a directory; ``cgroup.kill`` and the removal check again all the same."""
    assert spec.cgroup is not None
    if checked:
        try:
            raw = await executor.read_file(f"{spec.cgroup}/cgroup.procs", max_bytes=1 << 22)
        except FileNotFoundError:
            return frozenset(), None
        except OSError:
            return None, None
        try:
            return frozenset(int(line) for line in raw.split()), None
        except ValueError:
            return None, None
    data = await cgroup_op(executor, spec.cgroup, "members", uid=spec.uid,
                           cgroup_id=spec.cgroup_id)
    if data.get("refused"):
        return None, str(data["refused"])
    if not data.get("ok"):
        return None, None
    return frozenset(data.get("members", [])), None


async def read_cgroup_members(executor: Executor, cgroup: str, *, uid: int | None = None,
                              cgroup_id: int | None = None) -> frozenset[int] | None:
    """The PIDs in ``cgroup`` (an empty set when it no longer exists: a populated cgroup
    cannot be removed), or ``None`` when it cannot be read or is not a cgroup v2 directory
    owned by ``uid`` (and of inode ``cgroup_id``): see :func:`cgroup_op`."""
    return (await _cgroup_members(executor, ScopeSpec(cgroup=cgroup, uid=uid,
                                                      cgroup_id=cgroup_id)))[0]


async def _user_names(executor: Executor, uids: Iterable[int | None],
                      cache: dict[int, str | None]) -> None:
    """Fill ``cache`` with the host's user names for ``uids`` (``None`` where unknown)."""
    wanted = sorted({u for u in uids if u is not None and u not in cache})
    if not wanted:
        return
    if executor.is_local:
        import pwd

        for uid in wanted:
            try:
                cache[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                cache[uid] = None
        return
    code = ("import json, pwd, sys\nout = {}\nfor u in json.loads(sys.argv[1]):\n"
            "    try: out[u] = pwd.getpwuid(u).pw_name\n    except KeyError: out[u] = None\n"
            "print(json.dumps(out))\n")
    result = await executor.run([executor.python, "-I", "-S", "-c", code, json.dumps(wanted)],
                                timeout=15.0)
    names: dict[str, Any] = {}
    if result.ok:
        try:
            names = json.loads(result.stdout)
        except ValueError:
            names = {}
    for uid in wanted:
        value = names.get(str(uid))
        cache[uid] = str(value) if value is not None else None


@dataclass
class _Scan:
    targets: list[Target]
    protected: list[Target]
    members: frozenset[int] | None
    snapshot: Snapshot
    reading: CheckReport | None = None  # the verification's reading of the same snapshot
    cgroup_refused: str | None = None  # why the recorded cgroup is not the run's

    def living(self, targets: Iterable[Target]) -> list[Target]:
        """The targets that this scan saw alive (same start time, not a zombie)."""
        by_pid = {p.pid: p for p in self.snapshot.processes}
        return [t for t in targets if (p := by_pid.get(t.pid)) is not None and p.state != "Z"
                and _same(p, t.create_time)]


async def _scan(executor: Executor, spec: ScopeSpec, *, gpu: GpuBackend | None = None,
                users: dict[int, str | None] | None = None,
                verify: CheckOptions | None = None, cgroup_checked: bool = False) -> _Scan:
    """The scope now. With ``verify`` (and no port to read that verification does not read),
    the snapshot is the one a verification reading judges, and that reading comes with it.
    ``cgroup_checked``: see :func:`_cgroup_members`."""
    if not executor.is_local:
        spec = replace(spec, exclude_roots=frozenset())  # our PIDs mean nothing there
    ports = [spec.port] if spec.port is not None and (spec.pgid or spec.sid) else []
    verified: CheckReport | None = None
    taken: Snapshot | None = None
    # The cgroup is read beside the probe: unchecked, that is a command on the host.
    cgroup = asyncio.ensure_future(_cgroup_members(executor, spec, checked=cgroup_checked)) \
        if spec.cgroup else None
    try:
        if verify is not None and set(ports) <= set(verify.ports):
            verified, taken = await check_one(executor, verify)
        snapshot = taken if taken is not None else \
            await probe_host(executor, NoGpuBackend(), ports=ports, timeout=15.0)
    except BaseException:
        if cgroup is not None:
            cgroup.cancel()  # the executor ends the command it was running
            with contextlib.suppress(BaseException):
                await cgroup
        raise
    members, refused = await cgroup if cgroup is not None else (None, None)
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
    targets, protected = scope_and_protected(snapshot, spec, cgroup_members=members)
    if users is not None:
        await _user_names(executor, [t.uid for t in (*targets, *protected)], users)
        targets = [replace(t, user=users.get(t.uid) if t.uid is not None else None)
                   for t in targets]
        protected = [replace(t, user=users.get(t.uid) if t.uid is not None else None)
                     for t in protected]
    return _Scan(targets, protected, members, snapshot, verified if taken else None, refused)


async def scan_scope(executor: Executor, spec: ScopeSpec) -> tuple[list[Target], list[Target]]:
    """The scope on the host now, and the protected processes a path matched (with owners)."""
    scan = await _scan(executor, spec, users={})
    return scan.targets, scan.protected


async def _wait_gone(executor: Executor, targets: list[Target], seconds: float
                     ) -> list[Target]:
    """Wait until every target is gone (or a zombie) or ``seconds`` pass; return the living.
    One command on the host, which returns the moment the last target exits."""
    if not targets:
        return []
    state = await send_signal(executor, targets, "0", wait_s=max(seconds, 0.0))
    dead = set(state["gone"]) | set(state["reused"]) | set(state["zombie"])
    return [t for t in targets if t.pid not in dead]


async def _cgroup_kill(executor: Executor, spec: ScopeSpec) -> bool:
    """Write ``1`` to the run's ``cgroup.kill`` (SIGKILL to every member, forks included).
    ``False`` when the kernel has no ``cgroup.kill`` (before 5.14), it cannot be written, or
    the path is no longer the run's cgroup."""
    assert spec.cgroup is not None
    data = await cgroup_op(executor, spec.cgroup, "kill", uid=spec.uid,
                           cgroup_id=spec.cgroup_id)
    return bool(data.get("killed"))


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
    started = time.monotonic()
    say = progress or (lambda _msg: None)
    rounds: list[SignalRound] = []
    users: dict[int, str | None] = {}

    def stamp(signal: str, sent: Iterable[int]) -> None:
        rounds.append(SignalRound(at_s=round(time.monotonic() - started, 3), signal=signal,
                                  sent=tuple(sent)))

    first = await _scan(executor, spec, gpu=gpu, users=users)
    cgroup_refused = first.cgroup_refused
    if cgroup_refused is not None:
        # Not the run's cgroup: the scan read no members, so the number paths were on.
        say(f"ignoring the recorded cgroup {spec.cgroup}: {cgroup_refused}")
        spec = replace(spec, cgroup=None)
    scope = first.targets
    every: dict[int, Target] = {t.pid: t for t in scope}
    left_alone: dict[int, Target] = {t.pid: t for t in first.protected}
    say(f"{len(scope)} processes in scope"
        + (f" (cgroup {spec.cgroup}: {len(first.members)} members)"
           if first.members is not None else ""))
    if left_alone:
        say(f"left alone (protected): {', '.join(map(str, sorted(left_alone)))}")
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
    cgroup_killed = False
    members = first.members
    last: _Scan | None = None  # the last rescan, while nothing was signalled after it
    for attempt in range(5):
        # The first rescan is also the verification's first reading when nothing is left.
        rescan = await _scan(executor, spec, gpu=gpu, users=users,
                             verify=verify if attempt == 0 else None,
                             cgroup_checked=first.members is not None)
        last = rescan
        members = rescan.members
        for t in rescan.targets:
            every.setdefault(t.pid, t)
        for t in rescan.protected:
            left_alone.setdefault(t.pid, t)
        alive = rescan.living({**{t.pid: t for t in scope},
                               **{t.pid: t for t in rescan.targets}}.values())
        workers = [t for t in alive if t.why != SUPERVISOR]
        if not workers and not members:
            break
        last = None
        # Race-free against forks: the kernel kills every member, new children included.
        if spec.cgroup and members and not members & set(left_alone) \
                and await _cgroup_kill(executor, spec):
            cgroup_killed = True
            stamp("cgroup.kill", sorted(members))
            killed += [pid for pid in sorted(members) if pid not in killed]
            say(f"cgroup.kill on {spec.cgroup} ({len(members)} members)")
        if not workers:
            await asyncio.sleep(0.1)  # members not yet reaped (after a cgroup.kill)
            continue
        sent = await send_signal(executor, workers, "SIGKILL")
        stamp("SIGKILL", sent["sent"])
        killed += [pid for pid in sent["sent"] if pid not in killed]
        if sent["sent"]:
            say(f"SIGKILL to {', '.join(map(str, sent['sent']))}")
        still = await _wait_gone(executor, workers, kill_wait_s)
        d_state |= set((await send_signal(executor, still, "0"))["d_state"])
        if still and {t.pid for t in still} <= d_state:
            break  # uninterruptible: report, do not hang
        scope = rescan.targets
    # The supervisor (subreaper) exits by itself once its children are reaped; end it if not.
    supervisors = [t for t in every.values() if t.why == SUPERVISOR]
    if last is not None:
        supervisors = last.living(supervisors)
    if supervisors and await _wait_gone(executor, supervisors, 2.0):
        sent = await send_signal(executor, supervisors, "SIGKILL")
        stamp("SIGKILL", sent["sent"])
        last = None
    # The last rescan saw every target gone but the supervisors, which are waited on above.
    survivors = await _wait_gone(executor, list(every.values()), 0.0) if last is None \
        else []
    cgroup_removed = False
    cgroup_left: frozenset[int] = frozenset()
    if spec.cgroup:
        # Members leave a cgroup when they are reaped: give the last ones a moment (one
        # command on the host, which removes the cgroup the moment it is empty).
        done = await cgroup_op(executor, spec.cgroup, "remove", uid=spec.uid,
                               cgroup_id=spec.cgroup_id, wait_s=5.0)
        if done.get("ok"):
            cgroup_left = frozenset(done.get("members", []))
            cgroup_removed = bool(done.get("removed")) or not done.get("exists", True)
        elif done.get("refused"):
            say(f"not removing the cgroup {spec.cgroup}: {done['refused']}")
        if cgroup_left:
            say(f"cgroup {spec.cgroup} still has {sorted(cgroup_left)}: not removed")
    shm_removed: list[str] = []
    held: list[str] = []
    if remove_shm is not None:
        # The last rescan is current when nothing was signalled after it.
        snapshot = last.snapshot if last is not None \
            else await probe_host(executor, NoGpuBackend(), timeout=15.0)
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
        # The last rescan's reading is current if it saw nothing of the scope alive (not even a
        # supervisor about to exit) and nothing was signalled or removed since.
        current = last.reading if last is not None and not shm_removed \
            and not last.living(every.values()) else None
        report = await check_until_clean([executor], verify, deadline_s=verify_deadline_s,
                                         interval_s=0.25, settle_s=verify_settle_s,
                                         first=current)
    return TeardownReport(
        targets=tuple(t.record() for t in every.values()),
        left_alone=tuple(t.record() for t in left_alone.values()),
        rounds=tuple(rounds),
        killed=tuple(killed),
        root_exit_s=root_exit,
        d_state=tuple(sorted(d_state)),
        survivors=tuple(t.pid for t in survivors),
        cgroup=spec.cgroup,
        cgroup_refused=cgroup_refused,
        cgroup_killed=cgroup_killed,
        cgroup_removed=cgroup_removed,
        cgroup_left=tuple(sorted(cgroup_left)),
        shm_removed=tuple(shm_removed),
        shm_in_use=tuple(held),
        elapsed_s=round(time.monotonic() - started, 3),
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


__all__ = [
    "CGROUP", "DESCENDANT", "ENGINE", "GROUP", "MARKER", "NAMED", "ROOT", "SESSION",
    "SUPERVISOR", "ScopeSpec", "Target", "TeardownReport", "cgroup_op", "is_kernel_thread",
    "protected_pids", "read_cgroup_members", "resolve_scope", "scan_scope",
    "scope_and_protected", "send_signal", "shm_in_use", "skip_teardown", "teardown",
    "valid_cgroup",
]
