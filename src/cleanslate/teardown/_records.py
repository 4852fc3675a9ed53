"""The records of a teardown: what to tear down (:class:`ScopeSpec`), a process in scope
(:class:`Target`, kept as :class:`TargetRecord`), and what was done (:class:`TeardownReport`);
why a process is in scope (:class:`Selected`) or never touched (:class:`Protected`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from cleanslate.errors import ExitCode
from cleanslate.models import Frozen
from cleanslate.verdict.check import CheckReport


class Selected(StrEnum):
    """Why a process is in scope (``docs/teardown.md``)."""

    ROOT = "root"
    SUPERVISOR = "supervisor"
    GROUP = "process group"
    SESSION = "session"
    MARKER = "marker"
    DESCENDANT = "descendant"
    NAMED = "named"
    ENGINE = "engine"
    CGROUP = "cgroup"
    RECORDED = "recorded"


class Protected(StrEnum):
    """Why a process is never selected, by any path
    (:func:`cleanslate.teardown.scope.protected_pids`)."""

    INIT = "PID 1 (init)"
    KTHREAD = "a kernel thread"
    ANCESTOR = "an ancestor of this cleanslate process (its shell, terminal or login)"
    SESSION = "in this cleanslate process's session (the terminal session it runs in)"
    OWN = "this cleanslate process or a command it started"


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
    #: The host's boot time that ``create_time`` was computed against (the snapshot's
    #: ``btime``): the signal script compares the time since boot, which a clock adjustment
    #: does not move (``btime`` does, by a whole second).
    boot_time: float | None = None

    def record(self) -> TargetRecord:
        """This process as a :class:`TeardownReport` keeps it."""
        return TargetRecord(pid=self.pid, create_time=self.create_time, comm=self.comm,
                            command=self.command[:TargetRecord.COMMAND_CHARS], why=str(self.why),
                            uid=self.uid, user=self.user,
                            protected=None if self.protected is None else str(self.protected))

    def as_dict(self) -> dict[str, Any]:
        """:meth:`record` as JSON (``clean --json``)."""
        return self.record().model_dump(mode="json")


class TargetRecord(Frozen):
    """A process in a teardown's scope as its report keeps it: a :class:`Target` with its
    command line cut at :attr:`COMMAND_CHARS` characters. In JSON, ``protected`` is present
    only for a process that was left alone."""

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

    ``pgid`` / ``sid`` select nothing: a process carrying them that looks like the run's (it
    holds ``gpus`` (``None``: any GPU) or ``port``, its environment is unreadable, or it matches
    ``signature``, an engine name) is reported, with why it is not verified as the run's (the
    number reused, another owner than ``uid``, not recorded). ``tree`` is ``(path, root)`` of
    the run's recorded process tree (:mod:`cleanslate.teardown._tree`), read while the run has
    no cgroup: its processes with their recorded start times (started after ``not_before`` less
    ``START_SLACK_S``) are selected as ``recorded``.
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
    tree: tuple[str, str] | None = None


class SignalRound(Frozen):
    """One round of signals: when (seconds into the teardown), which, and to whom."""

    at_s: float
    signal: str
    sent: tuple[int, ...]


class TeardownReport(Frozen):
    """What teardown did, and the verification that followed.

    ``refused`` is set when nothing was signalled because the record cannot name processes of
    this host (another boot or another machine); ``refused_code`` is then the exit code (2 for
    another machine: the run may be alive there; the verification's code for another boot).
    """

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


__all__ = ["Protected", "ScopeSpec", "Selected", "SignalRound", "Target", "TargetRecord",
           "TeardownReport"]
