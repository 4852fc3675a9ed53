"""The snapshot of a host: frozen, JSON-serializable value objects.

A snapshot is what independent sources said about one host at one moment. Every reading says
where it came from (``source``) and an unknown is explicit: a value the source could not give is
``None`` *and* named in ``unknown_fields`` (GPUs) or the source's ``error`` (sources); it is never
turned into a zero. Units are in the field names (``_mib``, ``_s``, ``_bytes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pydantic import Field, field_validator

from cleanslate.models import Frozen
from cleanslate.redact import redact_argv


class SourceStatus(Frozen):
    """Outcome of one probe source (``processes``, ``gpu``, ``ports``, ``shm``, ``kmsg`` ...).

    ``critical`` sources (processes, GPUs, ports in scope) make the verdict UNKNOWN when they
    fail; the others (kernel log, ``/dev/shm``) only add a warning, since they are read "where
    readable".
    """

    name: str
    ok: bool
    critical: bool = True
    error: str | None = None
    elapsed_s: float = 0.0


class ProcessInfo(Frozen):
    """One process, read from ``/proc``.

    The equivalent command: ``ps -eo pid,ppid,pgid,sid,stat,comm,args``.

    ``comm`` is the kernel's name (what ``prctl(PR_SET_NAME)`` sets, 15 characters at most);
    ``cmdline`` is the argv as the process last wrote it, with secret values redacted
    (:mod:`cleanslate.redact`: another server's ``--api-key``, a ``Bearer`` header) so that no
    snapshot, finding, store row or report carries them. ``run_marker`` is the value of the
    ``CLEANSLATE_RUN`` environment variable, ``None`` when absent *or* unreadable
    (``environ_readable`` tells which). ``create_time`` is seconds since the epoch.
    """

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    comm: str
    cmdline: tuple[str, ...] = ()
    create_time: float
    uid: int | None = None
    run_marker: str | None = None
    environ_readable: bool = False
    threads: int | None = None

    @field_validator("cmdline", mode="before")
    @classmethod
    def _redact(cls, value: object) -> object:
        if isinstance(value, (list, tuple)):
            return tuple(redact_argv([str(a) for a in value]))
        return value

    @property
    def command(self) -> str:
        """The command line as ``ps -o args`` shows it, or ``[comm]`` for kernel threads."""
        return " ".join(self.cmdline) if self.cmdline else f"[{self.comm}]"

    @property
    def is_zombie(self) -> bool:
        """Exited and not reaped by its parent (state ``Z``)."""
        return self.state == "Z"


def is_kernel_thread(proc: ProcessInfo) -> bool:
    """kthreadd and its children: no command line, group and session 0, parent 0 or kthreadd
    (PID 2 on the host; in a PID namespace PID 2 is an ordinary process, with a command line)."""
    return (not proc.cmdline and proc.pgid == 0 and proc.sid == 0 and proc.ppid in (0, 2)
            and proc.pid != 1 and not proc.is_zombie)


def _always(proc: ProcessInfo) -> bool:
    return True


class ProcessTree:
    """The parent links of a snapshot's processes, indexed once.

    Every walk visits a process at most once, so a forged ``ppid`` loop ends it; whether a PID
    is still the process it was (reuse) is for the caller to check with ``create_time``.
    """

    def __init__(self, processes: tuple[ProcessInfo, ...]) -> None:
        self.processes = processes
        self.by_pid: dict[int, ProcessInfo] = {p.pid: p for p in processes}
        self._children: dict[int, list[ProcessInfo]] = {}
        for proc in processes:
            self._children.setdefault(proc.ppid, []).append(proc)

    def children(self, pid: int) -> tuple[ProcessInfo, ...]:
        """The processes whose parent is ``pid``."""
        return tuple(self._children.get(pid, ()))

    def descendants(
        self, roots: Iterable[int], enter: Callable[[ProcessInfo], bool] = _always
    ) -> set[int]:
        """``roots`` (seen or not) and the processes below them, going into a child only where
        ``enter(child)`` is true. The walk never goes below PID 1: init adopts every orphan,
        so what is under it is not its tree."""
        out: set[int] = set()
        stack = list(roots)
        while stack:
            pid = stack.pop()
            if pid in out:
                continue
            out.add(pid)
            if pid == 1:
                continue
            stack.extend(c.pid for c in self._children.get(pid, ())
                         if c.pid not in out and enter(c))
        return out

    def ancestors(self, pid: int) -> list[ProcessInfo]:
        """The parent of ``pid``, its parent, and so on, nearest first: up to PID 1 (included),
        a parent not seen (PID 0, another PID namespace), or a process already on the path."""
        out: list[ProcessInfo] = []
        seen = {pid}
        proc = self.by_pid.get(pid)
        while proc is not None and proc.pid != 1:
            proc = self.by_pid.get(proc.ppid)
            if proc is None or proc.pid in seen:
                break
            seen.add(proc.pid)
            out.append(proc)
        return out


class DeviceHolder(Frozen):
    """A process with ``/dev/nvidia*`` files open (``ls -l /proc/PID/fd``)."""

    pid: int
    devices: tuple[str, ...]


class ListeningSocket(Frozen):
    """A listening TCP socket (``ss -ltnp sport = :PORT``).

    ``pids`` is empty when the owner is not visible (another PID namespace, no permission).
    """

    port: int
    address: str
    inode: int
    pids: tuple[int, ...] = ()


class ShmEntry(Frozen):
    """A file in ``/dev/shm`` whose name matches an engine or NCCL pattern.

    ``size_bytes`` is its length (``st_size``); ``allocated_bytes`` the memory it holds
    (``st_blocks`` x 512: a segment created at its full length and never written holds
    nothing), ``None`` when not read. ``uid`` is its owner, ``None`` when not read: teardown
    removes only files of the run's user. ``held_by``: the PIDs that have it open (a file in
    use is a live process's, not a leftover to weigh; a file only mapped is not seen here).
    """

    name: str
    size_bytes: int
    mtime: float
    pattern: str
    uid: int | None = None
    allocated_bytes: int | None = None
    held_by: tuple[int, ...] = ()

    @property
    def held_bytes(self) -> int:
        """The memory it holds, or its length when that was not read."""
        return self.size_bytes if self.allocated_bytes is None else self.allocated_bytes


class ShmSpace(Frozen):
    """The file system of ``/dev/shm`` (``statvfs``; ``stat -f`` in the fallback; by hand
    ``df -P /dev/shm`` and ``df -i /dev/shm``): its size and what is left for unprivileged
    writers (``f_bavail``, df's "Available"), in bytes, and its inodes (``f_files`` and
    ``f_favail``; ``None``: not read). A tmpfs mounted without a limit reports 0 in total."""

    total_bytes: int
    free_bytes: int
    inodes_total: int | None = None
    inodes_free: int | None = None


class ShmFile(Frozen):
    """One of the largest files under ``/dev/shm``, whatever its name (``du -a /dev/shm``,
    ``ls -ls``; holders by hand: ``ls -l /proc/*/fd | grep /dev/shm``, ``grep /dev/shm
    /proc/*/maps``).

    ``path`` is relative to ``/dev/shm`` (a file in a folder there: ``dir/name``);
    ``deleted``: removed from the folder but still open or mapped, so its memory is still
    held (found through its holders' ``/proc/PID/fd``). ``allocated_bytes`` is the memory it
    holds (``st_blocks`` x 512), ``None`` when not read. ``uid`` and ``user`` name its owner
    (``user`` as the host's password database says, ``None`` when it has no entry or was not
    read). ``held_by``: the PIDs with it open; ``mapped_by``: the PIDs with it mapped (from
    ``/proc/PID/maps``; not read by the fallback probe, see :class:`ShmUsage`)."""

    path: str
    size_bytes: int | None = None
    allocated_bytes: int | None = None
    uid: int | None = None
    user: str | None = None
    deleted: bool = False
    held_by: tuple[int, ...] = ()
    mapped_by: tuple[int, ...] = ()


class ShmUsage(Frozen):
    """What fills ``/dev/shm``, read when it is at least half full (by bytes or inodes), or
    when asked: the largest files (at most ``LARGEST`` of the collector, 10), any name, any
    owner, with the processes that hold them.

    ``files_scanned``: files looked at; ``listed_bytes``: the memory they hold together;
    ``complete``: every file was looked at (``False``: the scan stopped at its bound of files
    or time, or, in the fallback, a folder's contents were not listed). ``maps_read``: the
    mappings (``/proc/PID/maps``) of every process were read (``False``: the fallback, which
    does not read them, or a scan cut by its time bound); ``maps_unreadable``: processes
    whose mappings could not be read (another user's, for a probe that is not root).
    ``elapsed_s``: what the scan cost."""

    largest: tuple[ShmFile, ...] = ()
    files_scanned: int = 0
    listed_bytes: int = 0
    complete: bool = False
    maps_read: bool = False
    maps_unreadable: int = 0
    elapsed_s: float = 0.0


class KernelEvent(Frozen):
    """A kernel log line about the GPU driver (``dmesg | grep 'NVRM: Xid'``).

    ``monotonic_us`` is the record's time since boot in microseconds.
    """

    monotonic_us: int
    message: str
    xid: int | None = None


class GpuProcess(Frozen):
    """A compute process on a GPU (``nvidia-smi --query-compute-apps=pid,used_memory``)."""

    pid: int
    used_mib: int | None = None
    name: str | None = None


class Gpu(Frozen):
    """One GPU as a backend read it.

    ``memory_used_mib`` excludes driver-reserved memory where the source separates it (NVML v2,
    ``nvidia-smi`` of drivers that print ``memory.reserved``), so an idle H200 reads 0-4 MiB and
    not ~615 MiB. ``health`` lists problems the source reported (``GPU is lost``, uncorrected ECC
    errors, pending row remapping); ``unknown_fields`` lists fields the source answered with
    ``[N/A]``, ``[Unknown Error]`` or an unparsable value.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    memory_reserved_mib: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    ecc_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    health: tuple[str, ...] = ()
    unknown_fields: tuple[str, ...] = ()
    source: str


class GpuReading(Frozen):
    """What a GPU backend returned for a whole host.

    ``ok`` is false when the backend failed as a whole (the command exited non-zero, timed out,
    or NVML could not initialise): then ``gpus`` may be empty and ``error`` says why, quoting the
    tool's own message.
    """

    backend: str
    ok: bool
    gpus: tuple[Gpu, ...] = ()
    error: str | None = None
    driver_version: str | None = None
    note: str | None = None
    elapsed_s: float = 0.0
    #: The ``none`` backend, chosen by ``auto`` because no other was usable (see
    #: ``Snapshot.gpu_devices``), not by the user.
    auto_fallback: bool = False


class Snapshot(Frozen):
    """Everything the probe saw on one host. See the module docstring.

    ``sockets`` are the listeners on ``ports_in_scope``; ``listeners`` every listening TCP
    socket on any port, read only when asked (baselines), ``None`` when not read.
    What the probe could not read is said, never dropped: ``stat_unreadable`` (PIDs listed in
    ``/proc`` whose ``stat`` could not be read), ``fd_unreadable`` (PIDs whose open files could
    not be read: a ``/dev/nvidia*`` file or a socket they hold is not seen),
    ``ProcessInfo.environ_readable`` (the run marker), ``proc_hidepid`` (the ``/proc`` mount
    option that hides other users' processes from a non-root probe, ``None`` when nothing is
    hidden). ``boot_id`` is ``/proc/sys/kernel/random/boot_id`` (``None``: not read).
    ``gpu_devices``: the ``/dev/nvidia<N>`` device nodes present (``None``: not read); a host
    with some and no GPU reading is UNKNOWN unless the user chose ``--gpu-backend none``.
    ``shm``: the ``/dev/shm`` files matching the leftover patterns; ``shm_space``: the size and
    free space of ``/dev/shm`` (``None``: not read); ``shm_usage``: its largest files and their
    holders, read when it is at least half full (``None``: not read).
    """

    host: str
    taken_at: str = Field(description="ISO 8601 UTC time the probe started")
    elapsed_s: float
    boot_time: float | None = None
    boot_id: str | None = None
    collector_pid: int | None = None
    exclude_pids: tuple[int, ...] = ()
    ports_in_scope: tuple[int, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    device_holders: tuple[DeviceHolder, ...] = ()
    sockets: tuple[ListeningSocket, ...] = ()
    listeners: tuple[ListeningSocket, ...] | None = None
    stat_unreadable: tuple[int, ...] = ()
    fd_unreadable: tuple[int, ...] = ()
    proc_hidepid: str | None = None
    gpu_devices: tuple[str, ...] | None = None
    shm: tuple[ShmEntry, ...] = ()
    shm_space: ShmSpace | None = None
    shm_usage: ShmUsage | None = None
    kernel_events: tuple[KernelEvent, ...] = ()
    kmsg_last_us: int | None = None
    gpu: GpuReading
    sources: tuple[SourceStatus, ...] = ()

    @property
    def tree(self) -> ProcessTree:
        """The process tree, built once per snapshot. Not a ``cached_property``: ``model_copy``
        copies the cache, and a copy with other processes would get the old tree."""
        tree = self.__dict__.get("_tree")
        if not isinstance(tree, ProcessTree) or tree.processes is not self.processes:
            tree = ProcessTree(self.processes)
            self.__dict__["_tree"] = tree
        return tree

    @property
    def by_pid(self) -> dict[int, ProcessInfo]:
        """``{pid: process}`` (do not change it: it is the tree's)."""
        return self.tree.by_pid

    def process(self, pid: int) -> ProcessInfo | None:
        return self.tree.by_pid.get(pid)
