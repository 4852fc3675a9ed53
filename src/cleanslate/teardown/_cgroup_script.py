"""Act on a run's recorded cgroup, but only when it really is the run's own cgroup (v2).

A self-contained, stdlib-only script (shipped to a host's ``python3`` like
``_signal_script.py``). A run record names its cgroup by path, and a record can come from a
store that someone else writes: a plain folder named ``cleanslate-<run id>`` with a text file
``cgroup.procs`` in it would otherwise list any PIDs it likes for teardown to kill. So before
every operation the path is checked, on the host, through file descriptors (no path is looked
up twice):

- it is absolute and normalised and it is its own ``realpath`` (no symbolic link on the way);
- its parent directory, and the directory itself, are in a cgroup v2 file system:
  ``fstatfs`` says ``CGROUP2_SUPER_MAGIC`` (``0x63677270``);
- the directory is opened with ``O_NOFOLLOW | O_DIRECTORY``, and is owned by ``uid`` (the
  user the run's supervisor ran as, which created it; ``null``, for records made before the
  uid was kept: the user running this script), and, when ``ino`` is given, it is the
  very directory the supervisor created (cgroup v2 inode numbers are cgroup ids, never reused
  within a boot).

Input (argv[1], JSON): ``{"path": .., "op": "members" | "kill" | "remove", "uid": int | null,
"ino": int | null, "wait_s": float}``. ``members`` reads ``cgroup.procs`` (after waiting up to
``wait_s`` seconds for it to empty); ``kill`` writes ``1`` to ``cgroup.kill``; ``remove`` waits
like ``members`` and removes the cgroup when it is empty.

Output (stdout, JSON): ``{"ok": true, "exists": bool, "members": [..], "killed": bool,
"removed": bool}``; ``{"ok": false, "refused": why}`` when the path is not the run's cgroup;
``{"ok": false, "error": why}`` when it could not be read.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys
import time
from typing import Any

CGROUP2_SUPER_MAGIC = 0x63677270
#: Seconds between readings of ``cgroup.procs`` while waiting for it to empty.
POLL_S = 0.01


class Refused(Exception):
    """The path is not the run's cgroup."""


def fs_magic(fd: int) -> int:
    """The ``f_type`` of the file system that ``fd`` is on (``fstatfs(2)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    # f_type is the first field: a long, except on s390x (an unsigned int).
    kind = ctypes.c_uint if os.uname().machine == "s390x" else ctypes.c_ulong
    return int(kind.from_buffer(buf).value) & 0xFFFFFFFF


def open_cgroup(path: str, uid: int | None, ino: int | None) -> tuple[int, int | None]:
    """``(parent fd, cgroup fd or None when it does not exist)`` after the checks above."""
    if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
        raise Refused(f"{path!r} is not an absolute, normalised path")
    if os.path.realpath(path) != path:
        raise Refused(f"{path} resolves to {os.path.realpath(path)} (a symbolic link)")
    parent, name = os.path.split(path)
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Refused(f"its parent {parent} does not exist") from None
    try:
        if fs_magic(parent_fd) != CGROUP2_SUPER_MAGIC:
            raise Refused(f"{parent} is not in a cgroup v2 file system")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent_fd)
        except FileNotFoundError:
            return parent_fd, None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(f"{path} is not a directory") from None
            raise
        try:
            if fs_magic(fd) != CGROUP2_SUPER_MAGIC:
                raise Refused(f"{path} is not in a cgroup v2 file system")
            st = os.fstat(fd)
            if uid is not None and st.st_uid != uid:
                raise Refused(f"{path} is owned by uid {st.st_uid}, not by the run's "
                              f"supervisor (uid {uid})")
            if ino is not None and st.st_ino != ino:
                raise Refused(f"{path} is not the cgroup the run's supervisor created (cgroup "
                              f"id {st.st_ino}, recorded {ino})")
        except BaseException:
            os.close(fd)
            raise
        return parent_fd, fd
    except BaseException:
        os.close(parent_fd)
        raise


def members(fd: int) -> list[int]:
    pfd = os.open("cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
    try:
        data = b""
        while chunk := os.read(pfd, 1 << 16):
            data += chunk
            if len(data) > 1 << 22:
                raise OSError(errno.EFBIG, "cgroup.procs is larger than 4 MiB")
    finally:
        os.close(pfd)
    return [int(line) for line in data.split()]


def wait_empty(fd: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = members(fd)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = members(fd)
    return left


def run(spec: dict[str, Any]) -> dict[str, Any]:
    op = spec.get("op", "members")
    uid = spec.get("uid")
    ino = spec.get("ino")
    try:
        parent_fd, fd = open_cgroup(str(spec["path"]), os.geteuid() if uid is None else int(uid),
                                    None if ino is None else int(ino))
    except Refused as exc:
        return {"ok": False, "refused": str(exc)}
    out: dict[str, Any] = {"ok": True, "exists": fd is not None, "members": [],
                           "killed": False, "removed": False}
    try:
        if fd is None:
            return out  # a populated cgroup cannot be removed: all its members have ended
        if op == "kill":
            try:
                kfd = os.open("cgroup.kill", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return {**out, "error": "no cgroup.kill (Linux before 5.14)"}
            try:
                os.write(kfd, b"1")
                out["killed"] = True
            finally:
                os.close(kfd)
            return out
        out["members"] = wait_empty(fd, float(spec.get("wait_s") or 0.0))
        if op == "remove" and not out["members"]:
            name = os.path.basename(str(spec["path"]))
            try:
                os.rmdir(name, dir_fd=parent_fd)
                out["removed"] = True
            except FileNotFoundError:
                out["removed"] = True
            except OSError as exc:
                out["error"] = f"cannot remove it: {exc.strerror}"
        return out
    finally:
        if fd is not None:
            os.close(fd)
        os.close(parent_fd)


def main() -> int:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    try:
        out = run(spec)
    except (OSError, ValueError) as exc:
        out = {"ok": False, "error": str(exc)}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
