"""The probe of a host without ``python3``: one POSIX shell script, its output parsed here.

The collector (``probe/_collect_script.py``) needs a Python on the host. Where there is none
(a minimal image, a restricted account), :func:`run_fallback` sends :func:`fallback_script` to
``sh -s`` on stdin and builds the same raw snapshot dict from standard tools:

===============  ==========================================================  ===============
source           command                                                     when it fails
===============  ==========================================================  ===============
processes        ``ps -eo pid=,comm=`` and                                   critical
                 ``ps -ww -eo pid=,ppid=,pgid=,sid=,stat=,etimes=,nlwp=,
                 uid=,args=`` (procps)
device_files     ``ls -ln -b /proc/[0-9]*/fd`` (``/dev/nvidia*`` and         critical
                 targets, socket owners)
ports            ``cat /proc/net/tcp /proc/net/tcp6``                        critical
run_markers      ``grep -a -z -H '^CLEANSLATE_RUN=' /proc/[0-9]*/environ``   critical
shm              ``ls -lns -b --block-size=1 --time-style=+%s /dev/shm``       warning
                 (GNU ls)
shm_space        ``stat -f -c '%S %b %a %c %d' /dev/shm``                    critical
kmsg             not read by the fallback                                    warning
===============  ==========================================================  ===============

**The output cannot be forged by what it reports.** Any local user chooses file names in
``/dev/shm``, the targets of their open files, their process names, argv and environment, and
all of these end up in the script's output. So:

- every section is framed by ``@@TOKEN begin NAME`` and ``@@TOKEN end NAME RC`` lines, where
  ``TOKEN`` is random per call and travels only on the script's stdin (never in an argv that
  ``ps`` shows); nothing a process on the host controls can contain it;
- the sections must come exactly once each, in the script's order, with nothing between them; a
  section that is missing, duplicated, out of order or unterminated fails its source, and stray
  text outside the sections fails every source (the critical ones make the verdict UNKNOWN);
- names are escaped where the tool allows it (``ls -b``: a newline in a file name reads ``\\n``;
  ``ps`` prints control characters as ``?`` or a space) and unescaped here;
- the run markers are grep's raw NUL-terminated records (``/proc/N/environ:CLEANSLATE_RUN=...``),
  split on NUL bytes, so a marker value containing newlines stays one value of one process;
- every line of a section must parse; an unparsable line fails the source instead of being
  skipped, and a PID listed twice fails it too.

What it cannot tell as well as the collector, and says so: ``create_time`` comes from
``etimes`` (whole seconds); ``cmdline`` is ``ps``'s space-joined ``args`` split on spaces (enough
for the engine signatures, which match the space-joined command line); ``environ_readable`` is
``False`` for the processes whose environment ``grep`` could not read, as in the collector; the
kernel log is not read.
"""

from __future__ import annotations

import fnmatch
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from cleanslate._types import RUN_MARKER_ENV
from cleanslate.engines import shm_patterns as registered_shm_patterns
from cleanslate.hosts.base import CommandResult, Executor
from cleanslate.hosts.scripts import no_python

#: The sections of the script's output, in order.
SECTIONS = ("self", "now", "uid", "btime", "comm", "ps", "tcp", "fd", "fderr", "marker", "shm",
            "shmfs", "gpudev")

#: The script run on the host (``sh -s``, this text on stdin), with ``{token}`` and ``{shm_dir}``
#: to fill. Its body is one function, so the shell has read all of it before any command runs
#: (no command can read the rest of the script from stdin; each also gets ``</dev/null``).
_SCRIPT = r"""
T='{token}'
b() {{ printf '@@%s begin %s\n' "$T" "$1"; }}
e() {{ printf '\n@@%s end %s %s\n' "$T" "$1" "$2"; }}
probe() {{
b self; echo "$$"; e self 0
b now; date +%s; e now $?
b uid; id -u; e uid $?
b btime; grep '^btime ' /proc/stat 2>&1; e btime $?
b comm; ps -eo pid=,comm= 2>&1; e comm $?
b ps; ps -ww -eo pid=,ppid=,pgid=,sid=,stat=,etimes=,nlwp=,uid=,args= 2>&1; e ps $?
b tcp; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; e tcp $?
b fd; err=$(LC_ALL=C ls -ln -b /proc/[0-9]*/fd 2>&1 >&3); rc=$?; e fd $rc
b fderr; printf '%s' "$err"; e fderr 0
b marker; grep -a -z -H --line-buffered '^CLEANSLATE_RUN=' /proc/[0-9]*/environ 2>&1; e marker $?
b shm; LC_ALL=C ls -lns -b --block-size=1 --time-style=+%s {shm_dir} 2>&1; e shm $?
b shmfs; LC_ALL=C stat -f -c '%S %b %a %c %d' {shm_dir} 2>&1; e shmfs $?
b gpudev; ls -d /dev/nvidia[0-9]* 2>/dev/null; e gpudev $?
printf '@@%s done\n' "$T"
}}
probe </dev/null 3>&1
"""

MARKER = RUN_MARKER_ENV
_NOT_READ = "not read: the host has no python3, and the fallback probe (ps, ls, cat) "


def fallback_script(token: str, shm_dir: str = "/dev/shm") -> str:
    """The shell script for one call; ``token`` frames its sections (hex, from
    :func:`new_token`)."""
    if not re.fullmatch(r"[0-9a-f]{16,64}", token):
        raise ValueError("the section token must be 16-64 hex digits")
    return _SCRIPT.format(token=token, shm_dir=_sh_quote(shm_dir))


def new_token() -> str:
    """A fresh random section token (128 bits)."""
    return secrets.token_hex(16)


def needs_fallback(result: CommandResult) -> bool:
    """Whether the collector failed because the host has no python3 (not a probe that timed out
    or a host that cannot be reached): the fallback's reason to run."""
    return no_python(result)


async def run_fallback(
    executor: Executor, *, ports: list[int], timeout: float, shm_dir: str | None = None,
    listeners: bool = False, shm_patterns: Sequence[str] | None = None,
) -> tuple[dict[str, Any] | None, CommandResult]:
    """Run the script on the host and parse it (``None`` when the script failed or its output
    did not end as the script ends). ``listeners``: also list every listening socket (any port)
    as ``listeners``, as the collector does for baselines; ``shm_patterns``: as for
    :func:`parse_fallback`."""
    token = new_token()
    script = fallback_script(token, shm_dir or "/dev/shm")
    result = await executor.run(["sh", "-s"], timeout=timeout, stdin=script.encode())
    if result.timed_out or result.returncode is None:
        return None, result
    if not result.stdout.endswith(f"@@{token} done\n".encode()):
        return None, result
    return parse_fallback(result.stdout, token=token, ports=set(ports), listeners=listeners,
                          shm_patterns=shm_patterns, shm_dir=shm_dir or "/dev/shm"), result


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


@dataclass
class _Section:
    """One framed section: its raw bytes (without the framing) and its command's exit status.
    ``error`` says why the section cannot be trusted (``None``: it can)."""

    body: bytes = b""
    rc: int | None = None
    error: str | None = None

    def lines(self) -> list[str]:
        """The body as newline-terminated lines (a last line without its newline counts)."""
        text = self.body.decode("utf-8", "replace")
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        return lines


def split_sections(raw: bytes, token: str) -> tuple[dict[str, _Section], str | None]:
    """Cut the output into its sections; returns them by name and an error that concerns the
    whole output (text outside any section, no ``done`` line), or ``None``.

    A section is trusted only when it appears once, after the sections before it in
    :data:`SECTIONS`, framed by its own begin and end lines; otherwise its ``error`` says why.
    A section that never appears is absent from the result.
    """
    frame = re.compile(rb"@@" + re.escape(token.encode()) + rb" (begin|end|done)([^\n]*)\n")
    sections: dict[str, _Section] = {}
    whole: str | None = None
    pos = 0
    open_name: str | None = None
    open_at = 0
    last_index = -1
    done = False
    for match in frame.finditer(raw):
        kind = match.group(1).decode()
        rest = match.group(2).decode("utf-8", "replace")
        between = raw[pos:match.start()]
        if open_name is None and between.strip(b"\n"):
            whole = whole or "text outside the framed sections"
        if done:
            whole = "framing after the end of the output"
            break
        if kind == "begin":
            name = rest.strip()
            if open_name is not None:
                sections[open_name].error = f"section {open_name!r} is not terminated"
            open_name = name
            open_at = match.end()
            if name in sections:
                sections[name].error = f"section {name!r} appears more than once"
                continue
            sections[name] = _Section()
            if name not in SECTIONS:
                sections[name].error = f"unexpected section {name!r}"
            elif SECTIONS.index(name) < last_index:
                sections[name].error = f"section {name!r} is out of order"
            else:
                last_index = SECTIONS.index(name)
        elif kind == "end":
            words = rest.split()
            if open_name is None or not words or words[0] != open_name:
                whole = whole or f"an end line without its begin line ({rest.strip()!r})"
                pos = match.end()
                open_name = None
                continue
            section = sections[open_name]
            body = raw[open_at:match.start()]
            if not body.endswith(b"\n"):
                section.error = section.error or f"section {open_name!r} is malformed"
            section.body = body[:-1]
            if len(words) != 2 or not words[1].lstrip("-").isdigit():
                section.error = section.error or f"section {open_name!r} has no exit status"
            else:
                section.rc = int(words[1])
            open_name = None
        else:
            if open_name is not None:
                sections[open_name].error = f"section {open_name!r} is not terminated"
                open_name = None
            done = True
        pos = match.end()
    if open_name is not None:
        sections[open_name].error = f"section {open_name!r} is not terminated"
    if raw[pos:].strip(b"\n"):
        whole = whole or "text after the last framed section"
    if not done:
        whole = whole or "the output does not end with the script's last line"
    return sections, whole


class _RawSource(TypedDict):
    name: str
    ok: bool
    critical: bool
    error: str | None
    elapsed_s: float


class _RawProcess(TypedDict):
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    comm: str
    cmdline: list[str]
    create_time: float
    uid: int
    run_marker: str | None
    environ_readable: bool
    threads: int


class _RawHolder(TypedDict):
    pid: int
    devices: list[str]


class _RawSocket(TypedDict):
    port: int
    address: str
    inode: int
    pids: list[int]


class _RawShm(TypedDict):
    name: str
    size_bytes: int
    mtime: float
    pattern: str
    uid: int
    allocated_bytes: int
    held_by: list[int]


def _source(name: str, critical: bool, error: str | None = None) -> _RawSource:
    return {"name": name, "ok": error is None, "critical": critical, "error": error,
            "elapsed_s": 0.0}


def _problem(section: _Section | None, name: str, whole: str | None) -> str | None:
    """Why a section cannot be used at all (framing only; its exit status is judged by its
    parser)."""
    if whole is not None:
        return f"the fallback probe's output is malformed: {whole}"
    if section is None:
        return f"the fallback probe's output has no {name!r} section"
    if section.error is not None:
        return f"the fallback probe's output is malformed: {section.error}"
    return None


def parse_fallback(
    raw: bytes, *, token: str, ports: set[int], listeners: bool = False,
    shm_patterns: Sequence[str] | None = None, shm_dir: str = "/dev/shm",
) -> dict[str, Any]:
    """Turn the script's output into the collector's raw snapshot dict (see the module doc).
    ``shm_patterns``: the ``/dev/shm`` names to report (``None``: the registered engines',
    :func:`cleanslate.engines.shm_patterns`).

    Never raises for bad output: a section that cannot be trusted or parsed fails its source,
    with the reason in the source's ``error``.
    """
    sections, whole = split_sections(raw, token)
    sources: list[_RawSource] = []
    out: dict[str, Any] = {"sources": sources, "ports_in_scope": sorted(ports)}

    def usable(name: str) -> tuple[_Section | None, str | None]:
        section = sections.get(name)
        problem = _problem(section, name, whole)
        return (None, problem) if problem else (section, None)

    self_section, _ = usable("self")
    self_text = self_section.body.decode(errors="replace").strip() if self_section else ""
    out["collector_pid"] = int(self_text) if self_text.isdigit() else None
    now_section, now_problem = usable("now")
    now_text = now_section.body.decode(errors="replace").strip() if now_section else ""
    now = float(now_text) if now_text.isdigit() and now_section and now_section.rc == 0 else None
    if now is None and now_problem is None:
        now_problem = f"`date +%s` gave {now_text[:80]!r}"
    out["taken_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now or time.time()))
    btime, _ = usable("btime")
    for line in btime.lines() if btime else []:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "btime" and parts[1].isdigit():
            out["boot_time"] = float(parts[1])

    marker_section, marker_problem = usable("marker")
    markers: dict[int, str] = {}
    unreadable: set[int] = set()
    marker_error = marker_problem
    if marker_section is not None:
        markers, unreadable, marker_error = parse_markers(marker_section.body, marker_section.rc)

    comm_section, comm_problem = usable("comm")
    ps_section, ps_problem = usable("ps")
    problem = comm_problem or ps_problem or now_problem
    if problem is None and comm_section is not None and ps_section is not None and now:
        processes, error = _processes(comm_section, ps_section, now, markers, unreadable,
                                      marker_error is None)
    else:
        processes, error = [], problem
    out["processes"] = processes
    sources.append(_source("processes", True, error))

    fd_section, fd_problem = usable("fd")
    fderr_section, fderr_problem = usable("fderr")
    holders: list[_RawHolder] = []
    sockets_by_inode: dict[int, set[int]] = {}
    fd_unreadable: set[int] = set()
    shm_open: dict[str, set[int]] = {}
    fd_error = fd_problem or fderr_problem
    if fd_error is None and fd_section is not None and fderr_section is not None:
        holders, sockets_by_inode, fd_unreadable, fd_error = _fds(
            fd_section, fderr_section, shm_dir.rstrip("/") + "/", shm_open)
    out["device_holders"] = holders
    out["fd_unreadable"] = sorted(fd_unreadable)
    sources.append(_source("device_files", True, fd_error))

    tcp_section, tcp_problem = usable("tcp")
    listening: dict[int, tuple[int, str]] = {}
    tcp_error = tcp_problem
    if tcp_section is not None:
        listening, tcp_error = _listening(tcp_section)

    def socket_dicts(wanted: Iterable[int] | None) -> list[_RawSocket]:
        return [
            {"port": port, "address": addr, "inode": inode,
             "pids": sorted(sockets_by_inode.get(inode, ()))}
            for inode, (port, addr) in sorted(listening.items())
            if wanted is None or port in wanted
        ]

    out["sockets"] = socket_dicts(ports)
    if listeners:
        out["listeners"] = socket_dicts(None)
    sources.append(_source("ports", True, tcp_error if ports or listeners else None))

    sources.append(_source("run_markers", True, marker_error))
    shm_section, shm_problem = usable("shm")
    shm: list[_RawShm] = []
    shm_error = shm_problem
    listing: list[_LsEntry] = []
    if shm_section is not None:
        patterns = registered_shm_patterns() if shm_patterns is None else tuple(shm_patterns)
        listing, shm_error = _ls_entries(shm_section)
        shm = _shm(listing, patterns, shm_open)
    shmfs_section, shmfs_problem = usable("shmfs")
    space: dict[str, int] | None = None
    if shmfs_section is not None:
        space, shmfs_problem = _shm_space(shmfs_section)
        out["shm_space"] = space
    if space is not None and shm_error is None and _half_full(space):
        out["shm_usage"] = _shm_usage(listing, shm_open)
    out["shm"] = shm
    sources.append(_source("shm_space", True, shmfs_problem))
    sources.append(_source("shm", False, shm_error))
    sources.append(_source("kmsg", False, _NOT_READ + "does not read the kernel log"))
    gpudev, _ = usable("gpudev")
    out["gpu_devices"] = _gpu_devices(gpudev) if gpudev is not None else None
    return out


_GPU_DEVICE = re.compile(r"^/dev/nvidia\d+$")


def _gpu_devices(section: _Section) -> list[str] | None:
    """``/dev/nvidia<N>`` nodes from ``ls -d /dev/nvidia[0-9]*`` (which fails, printing nothing,
    when there are none); ``None`` when the output is not that."""
    lines = section.lines()
    if section.rc != 0:
        return [] if not lines else None
    if not lines or not all(_GPU_DEVICE.match(line) for line in lines):
        return None
    return sorted(lines)


_COMM_LINE = re.compile(r"^\s*(\d+) (.*)$")


def _processes(
    comm_section: _Section, ps_section: _Section, now: float, markers: dict[int, str],
    unreadable: set[int], markers_read: bool,
) -> tuple[list[_RawProcess], str | None]:
    for name, section in (("ps -eo pid=,comm=", comm_section), ("ps -ww -eo ...", ps_section)):
        if section.rc != 0:
            detail = " ".join(section.lines()[-1:]) or f"exit {section.rc}"
            return [], f"`{name}` failed: {detail[:200]}"
    comms: dict[int, str] = {}
    for line in comm_section.lines():
        match = _COMM_LINE.match(line)
        if match is None:
            return [], f"`ps -eo pid=,comm=` printed an unexpected line: {line[:120]!r}"
        pid = int(match.group(1))
        if pid in comms:
            return [], f"`ps -eo pid=,comm=` listed PID {pid} twice"
        comms[pid] = match.group(2).strip()
    out: list[_RawProcess] = []
    seen: set[int] = set()
    for line in ps_section.lines():
        fields = line.split(None, 8)
        try:
            if len(fields) < 8:
                raise ValueError
            pid, ppid, pgid, sid = (int(f) for f in fields[:4])
            etimes = int(fields[5])
            nlwp = int(fields[6])
            uid = int(fields[7])
        except ValueError:
            return [], f"`ps -ww -eo ...` printed an unexpected line: {line[:120]!r}"
        if pid in seen:
            return [], f"`ps -ww -eo ...` listed PID {pid} twice"
        seen.add(pid)
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
            "environ_readable": markers_read and pid not in unreadable, "threads": nlwp,
        })
    if not out:
        return [], "`ps -eo ...` listed no process"
    return out, None


_FD_DIR = re.compile(r"^/proc/(\d+)/fd:$")
# ``ls -ln`` of a symbolic link, the target readable or not: mode, links, owner, group, size,
# date (three words in the default style) and the name, then `` -> target`` when readable.
_FD_ENTRY = re.compile(r"^l\S{9,10}\s+\d+\s+\S+\s+\S+\s+\d+\s+\S+\s+\S+\s+\S+\s+(\d+)"
                       r"(?: -> (.*))?$")
# An entry ls could not lstat (its fd closed or its process exited between the directory read
# and the lstat; ls says why on stderr): every field but the name is a ``?``.
_FD_UNSTATED = re.compile(r"^l\?{9,10}(?:\s+\?){5}\s+(\d+)$")


_LS_ERROR = re.compile(r"^ls: cannot [a-z ]+ [`'\"]?/proc/(\d+)/fd(?:/\d+)?[`'\"]?: (.+)$")


def _fds(
    section: _Section, errors: _Section, shm_prefix: str = "/dev/shm/",
    shm_open: dict[str, set[int]] | None = None,
) -> tuple[list[_RawHolder], dict[int, set[int]], set[int], str | None]:
    """Device holders, socket owners and the PIDs whose open files could not be read, from
    ``ls -ln -b /proc/[0-9]*/fd`` (``section``) and its stderr (``errors``). ls exits 1 or 2
    when some directory vanished or could not be read (other users' processes): not a
    failure, but the unreadable ones are reported. ``shm_open`` (when given) gets, per file
    name under ``shm_prefix``, the PIDs holding it open."""
    lines = section.lines()
    if section.rc not in (0, 1, 2) or not lines:
        detail = " ".join(errors.lines()[-1:])
        return [], {}, set(), f"`ls -l /proc/[0-9]*/fd` failed (exit {section.rc}) {detail[:200]}"
    devices: dict[int, set[str]] = {}
    owners: dict[int, set[int]] = {}
    unreadable: set[int] = set()
    unstated: set[int] = set()
    pid: int | None = None
    for line in lines:
        match = _FD_DIR.match(line)
        if match:
            pid = int(match.group(1))
            continue
        if not line or line.startswith("total "):
            continue
        if pid is not None and _FD_UNSTATED.match(line):
            unstated.add(pid)  # stderr says why: gone (skipped) or not readable
            continue
        entry = _FD_ENTRY.match(line)
        if entry is None or pid is None:
            return [], {}, set(), (
                f"`ls -l /proc/[0-9]*/fd` printed an unexpected line: {line[:120]!r}")
        if entry.group(2) is None:
            unreadable.add(pid)  # the link could not be read
            continue
        target = unescape_ls(entry.group(2))
        if target.startswith("/dev/nvidia"):
            devices.setdefault(pid, set()).add(target)
        elif shm_open is not None and target.startswith(shm_prefix):
            shm_open.setdefault(target[len(shm_prefix):], set()).add(pid)
        elif target.startswith("socket:[") and target.endswith("]"):
            inode = target[8:-1]
            if inode.isdigit():
                owners.setdefault(int(inode), set()).add(pid)
    explained: set[int] = set()
    for line in errors.lines():
        error = _LS_ERROR.match(line)
        if error is None:
            return [], {}, set(), (
                f"`ls -l /proc/[0-9]*/fd` printed an unexpected error: {line[:120]!r}")
        explained.add(int(error.group(1)))
        if not error.group(2).startswith("No such file"):  # exited since the glob
            unreadable.add(int(error.group(1)))
    unreadable |= unstated - explained  # an unreadable entry ls gave no reason for
    holders: list[_RawHolder] = [{"pid": p, "devices": sorted(d)}
                                 for p, d in sorted(devices.items())]
    return holders, owners, unreadable, None


_TCP_HEADER = re.compile(r"^\s*sl\s+local_address\s")


def _listening(section: _Section) -> tuple[dict[int, tuple[int, str]], str | None]:
    """Every LISTEN socket in ``/proc/net/tcp`` and ``tcp6``: {inode: (port, address)}. ``cat``
    exits 1 when ``tcp6`` is absent (IPv6 disabled); the IPv4 table must be there."""
    lines = section.lines()
    if not lines or not _TCP_HEADER.match(lines[0]):
        return {}, f"/proc/net/tcp is not readable (exit {section.rc})"
    found: dict[int, tuple[int, str]] = {}
    for line in lines:
        if _TCP_HEADER.match(line) or not line:
            continue
        parts = line.split()
        try:
            if len(parts) < 10 or ":" not in parts[1]:
                raise ValueError
            addr_hex, port_hex = parts[1].split(":")
            port = int(port_hex, 16)
            inode = int(parts[9])
            if parts[3] == "0A":  # TCP_LISTEN
                found[inode] = (port, _addr(addr_hex))
        except ValueError:
            return {}, f"/proc/net/tcp has an unexpected line: {line[:120]!r}"
    return found, None


def _addr(hexaddr: str) -> str:
    if len(hexaddr) == 8:
        return ".".join(str(b) for b in reversed(bytes.fromhex(hexaddr)))
    if len(hexaddr) != 32:
        raise ValueError(hexaddr)
    words = [bytes.fromhex(hexaddr[i : i + 8])[::-1].hex() for i in range(0, 32, 8)]
    full = "".join(words)
    return ":".join(full[i : i + 4] for i in range(0, 32, 4))


_MARKER_PREFIX = re.compile(rb"/proc/(\d+)/environ:" + MARKER.encode() + rb"=")
_GREP_ERROR = re.compile(rb"grep: /proc/(\d+)/environ: ([^\n]*)\n")


def parse_markers(body: bytes, rc: int | None) -> tuple[dict[int, str], set[int], str | None]:
    """Markers by PID from grep's raw output, the PIDs whose environment could not be read, and
    an error when the output cannot be trusted or grep could not run.

    The output is a sequence of NUL-terminated records ``/proc/N/environ:CLEANSLATE_RUN=value``
    (the value may hold any byte but NUL, newlines included) and grep's newline-terminated error
    lines ``grep: /proc/N/environ: reason``; anything else fails the source. grep exits 0 (some
    match), 1 (none) or 2 (some file unreadable: other users' processes, or exited ones).
    """
    markers: dict[int, str] = {}
    unreadable: set[int] = set()
    if rc not in (0, 1, 2):
        first = body.split(b"\n", 1)[0].decode("utf-8", "replace")
        return {}, set(), f"`grep {MARKER}= /proc/*/environ` failed (exit {rc}): {first[:200]}"
    pos = 0
    while pos < len(body):
        error = _GREP_ERROR.match(body, pos)
        if error is not None:
            # "No such file": exited since the glob. "No such process" (a kernel thread or a
            # zombie: no memory to read) is unreadable, as in the collector.
            if not error.group(2).startswith(b"No such file"):
                unreadable.add(int(error.group(1)))
            pos = error.end()
            continue
        record = _MARKER_PREFIX.match(body, pos)
        end = body.find(b"\0", pos)
        if record is None or end < 0:
            text = body[pos:pos + 120].decode("utf-8", "replace")
            return {}, set(), f"`grep {MARKER}= /proc/*/environ` printed {text!r}"
        pid = int(record.group(1))
        if pid in markers:
            return {}, set(), f"`grep {MARKER}= /proc/*/environ` listed PID {pid} twice"
        markers[pid] = body[record.end():end].decode("utf-8", "replace")
        pos = end + 1
    return markers, unreadable, None


_LS_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def unescape_ls(text: str) -> str:
    """Undo ``ls -b`` quoting (GNU ``escape`` style, ``LC_ALL=C``): ``\\n``, ``\\ `` and
    ``\\ooo`` (octal bytes, then decoded as UTF-8)."""
    if "\\" not in text:
        return text
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out += char.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = text[i + 1]
        octal = text[i + 1 : i + 4]
        if len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(int(octal, 8) & 0xFF)
            i += 4
            continue
        out += _LS_ESCAPES.get(nxt, nxt).encode("utf-8", "surrogateescape")
        i += 2
    return out.decode("utf-8", "replace")


@dataclass(frozen=True)
class _LsEntry:
    """One line of ``ls -lns --block-size=1``."""

    name: str
    kind: str
    blocks_bytes: int
    uid: int
    size_bytes: int
    mtime: float


def _ls_entries(section: _Section) -> tuple[list[_LsEntry], str | None]:
    """``ls -lns --block-size=1``: blocks (bytes held), mode, links, uid, gid, size, mtime,
    name; every line must parse."""
    lines = section.lines()
    if section.rc != 0:
        detail = " ".join(lines[-1:]) or "no output"
        return [], f"`ls -lns --time-style=+%s /dev/shm` failed (exit {section.rc}): " \
            f"{detail[:200]}"
    out: list[_LsEntry] = []
    for line in lines:
        if not line or line.startswith("total "):
            continue
        parts = line.split(None, 7)
        if len(parts) < 8 or not all(parts[i].isdigit() for i in (0, 3, 5)) \
                or not parts[6].lstrip("-").isdigit():
            return [], f"`ls -lns /dev/shm` printed an unexpected line: {line[:120]!r}"
        name = parts[7]
        if parts[1].startswith("l") and " -> " in name:
            name = name.split(" -> ", 1)[0]
        out.append(_LsEntry(name=unescape_ls(name), kind=parts[1][:1],
                            blocks_bytes=int(parts[0]), uid=int(parts[3]),
                            size_bytes=int(parts[5]), mtime=float(parts[6])))
    return out, None


def _shm(listing: list[_LsEntry], patterns: Sequence[str],
         held: dict[str, set[int]] | None = None) -> list[_RawShm]:
    """The entries whose name matches one of ``patterns``; ``held``: the PIDs holding each name
    open (from the open-file section)."""
    held = held or {}
    out: list[_RawShm] = []
    for entry in listing:
        for pattern in patterns:
            if fnmatch.fnmatchcase(entry.name, pattern):
                out.append({"name": entry.name, "size_bytes": entry.size_bytes,
                            "mtime": entry.mtime, "pattern": pattern, "uid": entry.uid,
                            "allocated_bytes": entry.blocks_bytes,
                            "held_by": sorted(held.get(entry.name, ()))})
                break
    return sorted(out, key=lambda e: e["name"])


#: The largest files of ``/dev/shm`` reported, as the collector does.
SHM_LARGEST = 10


def _half_full(space: dict[str, int]) -> bool:
    """At least half full, by bytes or by inodes: when the collector reads what fills it."""
    total, inodes = space["total_bytes"], space["inodes_total"]
    return (total > 0 and space["free_bytes"] * 2 <= total) or \
        (inodes > 0 and space["inodes_free"] * 2 <= inodes)


def _shm_usage(listing: list[_LsEntry], held: dict[str, set[int]]) -> dict[str, Any]:
    """The :data:`SHM_LARGEST` entries of the listing that hold the most memory, with the PIDs
    that hold them open. The fallback lists the folder itself only (a folder's contents and
    files removed while open are not seen: ``complete`` is false when it has a folder) and
    reads no mappings (``maps_read`` false); owners are uids only."""
    files = [e for e in listing if e.kind != "d"]
    largest = sorted(files, key=lambda e: (-e.blocks_bytes, e.name))[:SHM_LARGEST]
    return {
        "largest": [{"path": e.name, "size_bytes": e.size_bytes,
                     "allocated_bytes": e.blocks_bytes, "uid": e.uid, "user": None,
                     "deleted": False, "held_by": sorted(held.get(e.name, ())),
                     "mapped_by": []} for e in largest],
        "files_scanned": len(files), "listed_bytes": sum(e.blocks_bytes for e in files),
        "complete": len(files) == len(listing), "maps_read": False, "maps_unreadable": 0,
        "elapsed_s": 0.0,
    }


def _shm_space(section: _Section) -> tuple[dict[str, int] | None, str | None]:
    """``stat -f -c '%S %b %a %c %d'``: block size, blocks, blocks free for unprivileged
    writers, inodes, free inodes."""
    lines = [line for line in section.lines() if line]
    parts = lines[0].split() if len(lines) == 1 else []
    if section.rc != 0 or len(parts) != 5 or not all(p.isdigit() for p in parts):
        detail = " ".join(lines[-1:])[:200] or "no output"
        return None, f"`stat -f /dev/shm` failed (exit {section.rc}): {detail}"
    size, blocks, free, inodes, inodes_free = (int(p) for p in parts)
    return {"total_bytes": size * blocks, "free_bytes": size * free,
            "inodes_total": inodes, "inodes_free": inodes_free}, None
