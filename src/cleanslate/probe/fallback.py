"""The probe of a host without ``python3``: one POSIX shell script, its output parsed here.

The collector (:mod:`cleanslate.probe._collect`) needs a Python on the host. Where there is none
(a minimal image, a restricted account), :func:`run_fallback` sends :data:`FALLBACK_SCRIPT` to
``sh`` and builds the same raw snapshot dict from standard tools:

===============  ==========================================================  ===============
source           command                                                     when it fails
===============  ==========================================================  ===============
processes        ``ps -eo pid=,comm=`` and                                   critical
                 ``ps -ww -eo pid=,ppid=,pgid=,sid=,stat=,etimes=,nlwp=,
                 uid=,args=`` (procps)
device_files     ``ls -l /proc/[0-9]*/fd`` (``/dev/nvidia*`` targets and     critical
                 socket owners)
ports            ``cat /proc/net/tcp /proc/net/tcp6``                        critical
run_markers      ``grep -a -z -H '^CLEANSLATE_RUN=' /proc/[0-9]*/environ``    warning
shm              ``ls -ln --time-style=+%s /dev/shm`` (GNU ls)               warning
kmsg             not read by the fallback                                    warning
===============  ==========================================================  ===============

What it cannot tell as well as the collector, and says so: ``create_time`` comes from
``etimes`` (whole seconds); ``cmdline`` is ``ps``'s space-joined ``args`` split on spaces (enough
for the engine signatures, which match the space-joined command line); ``environ_readable`` is
``False`` for the processes whose environment ``grep`` could not read, as in the collector; the
kernel log is not read.
"""

from __future__ import annotations

import fnmatch
import re
import time
from typing import Any

from cleanslate.hosts.base import CommandResult, Executor
from cleanslate.probe._collect import SHM_PATTERNS

#: The shell script run on the host (``sh -c SCRIPT sh PORTS``). Every section starts with a
#: ``@@name`` line; ``@@rc N`` after a section is the exit status of its command.
FALLBACK_SCRIPT = r"""
echo "@@self $$"
echo "@@now $(date +%s)"
echo "@@uid $(id -u)"
echo "@@btime"; grep '^btime ' /proc/stat 2>/dev/null
echo "@@comm"; ps -eo pid=,comm=; echo "@@rc $?"
echo "@@ps"; ps -ww -eo pid=,ppid=,pgid=,sid=,stat=,etimes=,nlwp=,uid=,args=; echo "@@rc $?"
echo "@@tcp"; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; echo "@@rc $?"
echo "@@fd"; ls -l /proc/[0-9]*/fd 2>/dev/null; echo "@@rc $?"
echo "@@marker"
{ grep -a -z -H '^CLEANSLATE_RUN=' /proc/[0-9]*/environ | tr '\0' '\n'; } 2>&1
echo "@@rc $?"
echo "@@shm"; ls -ln --time-style=+%s /dev/shm; echo "@@rc $?"
echo "@@end"
"""

MARKER = "CLEANSLATE_RUN"
_NOT_READ = "not read: the host has no python3, and the fallback probe (ps, ls, cat) "


def needs_fallback(result: CommandResult) -> bool:
    """Whether the collector failed because the host has no such Python (exit 127, or a shell's
    ``not found``), as opposed to a probe that timed out or a host that cannot be reached."""
    if result.timed_out or result.returncode is None:
        return False
    if result.returncode == 127:
        return True
    text = result.stderr.decode(errors="replace").lower()
    return result.returncode != 0 and "python" in text and (
        "not found" in text or "no such file" in text)


async def run_fallback(
    executor: Executor, *, ports: list[int], timeout: float, shm_dir: str | None = None
) -> tuple[dict[str, Any] | None, CommandResult]:
    """Run :data:`FALLBACK_SCRIPT` on the host and parse it (``None`` when the script failed)."""
    script = FALLBACK_SCRIPT
    if shm_dir:
        script = script.replace("/dev/shm", _sh_quote(shm_dir))
    result = await executor.run(["sh", "-c", script, "sh"], timeout=timeout)
    if result.timed_out or result.returncode is None:
        return None, result
    text = result.stdout.decode("utf-8", "replace")
    if "@@end" not in text:
        return None, result
    return parse_fallback(text, ports=set(ports)), result


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _sections(text: str) -> tuple[dict[str, list[str]], dict[str, int], dict[str, str]]:
    sections: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    heads: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("@@"):
            word, _, rest = line[2:].partition(" ")
            if word == "rc" and current is not None:
                codes[current] = int(rest) if rest.strip().lstrip("-").isdigit() else -1
                continue
            current = word
            sections[word] = []
            heads[word] = rest.strip()
            continue
        if current is not None:
            sections[current].append(line)
    return sections, codes, heads


def _source(name: str, critical: bool, error: str | None = None) -> dict[str, Any]:
    return {"name": name, "ok": error is None, "critical": critical, "error": error,
            "elapsed_s": 0.0}


def parse_fallback(text: str, *, ports: set[int]) -> dict[str, Any]:
    """Turn the script's output into the collector's raw snapshot dict (see the module doc)."""
    sections, codes, heads = _sections(text)
    sources: list[dict[str, Any]] = []
    out: dict[str, Any] = {"sources": sources, "ports_in_scope": sorted(ports)}
    self_pid = heads.get("self", "")
    out["collector_pid"] = int(self_pid) if self_pid.isdigit() else None
    now_text = heads.get("now", "")
    now = float(now_text) if now_text.isdigit() else time.time()
    out["taken_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    for line in sections.get("btime", []):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out["boot_time"] = float(parts[1])

    markers, unreadable, marker_error = _markers(sections.get("marker", []))
    processes, error = _processes(sections, codes, now, markers, unreadable)
    out["processes"] = processes
    sources.append(_source("processes", True, error))

    holders, sockets_by_inode, fd_error = _fds(sections.get("fd"), codes.get("fd"))
    out["device_holders"] = holders
    sources.append(_source("device_files", True, fd_error))

    listening, tcp_error = _listening(sections.get("tcp"), codes.get("tcp"), ports)
    out["sockets"] = [
        {"port": port, "address": addr, "inode": inode,
         "pids": sorted(sockets_by_inode.get(inode, ()))}
        for inode, (port, addr) in sorted(listening.items())
    ]
    sources.append(_source("ports", True, tcp_error if ports else None))

    sources.append(_source("run_markers", False, marker_error))
    shm, shm_error = _shm(sections.get("shm"), codes.get("shm"))
    out["shm"] = shm
    sources.append(_source("shm", False, shm_error))
    sources.append(_source("kmsg", False, _NOT_READ + "does not read the kernel log"))
    return out


def _processes(
    sections: dict[str, list[str]], codes: dict[str, int], now: float, markers: dict[int, str],
    unreadable: set[int],
) -> tuple[list[dict[str, Any]], str | None]:
    if codes.get("comm") != 0 or codes.get("ps") != 0:
        bad = "comm" if codes.get("comm") != 0 else "ps"
        detail = " ".join(sections.get(bad, [])[-1:]) or f"exit {codes.get(bad)}"
        return [], f"`ps -eo ...` failed: {detail}"
    comms: dict[int, str] = {}
    for line in sections.get("comm", []):
        pid_text, _, comm = line.strip().partition(" ")
        if pid_text.isdigit():
            comms[int(pid_text)] = comm.strip()
    out: list[dict[str, Any]] = []
    marker_read = "marker" in sections
    for line in sections.get("ps", []):
        fields = line.split(None, 8)
        if len(fields) < 8 or not fields[0].isdigit():
            continue
        try:
            pid, ppid, pgid, sid = (int(f) for f in fields[:4])
            etimes = int(fields[5])
            nlwp = int(fields[6])
            uid = int(fields[7])
        except ValueError:
            continue
        args = fields[8] if len(fields) > 8 else ""
        # Started between the two ps runs: its comm is not known, take argv[0]'s name.
        comm = comms.get(pid) or (args.split(" ", 1)[0].rsplit("/", 1)[-1][:15] or "?")
        state = fields[4][:1]
        if args in (f"[{comm}]", f"[{comm}] <defunct>") or state == "Z" or not args:
            cmdline: list[str] = []
        else:
            cmdline = args.split()
        out.append({
            "pid": pid, "ppid": ppid, "pgid": pgid, "sid": sid, "state": state, "comm": comm,
            "cmdline": cmdline, "create_time": float(now - etimes), "uid": uid,
            "run_marker": markers.get(pid),
            "environ_readable": marker_read and pid not in unreadable, "threads": nlwp,
        })
    if not out:
        return [], "`ps -eo ...` listed no process"
    return out, None


_FD_DIR = re.compile(r"^/proc/(\d+)/fd:$")


def _fds(
    lines: list[str] | None, code: int | None
) -> tuple[list[dict[str, Any]], dict[int, set[int]], str | None]:
    if lines is None or code is None or code not in (0, 1, 2) or not lines:
        return [], {}, f"`ls -l /proc/[0-9]*/fd` failed (exit {code})"
    devices: dict[int, set[str]] = {}
    owners: dict[int, set[int]] = {}
    pid: int | None = None
    for line in lines:
        match = _FD_DIR.match(line)
        if match:
            pid = int(match.group(1))
            continue
        if pid is None or " -> " not in line:
            continue
        target = line.rsplit(" -> ", 1)[1].strip()
        if target.startswith("/dev/nvidia"):
            devices.setdefault(pid, set()).add(target)
        elif target.startswith("socket:[") and target.endswith("]"):
            inode = target[8:-1]
            if inode.isdigit():
                owners.setdefault(int(inode), set()).add(pid)
    holders = [{"pid": p, "devices": sorted(d)} for p, d in sorted(devices.items())]
    return holders, owners, None


def _listening(
    lines: list[str] | None, code: int | None, ports: set[int]
) -> tuple[dict[int, tuple[int, str]], str | None]:
    if lines is None or not any(line.strip().startswith("sl") for line in lines):
        return {}, f"/proc/net/tcp is not readable (exit {code})"
    found: dict[int, tuple[int, str]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 10 or parts[3] != "0A" or ":" not in parts[1]:
            continue
        addr_hex, port_hex = parts[1].split(":")
        try:
            port = int(port_hex, 16)
            inode = int(parts[9])
        except ValueError:
            continue
        if port in ports:
            found[inode] = (port, _addr(addr_hex))
    return found, None


def _addr(hexaddr: str) -> str:
    if len(hexaddr) == 8:
        return ".".join(str(b) for b in reversed(bytes.fromhex(hexaddr)))
    words = [bytes.fromhex(hexaddr[i : i + 8])[::-1].hex() for i in range(0, 32, 8)]
    full = "".join(words)
    return ":".join(full[i : i + 4] for i in range(0, 32, 4))


_MARKER_LINE = re.compile(r"^/proc/(\d+)/environ:" + MARKER + r"=(.*)$")
_ENVIRON_ERROR = re.compile(r"/proc/(\d+)/environ: (.*)$")


def _markers(lines: list[str]) -> tuple[dict[int, str], set[int], str | None]:
    """Markers by PID, the PIDs whose environment could not be read, and an error when ``grep``
    itself could not run. Like the collector, an unreadable environment is not a failed source:
    the process is marked ``environ_readable=False``."""
    markers: dict[int, str] = {}
    unreadable: set[int] = set()
    for line in lines:
        match = _MARKER_LINE.match(line)
        if match:
            markers[int(match.group(1))] = match.group(2)
            continue
        error = _ENVIRON_ERROR.search(line)
        if error:
            unreadable.add(int(error.group(1)))
        elif "not found" in line or "No such file or directory" in line:
            return markers, unreadable, f"`grep {MARKER}= /proc/*/environ` could not run: {line}"
    return markers, unreadable, None


def _shm(lines: list[str] | None, code: int | None) -> tuple[list[dict[str, Any]], str | None]:
    if lines is None or code != 0:
        return [], f"`ls -ln --time-style=+%s /dev/shm` failed (exit {code})"
    out: list[dict[str, Any]] = []
    for line in lines:
        parts = line.split(None, 6)
        if len(parts) < 7 or not parts[4].isdigit():
            continue  # "total N", or an ls that does not know --time-style
        name = parts[6]
        for pattern in SHM_PATTERNS:
            if fnmatch.fnmatchcase(name, pattern):
                try:
                    mtime = float(parts[5])
                except ValueError:
                    mtime = 0.0
                out.append({"name": name, "size_bytes": int(parts[4]), "mtime": mtime,
                            "pattern": pattern})
                break
    return sorted(out, key=lambda e: str(e["name"])), None
