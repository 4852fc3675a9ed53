"""The run's recorded tree: the processes its supervisor saw below itself (``tree.txt`` in the
run's folder, written by :mod:`cleanslate.launch._supervise_script` when the run has no cgroup).

Without a cgroup, this file is what says which processes were the run's once they have left
its group and session and its supervisor is gone: a process is the run's when its PID *and*
start time are recorded here (:func:`cleanslate.teardown.scope.scope_and_protected`). The file
sits in a folder of the store's artifacts, which a store writer or the run's user can write,
so it is read as untrusted input:

- the file is opened below the run's folder without following a link
  (:func:`cleanslate.hosts.files.open_under`: a regular file with one link), is owned by the
  run's user (``RunRecord.uid``; on a remote host, by the SSH user, who runs the supervisor),
  and is at most :data:`MAX_BYTES` long, else it is refused whole;
- every line must be exactly what the supervisor writes: a header ``cleanslate-tree 1 <boot
  id> <clock ticks per second>``, then ``<pid> <start ticks>`` lines of decimal numbers (a last
  line without its newline is a write in progress and is skipped); anything else refuses the
  whole file, whose content is never quoted;
- an entry counts only on the boot it was written on and for a live process whose start time
  is the recorded one (to a clock tick or two), started after the run (less 2 s): a PID of
  the file that now names another process selects nothing.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from cleanslate.hosts.base import Executor
from cleanslate.hosts.files import open_under

#: The file's name in the run's folder (the supervisor's ``TREE_FILE``).
TREE_FILE = "tree.txt"
#: The largest file read: the supervisor stops at 65,536 lines (about 1 MiB).
MAX_BYTES = 2 << 20

_HEADER = re.compile(r"cleanslate-tree 1 ([0-9a-f-]{1,64}) ([0-9]{1,6})")
_ENTRY = re.compile(r"([0-9]{1,10}) ([0-9]{1,20})")


@dataclass(frozen=True)
class RecordedTree:
    """A parsed tree file: the boot it was written on, and ``(pid, seconds after boot)`` of each
    process the supervisor recorded."""

    boot_id: str
    entries: tuple[tuple[int, float], ...]


def parse_tree(data: bytes) -> RecordedTree:
    """The tree file's content, parsed strictly (see the module docstring); a
    :class:`ValueError` saying which line is wrong (never quoting it) otherwise."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("not ASCII text") from None
    lines = text.split("\n")
    lines.pop()  # after the last newline: '' or a line still being written
    if not lines:
        raise ValueError("no header line")
    header = _HEADER.fullmatch(lines[0])
    if header is None:
        raise ValueError("line 1 is not the supervisor's header")
    hz = int(header.group(2))
    if hz <= 0:
        raise ValueError("line 1 gives no clock rate")
    entries: list[tuple[int, float]] = []
    for number, line in enumerate(lines[1:], start=2):
        found = _ENTRY.fullmatch(line)
        if found is None:
            raise ValueError(f"line {number} is not '<pid> <start ticks>'")
        pid, ticks = int(found.group(1)), int(found.group(2))
        if pid <= 1:
            raise ValueError(f"line {number} names PID {pid}")
        entries.append((pid, ticks / hz))
    return RecordedTree(boot_id=header.group(1), entries=tuple(entries))


def _read_local(path: str, root: str, uid: int | None) -> bytes:
    fd = open_under(root, path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # open_under checks it too
            raise PermissionError("not a regular file")
        if uid is not None and info.st_uid != uid:
            raise PermissionError(f"owned by uid {info.st_uid}, not by the run's user (uid {uid})")
        if info.st_size > MAX_BYTES:
            raise PermissionError(f"larger than {MAX_BYTES} bytes")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES and (chunk := os.read(fd, 1 << 16)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


async def read_tree(executor: Executor, where: tuple[str, str] | None, uid: int | None
                    ) -> tuple[RecordedTree | None, str | None]:
    """``(the tree, None)``; ``(None, None)`` when there is none (``where`` is ``None``: the
    record names no folder of the run's own, or the file does not exist: the run had a cgroup,
    or was launched before trees were recorded); ``(None, why)`` when the file is refused.
    ``where`` is ``(path, root)`` as :func:`cleanslate.launch.ready.run_file` gives it."""
    if where is None:
        return None, None
    path, root = where
    try:
        if executor.is_local:
            data = _read_local(path, root, uid)
        else:  # the host's python3 opens it the same way (owner: the SSH user or root)
            data = await executor.read_file(path, max_bytes=MAX_BYTES + 1, under=root)
        return parse_tree(data), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"the run's process tree file {path} is not used: {exc}"


__all__ = ["MAX_BYTES", "TREE_FILE", "RecordedTree", "parse_tree", "read_tree"]
