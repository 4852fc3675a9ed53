"""The host collector: a self-contained, stdlib-only script.

This module is imported by nothing at run time. Its *source* is run by the host's Python
(``python3 -I -``, the source on stdin), locally as a child process of the checker and remotely
over SSH, so that both give the same snapshot JSON by construction and a read of ``/proc`` that
blocks (a process in uninterruptible sleep can block reads of its ``cmdline``) is ended by the
caller's timeout instead of hanging the checker. It must therefore import nothing outside the
standard library and must run on any Python 3 that a GPU host may have (3.8 and newer).

Input: one JSON object on the last line of stdin after the source, see :func:`main`.
Output: one JSON object on stdout, the raw form of :class:`cleanslate.probe.snapshot.Snapshot`
(without the GPU reading, which a GPU backend adds).

Equivalent commands, for a person checking a reading by hand:
processes ``ps -eo pid,ppid,pgid,sid,stat,comm,args``; device holders
``ls -l /proc/*/fd | grep /dev/nvidia``; sockets ``ss -ltnp``; shm ``ls -la /dev/shm``;
kernel ``dmesg | grep 'NVRM: Xid'``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # not at run time: the collector starts in every check, typing is slow to
    from typing import Any  # import

_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")

# /proc is read with os.open and os.read relative to a descriptor of /proc/PID: open() costs
# three more system calls per file (fstat, ioctl, lseek) and a path walk of /proc/PID each
# time, which made the census three times slower (benchmarks/check_latency.py). A descriptor
# of /proc/PID also keeps naming that process: once it exits, reads fail instead of reading a
# new process that got the same PID.
_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_DIR = _RDONLY | getattr(os, "O_DIRECTORY", 0)
_CHUNK = 1 << 17
#: Bytes of a process's environment read at most (64 MiB). ``execve`` takes at most 6 MiB of
#: arguments and environment together on Linux 4.13 and newer (a quarter of the stack limit
#: before), but a process with ``CAP_SYS_RESOURCE`` can point its environment at any memory
#: (``prctl(PR_SET_MM_ENV_END)``): a bigger one is counted as not read, not searched in part.
ENVIRON_LIMIT = 1 << 26


def _read(path: str, limit: int = 1 << 20, dir_fd: int | None = None) -> bytes:
    """Up to ``limit`` bytes of ``path`` (relative to ``dir_fd`` when given), reading until
    the end of the file: a file of /proc may come in several reads."""
    fd = os.open(path, _RDONLY, dir_fd=dir_fd)
    try:
        chunks = []
        size = 0
        while size < limit:
            chunk = os.read(fd, min(_CHUNK, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _boot_time() -> float | None:
    for line in _read("/proc/stat").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return None


def _processes(
    marker: str, errors: list[int], environ_limit: int = ENVIRON_LIMIT,
    boot: float | None = None,
) -> list[dict[str, Any]]:
    """Every process from /proc/PID/{stat,cmdline,environ}. PIDs listed in /proc whose stat
    could not be read (other than because they exited) are appended to ``errors``. ``boot`` is
    the boot time the snapshot reports (read once: ``btime`` moves by a whole second when the
    clock is adjusted, and start times must agree with the boot time they are reported with)."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = (boot if boot is not None else _boot_time()) or 0.0
    needle = marker.encode() + b"="
    out: list[dict[str, Any]] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            base = os.open("/proc/" + name, _DIR)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        except OSError:
            errors.append(pid)
            continue
        try:
            entry = _process(pid, base, needle, ticks, boot, environ_limit)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        except OSError:
            errors.append(pid)
            continue
        finally:
            os.close(base)
        out.append(entry)
    return out


def _marker(base: int, needle: bytes, limit: int) -> tuple[str | None, bool]:
    """(the value of the first ``NAME=`` entry ``needle`` of /proc/PID/environ, whether the
    environment was read). The environment is read whole, up to ``limit`` bytes: past that, a
    marker not yet seen, or one whose value is cut, could be there unseen, so the environment
    counts as not read (the verdict says how many were not). Raises OSError when it cannot be
    read at all."""
    env = bytearray()
    fd = os.open("environ", _RDONLY, dir_fd=base)
    try:
        while len(env) <= limit:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            env += chunk
    finally:
        os.close(fd)
    cut = len(env) > limit
    if cut:
        del env[limit:]
    at = env.find(needle)
    while at > 0 and env[at - 1] != 0:
        at = env.find(needle, at + 1)
    if at < 0:
        return None, not cut
    end = env.find(b"\0", at)
    if end < 0 and cut:
        return None, False
    return env[at + len(needle) : end if end >= 0 else None].decode("utf-8", "replace"), True


def _process(
    pid: int, base: int, needle: bytes, ticks: int, boot: float,
    environ_limit: int = ENVIRON_LIMIT,
) -> dict[str, Any]:
    """One process, from its /proc/PID (the descriptor ``base``). Raises OSError when its
    stat or owner cannot be read."""
    stat = _read("stat", dir_fd=base).decode("utf-8", "replace")
    st_uid = os.fstat(base).st_uid
    # comm may contain spaces and parentheses: it lies between the first '(' and last ')'.
    lpar = stat.find("(")
    rpar = stat.rfind(")")
    comm = stat[lpar + 1 : rpar]
    fields = stat[rpar + 2 :].split()
    try:
        cmdline_raw = _read("cmdline", dir_fd=base)
    except OSError:
        cmdline_raw = b""
    cmdline = [a.decode("utf-8", "replace") for a in cmdline_raw.split(b"\0")]
    while cmdline and cmdline[-1] == "":
        cmdline.pop()
    try:
        run_marker, environ_readable = _marker(base, needle, environ_limit)
    except OSError:
        run_marker, environ_readable = None, False
    return {
        "pid": pid,
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "state": fields[0],
        "comm": comm,
        "cmdline": cmdline,
        "create_time": round(boot + int(fields[19]) / ticks, 2),
        "uid": st_uid,
        "run_marker": run_marker,
        "environ_readable": environ_readable,
        "threads": int(fields[17]),
    }


def _listening() -> dict[int, tuple[int, str]]:
    """Every LISTEN socket from /proc/net/tcp and tcp6: {inode: (port, addr)}.

    ``tcp6`` is absent where IPv6 is disabled; any other failure to read a table raises, since
    a listener in it would go unseen.
    """
    found: dict[int, tuple[int, str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = _read(table, 1 << 28).decode().splitlines()[1:]
        except FileNotFoundError:
            if table.endswith("6"):
                continue
            raise
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "0A":  # 0A: TCP_LISTEN
                continue
            addr_hex, port_hex = parts[1].split(":")
            found[int(parts[9])] = (int(port_hex, 16), _addr(addr_hex))
    return found


def _addr(hexaddr: str) -> str:
    if len(hexaddr) == 8:
        return ".".join(str(b) for b in reversed(bytes.fromhex(hexaddr)))
    words = [bytes.fromhex(hexaddr[i : i + 8])[::-1].hex() for i in range(0, 32, 8)]
    full = "".join(words)
    return ":".join(full[i : i + 4] for i in range(0, 32, 4))


def _fd_scan(
    pids: list[int], socket_inodes: set[int], shm_prefix: str = "/dev/shm/",
    shm_open: dict[str, set[int]] | None = None,
    shm_deleted: dict[str, os.stat_result] | None = None,
) -> tuple[list[dict[str, Any]], dict[int, set[int]], list[int]]:
    """Device files /dev/nvidia* each process holds, the owners of the given sockets, and the
    PIDs whose open files could not be read (no permission: they may hold either unseen).
    ``shm_open`` (when given) gets, per file name under ``shm_prefix``, the PIDs holding it
    open: a file in use is not a leftover. ``shm_deleted`` (when given) gets the status of
    each file under ``shm_prefix`` that was removed while open (its name ends in
    `` (deleted)``): read through the descriptor, the only way to it."""
    holders: list[dict[str, Any]] = []
    owners: dict[int, set[int]] = {}
    unreadable: list[int] = []
    for pid in pids:
        try:
            fd_dir = os.open(f"/proc/{pid}/fd", _DIR)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited
        except OSError:
            unreadable.append(pid)
            continue
        try:
            try:
                fds = os.listdir(fd_dir)
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited
            except OSError:
                unreadable.append(pid)
                continue
            devices: set[str] = set()
            denied = False
            for fd in fds:
                try:
                    target = os.readlink(fd, dir_fd=fd_dir)
                except (FileNotFoundError, ProcessLookupError):
                    continue  # closed, or exited, meanwhile
                except OSError:
                    denied = True
                    continue
                if target.startswith("/dev/nvidia"):
                    devices.add(target)
                elif shm_open is not None and target.startswith(shm_prefix):
                    name = target[len(shm_prefix):]
                    shm_open.setdefault(name, set()).add(pid)
                    if (shm_deleted is not None and name.endswith(_DELETED)
                            and name not in shm_deleted):
                        try:
                            shm_deleted[name] = os.stat(fd, dir_fd=fd_dir)
                        except OSError:
                            continue  # closed meanwhile: its memory is free
                elif socket_inodes and target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in socket_inodes:
                        owners.setdefault(inode, set()).add(pid)
        finally:
            os.close(fd_dir)
        if devices:
            holders.append({"pid": pid, "devices": sorted(devices)})
        if denied:
            unreadable.append(pid)
    return holders, owners, unreadable


def _shm(directory: str, patterns: list[str],
         held: dict[str, set[int]] | None = None) -> list[dict[str, Any]]:
    """The files of ``directory`` whose name matches one of ``patterns`` (``fnmatch``), each
    with the first pattern it matches, its owner, the memory it holds (its blocks) and the
    PIDs that hold it open (``held``: from the open-file scan)."""
    held = held or {}
    out: list[dict[str, Any]] = []
    if not patterns:
        return out
    # One expression for all patterns, the first that matches named by its group: a full
    # /dev/shm of 10,000 files took 41 ms with a fnmatchcase per name and pattern, 4 ms so.
    match = re.compile("|".join(f"(?P<p{i}>{fnmatch.translate(p)})"
                                for i, p in enumerate(patterns))).match
    for name in sorted(os.listdir(directory)):
        found = match(name)
        if found is None or found.lastgroup is None:
            continue
        try:
            st = os.lstat(os.path.join(directory, name))
        except OSError:
            continue
        out.append(
            {"name": name, "size_bytes": st.st_size, "mtime": st.st_mtime,
             "pattern": patterns[int(found.lastgroup[1:])], "uid": st.st_uid,
             "allocated_bytes": st.st_blocks * 512,
             "held_by": sorted(held.get(name, ()))}
        )
    return out


def _shm_space(directory: str) -> dict[str, int]:
    """The size of ``directory``'s file system, its space left for unprivileged writers, and
    its inodes (total and free)."""
    st = os.statvfs(directory)
    return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize,
            "inodes_total": st.f_files, "inodes_free": st.f_favail}


_DELETED = " (deleted)"
#: The largest files of /dev/shm reported, and the bounds of the scan that finds them: files
#: looked at, and seconds for the walk and for the mappings each.
SHM_LARGEST = 10
SHM_SCAN_FILES = 200_000
SHM_SCAN_S = 1.0


def _half_full(space: dict[str, int]) -> bool:
    """Whether /dev/shm is at least half full, by bytes or by inodes: then what fills it is
    read. The verdict's threshold (``verdict.rules.shm_required_free``) is never above half
    its size, so a /dev/shm it calls low always comes with that evidence."""
    total, inodes = space["total_bytes"], space["inodes_total"]
    return (total > 0 and space["free_bytes"] * 2 <= total) or \
        (inodes > 0 and space["inodes_free"] * 2 <= inodes)


def _shm_usage(
    directory: str, pids: list[int], held: dict[str, set[int]],
    deleted: dict[str, os.stat_result], deadline: float,
) -> dict[str, Any]:
    """The :data:`SHM_LARGEST` files under ``directory`` (any name, in any folder there, on
    the same file system) that hold the most memory, with their owners and holders: ``held``
    (open, from the open-file scan), ``deleted`` (removed but still open) and the mappings of
    ``pids`` (``/proc/PID/maps``). Bounded: :data:`SHM_SCAN_FILES` files and
    :data:`SHM_SCAN_S` seconds for the walk, as long again for the mappings, never past
    ``deadline``; what was cut is said (``complete``, ``maps_read``)."""
    import heapq
    import stat as st_mode

    started = time.monotonic()
    stop = min(deadline, started + SHM_SCAN_S)
    top: list[tuple[int, str, Any]] = []
    scanned = listed = 0
    complete = True
    root_dev = os.stat(directory).st_dev  # followed: /dev/shm may be a link to /run/shm
    folders = [""]
    while folders and complete:
        rel = folders.pop()
        try:
            it = os.scandir(os.path.join(directory, rel) if rel else directory)
        except OSError:
            complete = False
            continue
        with it:
            for entry in it:
                if scanned >= SHM_SCAN_FILES or time.monotonic() > stop:
                    complete = False
                    break
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                path = rel + "/" + entry.name if rel else entry.name
                if st_mode.S_ISDIR(info.st_mode):
                    if info.st_dev == root_dev:
                        folders.append(path)
                    continue
                scanned += 1
                held_bytes = info.st_blocks * 512
                listed += held_bytes
                item = (held_bytes, path, info)
                if len(top) < SHM_LARGEST:
                    heapq.heappush(top, item)
                elif held_bytes > top[0][0]:
                    heapq.heapreplace(top, item)
    for name, info in deleted.items():
        item = (info.st_blocks * 512, name, info)
        if len(top) < SHM_LARGEST:
            heapq.heappush(top, item)
        elif item[0] > top[0][0]:
            heapq.heapreplace(top, item)
    mapped, maps_read, maps_unreadable = _maps_scan(
        pids, directory.rstrip("/") + "/", min(deadline, time.monotonic() + SHM_SCAN_S))
    import pwd

    largest = []
    for held_bytes, path, info in sorted(top, key=lambda t: (-t[0], t[1])):
        try:
            user: str | None = pwd.getpwuid(info.st_uid).pw_name
        except (KeyError, OverflowError):
            user = None
        is_deleted = path.endswith(_DELETED)
        largest.append({
            "path": path[: -len(_DELETED)] if is_deleted else path,
            "size_bytes": info.st_size, "allocated_bytes": held_bytes, "uid": info.st_uid,
            "user": user, "deleted": is_deleted,
            "held_by": sorted(held.get(path, ())), "mapped_by": sorted(mapped.get(path, ())),
        })
    return {"largest": largest, "files_scanned": scanned, "listed_bytes": listed,
            "complete": complete, "maps_read": maps_read, "maps_unreadable": maps_unreadable,
            "elapsed_s": round(time.monotonic() - started, 4)}


def _maps_scan(
    pids: list[int], prefix: str, stop: float
) -> tuple[dict[str, set[int]], bool, int]:
    """Per file under ``prefix`` (its path after the prefix, `` (deleted)`` kept), the PIDs
    that have it mapped; whether every process's mappings were read before ``stop``; and how
    many processes' could not be read (no permission)."""
    needle = (" " + prefix).encode()
    mapped: dict[str, set[int]] = {}
    unreadable = 0
    for pid in pids:
        if time.monotonic() > stop:
            return mapped, False, unreadable
        try:
            data = _read(f"/proc/{pid}/maps", 1 << 26)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited
        except OSError:
            unreadable += 1
            continue
        if needle not in data:
            continue
        for line in data.split(b"\n"):
            at = line.find(needle)
            if at >= 0:
                name = line[at + len(needle):].decode("utf-8", "surrogateescape")
                mapped.setdefault(name, set()).add(pid)
    return mapped, True, unreadable


def _boot_id() -> str | None:
    try:
        return _read("/proc/sys/kernel/random/boot_id").decode().strip() or None
    except OSError:
        return None


def _gpu_devices() -> list[str] | None:
    """The NVIDIA GPU device nodes (``/dev/nvidia0`` ...), ``None`` when /dev is unreadable."""
    try:
        names = os.listdir("/dev")
    except OSError:
        return None
    return sorted("/dev/" + n for n in names if n.startswith("nvidia") and n[6:].isdigit())


def _hidepid() -> str | None:
    """The ``hidepid`` option of the /proc mount when it hides other users' processes from this
    user (``None``: it does not, or this is root)."""
    if os.geteuid() == 0:
        return None
    for line in _read("/proc/self/mountinfo").decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[4] == "/proc":
            for option in line.split(" - ", 1)[-1].split()[-1].split(","):
                if option.startswith("hidepid=") and option[8:] not in ("0", "off"):
                    return option
    return None


def _kmsg(
    since_us: int | None, deadline: float
) -> tuple[list[dict[str, Any]], int | None]:
    """GPU driver lines from /dev/kmsg (needs root or kernel.dmesg_restrict=0).

    Returns (events, last_us): Xid lines newer than ``since_us`` and the newest record's time.
    """
    events: list[dict[str, Any]] = []
    last_us: int | None = None
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        while time.monotonic() < deadline:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: the ring buffer overwrote the record; go on
                    continue
                raise
            if not record:
                break
            head, _, message = record.decode("utf-8", "replace").partition(";")
            meta = head.split(",")
            ts_us = int(meta[2]) if len(meta) > 2 else 0
            last_us = ts_us
            if "NVRM" not in message or (since_us is not None and ts_us <= since_us):
                continue
            text = message.splitlines()[0] if message else ""
            match = _XID.search(text)
            events.append(
                {"monotonic_us": ts_us, "message": text.strip(),
                 "xid": int(match.group(1)) if match else None}
            )
    finally:
        os.close(fd)
    return events, last_us


def _source(
    name: str, critical: bool, started: float, error: str | None = None
) -> dict[str, Any]:
    return {"name": name, "ok": error is None, "critical": critical, "error": error,
            "elapsed_s": round(time.monotonic() - started, 4)}


def collect(options: dict[str, Any]) -> dict[str, Any]:
    """Collect every source; a failing source yields an explicit error, never a zero.

    Options: ``ports`` (listeners on these are reported as ``sockets``), ``listeners`` (also
    report every listening socket, any port, as ``listeners``), ``marker``, ``budget_s``,
    ``environ_limit`` (bytes of each environment read at most: :data:`ENVIRON_LIMIT`),
    ``shm_dir``, ``shm_patterns`` (the ``fnmatch`` patterns of the ``/dev/shm`` names to
    report: the engines' leftovers, which the caller takes from the engine registry; none
    reported without them), ``shm_usage`` (read the largest files of ``/dev/shm`` and their
    holders even when it is less than half full), ``kmsg`` (read the kernel log),
    ``kmsg_since_us`` with ``kmsg_since_boot_id`` (only kernel records after that position of
    that boot).
    """
    ports = set(options.get("ports") or ())
    marker = options.get("marker") or "CLEANSLATE_RUN"
    deadline = time.monotonic() + float(options.get("budget_s") or 10.0)
    t_all = time.monotonic()
    result: dict[str, Any] = {
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "collector_pid": os.getpid(),
        "ports_in_scope": sorted(ports),
    }
    sources: list[dict[str, Any]] = []
    result["sources"] = sources

    started = time.monotonic()
    try:
        result["boot_time"] = _boot_time()
        result["boot_id"] = _boot_id()
        result["proc_hidepid"] = _hidepid()
        result["gpu_devices"] = _gpu_devices()
        errors: list[int] = []
        procs = _processes(marker, errors,
                           int(options.get("environ_limit") or ENVIRON_LIMIT),
                           result["boot_time"])
        result["processes"] = procs
        # Unreadable single processes are reported by PID (the verdict says how many); a
        # failed listing fails the source.
        result["stat_unreadable"] = errors
        sources.append(_source("processes", True, started))
    except Exception as exc:
        procs = []
        sources.append(_source("processes", True, started, f"{type(exc).__name__}: {exc}"))

    started = time.monotonic()
    want_all = bool(options.get("listeners"))
    sockets: dict[int, tuple[int, str]] = {}
    sockets_error: str | None = None
    try:
        sockets = _listening() if ports or want_all else {}
    except Exception as exc:
        sockets_error = f"{type(exc).__name__}: {exc}"

    shm_open: dict[str, set[int]] = {}
    shm_deleted: dict[str, os.stat_result] = {}
    try:
        holders, owners, fd_unreadable = _fd_scan(
            [p["pid"] for p in procs], set(sockets),
            (options.get("shm_dir") or "/dev/shm").rstrip("/") + "/", shm_open, shm_deleted)
        result["device_holders"] = holders
        result["fd_unreadable"] = fd_unreadable
        sources.append(_source("device_files", True, started))
    except Exception as exc:
        owners = {}
        sources.append(_source("device_files", True, started,
                               f"{type(exc).__name__}: {exc}"))

    def socket_dicts(wanted: set[int] | None) -> list[dict[str, Any]]:
        return [
            {"port": port, "address": addr, "inode": inode,
             "pids": sorted(owners.get(inode, ()))}
            for inode, (port, addr) in sorted(sockets.items())
            if wanted is None or port in wanted
        ]

    result["sockets"] = socket_dicts(ports)
    if want_all and sockets_error is None:
        result["listeners"] = socket_dicts(None)
    sources.append(_source("ports", True, started, sockets_error))

    # The space of /dev/shm is a verdict of its own (a full one fails the next start whatever
    # fills it): a statvfs that fails is a critical source, never a clean host.
    shm_dir = options.get("shm_dir") or "/dev/shm"
    started = time.monotonic()
    space: dict[str, int] | None = None
    try:
        space = result["shm_space"] = _shm_space(shm_dir)
        sources.append(_source("shm_space", True, started))
    except Exception as exc:
        sources.append(_source("shm_space", True, started, f"{type(exc).__name__}: {exc}"))

    started = time.monotonic()
    try:
        result["shm"] = _shm(shm_dir, [str(p) for p in options.get("shm_patterns") or ()],
                             shm_open)
        if space is not None and (options.get("shm_usage") or _half_full(space)):
            result["shm_usage"] = _shm_usage(shm_dir, [p["pid"] for p in procs], shm_open,
                                             shm_deleted, deadline)
        sources.append(_source("shm", False, started))
    except Exception as exc:
        sources.append(_source("shm", False, started, f"{type(exc).__name__}: {exc}"))

    started = time.monotonic()
    if options.get("kmsg", True):
        try:
            since = options.get("kmsg_since_us")
            # A position from another boot means nothing in this one: read the whole log.
            since_boot = options.get("kmsg_since_boot_id")
            if since_boot and since_boot != result.get("boot_id"):
                since = None
            events, last_us = _kmsg(since, deadline)
            result["kernel_events"] = events
            result["kmsg_last_us"] = last_us
            sources.append(_source("kmsg", False, started))
        except Exception as exc:
            sources.append(_source("kmsg", False, started, f"{type(exc).__name__}: {exc}"))

    result["elapsed_s"] = round(time.monotonic() - t_all, 4)
    return result


def main() -> None:
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    # One write: json.dump writes each small piece of the document on its own.
    sys.stdout.write(json.dumps(collect(options), separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
