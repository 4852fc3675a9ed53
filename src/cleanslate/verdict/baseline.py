"""Baselines: what an idle host looked like, saved with ``check --save-baseline F``.

A baseline records, per GPU, the memory in use and the uncorrected ECC count when the host was
idle, the GPU set (UUIDs), the long-lived device-file holders (``nvidia-persistenced``, a DCGM
host engine), the ``/dev/shm`` names already present, the kernel log position, and (version 2)
the boot it was taken in, every listening TCP socket with its owners, and every process (PID and
start time). A check against it then reports what is *new*: a listener on any port (an error),
a process (a warning). It never records processes as acceptable strays: an engine process is a
stray whatever the baseline says.

The file is JSON. Fields are only ever added: a version-1 file (no listeners, no processes, no
boot id) still loads, and a check against it says what it cannot compare.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from cleanslate._output_files import write_output
from cleanslate.errors import InputError
from cleanslate.hosts.files import untrusted
from cleanslate.inputs import MAX_BYTES, read_input
from cleanslate.models import Frozen
from cleanslate.probe.snapshot import ListeningSocket, Snapshot

_HINT = "create one with `cleanslate check --save-baseline FILE`"

#: Largest baseline file read (bytes): a host with 100,000 processes makes about 5 MB.
MAX_BASELINE_BYTES = MAX_BYTES["baseline"]

#: Seconds two readings of a process's start time may differ and still name the same process
#: (the no-python3 probe derives it from whole seconds of elapsed time).
START_TIME_SLACK_S = 1.5

#: The baseline format written by this version.
VERSION = 2


class BaselineGpu(Frozen):

    index: int
    uuid: str | None = None
    memory_used_mib: int | None = None
    ecc_uncorrected: int | None = None


class BaselineListener(Frozen):
    """A listening socket at the baseline: port, address and owners as (PID, start time)."""

    port: int
    address: str
    owners: tuple[tuple[int, float], ...] = ()


class Baseline(Frozen):

    version: int = 1
    host: str
    saved_at: str
    gpu_backend: str
    gpus: tuple[BaselineGpu, ...] = ()
    device_holders: tuple[tuple[int, float], ...] = ()
    shm: tuple[str, ...] = ()
    kmsg_last_us: int | None = None
    boot_id: str | None = None
    #: ``None``: not recorded (a version-1 baseline, or the listeners could not be read).
    listeners: tuple[BaselineListener, ...] | None = None
    #: ``None``: not recorded (a version-1 baseline).
    processes: tuple[tuple[int, float], ...] | None = None

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Baseline:
        create = {p.pid: p.create_time for p in snapshot.processes}
        listeners = None
        if snapshot.listeners is not None:
            listeners = tuple(
                BaselineListener(port=s.port, address=s.address,
                                 owners=tuple((pid, create[pid]) for pid in s.pids
                                              if pid in create))
                for s in snapshot.listeners
            )
        return cls(
            version=VERSION,
            host=snapshot.host,
            saved_at=snapshot.taken_at,
            gpu_backend=snapshot.gpu.backend,
            gpus=tuple(
                BaselineGpu(index=g.index, uuid=g.uuid, memory_used_mib=g.memory_used_mib,
                            ecc_uncorrected=g.ecc_uncorrected)
                for g in snapshot.gpu.gpus
            ),
            device_holders=tuple(
                (h.pid, create[h.pid]) for h in snapshot.device_holders if h.pid in create
            ),
            shm=tuple(e.name for e in snapshot.shm),
            kmsg_last_us=snapshot.kmsg_last_us,
            boot_id=snapshot.boot_id,
            listeners=listeners,
            processes=tuple((p.pid, p.create_time) for p in snapshot.processes),
        )

    def gpu(self, index: int) -> BaselineGpu | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def process_index(self) -> dict[int, list[float]]:
        """Start times by PID of the processes at the baseline (empty when not recorded); see
        :func:`had_process`."""
        index: dict[int, list[float]] = {}
        for pid, create_time in self.processes or ():
            index.setdefault(pid, []).append(create_time)
        return index

    def had_listener(self, sock: ListeningSocket, create: dict[int, float]) -> bool:
        """Whether this listener (same port and address, and one same owner when the owners are
        visible both now and then) was there at the baseline. ``create``: start times by PID."""
        for old in self.listeners or ():
            if old.port != sock.port or old.address != sock.address:
                continue
            owners = [(pid, create[pid]) for pid in sock.pids if pid in create]
            if not owners or not old.owners:
                return not owners and not old.owners
            if any(_known(old.owners, pid, t) for pid, t in owners):
                return True
        return False

    def save(self, path: Path, *, where: str | None = None) -> None:
        """Write the baseline (UTF-8 JSON) with mode 0600 (:meth:`load` refuses a baseline
        others could have written; its process list is no one else's business) through a
        temporary file and a rename, never through a link
        (:func:`cleanslate._output_files.write_output`); a refused or unwritable path is an
        :class:`InputError` naming ``where`` (default: the path)."""
        write_output(path, self.model_dump_json(indent=2) + "\n",
                     where=str(path) if where is None else where)

    @classmethod
    def load(cls, path: Path) -> Baseline:
        """Read a baseline file; a missing, unreadable, oversized, non-UTF-8, non-JSON or
        malformed file is an :class:`InputError`, and so is one that another user owns or
        could have written (writable by group or others, or in a folder that lets others
        replace it: :func:`cleanslate.hosts.files.untrusted`): what a baseline lists is
        accepted as the idle state."""
        problem = untrusted(path)
        if problem is not None:
            raise InputError(f"refused: {problem}", where=str(path),
                             hint="a baseline says which listeners and processes were there "
                                  "when the host was idle: keep it where only you can write "
                                  "(chmod go-w FILE), or save a new one with "
                                  "`cleanslate check --save-baseline FILE`")
        try:  # a regular file only (a FIFO never blocks), at most MAX_BASELINE_BYTES
            raw = read_input(path, kind="baseline")
        except InputError as exc:
            raise InputError(f"{exc.message}: not a baseline", where=str(path),
                             hint=_HINT) from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw[:exc.start].count(b"\n") + 1
            raise InputError(f"not UTF-8 text (byte {exc.start}): not a baseline",
                             where=f"{path}:{line}", hint=_HINT) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc.msg}", where=f"{path}:{exc.lineno}",
                             hint=_HINT) from None
        except RecursionError:
            raise InputError("not JSON: nested too deeply", where=str(path),
                             hint=_HINT) from None
        try:
            baseline = cls.model_validate(data)
        except ValidationError as exc:
            raise InputError.from_validation(exc, what="not a cleanslate baseline",
                                             where=str(path), hint=_HINT) from None
        if baseline.version > VERSION:
            raise InputError(f"baseline format {baseline.version} is newer than this "
                             f"cleanslate reads ({VERSION})", where=str(path),
                             hint="upgrade cleanslate, or save a new baseline")
        return baseline


def had_process(index: dict[int, list[float]], pid: int, create_time: float) -> bool:
    """Whether the process (PID and start time) is in a :meth:`Baseline.process_index`."""
    return any(abs(t - create_time) <= START_TIME_SLACK_S for t in index.get(pid, ()))


def _known(pairs: tuple[tuple[int, float], ...], pid: int, create_time: float) -> bool:
    return any(p == pid and abs(t - create_time) <= START_TIME_SLACK_S for p, t in pairs)
