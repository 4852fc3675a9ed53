"""The no-python3 probe (:mod:`cleanslate.probe.fallback`): against the collector on this host,
against hostile names a local user can choose, and against crafted outputs.

Both probes read the same processes at nearly the same moment: for processes the test started,
every field the fallback claims to read must agree with the collector's reading. A user who
names a ``/dev/shm`` file, a process, an argv or an environment value after the script's framing
must not change what the fallback reports about anyone else.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cleanslate.hosts.base import CommandResult
from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.collect import run_collector
from cleanslate.probe.fallback import (
    SECTIONS,
    fallback_script,
    needs_fallback,
    new_token,
    parse_fallback,
    run_fallback,
    unescape_ls,
)
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import GpuReading, ProcessInfo, Snapshot
from cleanslate.verdict.findings import FindingKind, Verdict
from cleanslate.verdict.rules import Scope, evaluate
from tests.conftest import Processes

TOKEN = "0123456789abcdef0123456789abcdef"


def _result(code: int | None, stderr: bytes = b"", timed_out: bool = False) -> CommandResult:
    return CommandResult(("python3",), code, b"", stderr, 0.1, timed_out=timed_out)


def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def _no_python(tmp_path: Path) -> LocalExecutor:
    """A local executor whose ``python`` answers like a host without python3."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 'sh: 1: python3: not found' >&2\nexit 127\n")
    fake.chmod(0o755)
    return LocalExecutor(python=str(fake))


def test_needs_fallback_only_for_a_missing_python() -> None:
    assert needs_fallback(_result(127, b"timeout: failed to run command 'python3': No such"))
    assert needs_fallback(_result(1, b"sh: 1: python3: not found"))
    assert not needs_fallback(_result(None, timed_out=True))
    assert not needs_fallback(_result(None))  # host unreachable
    assert not needs_fallback(_result(1, b"Traceback ... ValueError"))
    assert not needs_fallback(_result(0))


def test_fallback_agrees_with_the_collector(procs: Processes, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = tmp_path / "ready"
    code = ("import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
            "open(sys.argv[2], 'w').close(); time.sleep(60)\n")
    owner = procs.start([sys.executable, "-c", code, str(port), str(ready), "two  spaces"],
                        env={"CLEANSLATE_RUN": "r-fallback", "PATH": "/usr/bin:/bin"})
    _wait_for(ready)

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        ex = LocalExecutor()
        (data, result), (fb, fb_result) = await asyncio.gather(
            run_collector(ex, ports=[port], timeout=10, listeners=True),
            run_fallback(ex, ports=[port], timeout=10, listeners=True))
        assert data is not None, result.describe_failure()
        assert fb is not None, fb_result.describe_failure()
        return data, fb

    collected, fallback = asyncio.run(both())
    by_c = {p["pid"]: ProcessInfo.model_validate(p) for p in collected["processes"]}
    by_f = {p["pid"]: ProcessInfo.model_validate(p) for p in fallback["processes"]}
    c, f = by_c[owner.pid], by_f[owner.pid]
    for name in ("ppid", "pgid", "sid", "state", "comm", "uid", "run_marker", "threads",
                 "environ_readable"):
        assert getattr(c, name) == getattr(f, name), name
    assert f.run_marker == "r-fallback" and f.environ_readable
    assert " ".join(c.cmdline).split() == list(f.cmdline)
    assert abs(c.create_time - f.create_time) < 1.5
    problems = {s["name"]: s.get("error") for s in fallback["sources"]
                if s["critical"] and not s["ok"]}
    assert not problems, problems
    assert [(s["port"], s["pids"]) for s in fallback["sockets"]] == [(port, [owner.pid])]
    assert collected["sockets"][0]["address"] == fallback["sockets"][0]["address"]
    # Every listener, on any port, the same way (others may open or close theirs meanwhile).
    ours = [(s["port"], s["address"], s["pids"]) for s in fallback["listeners"]
            if s["port"] == port]
    assert ours == [(s["port"], s["address"], s["pids"]) for s in collected["listeners"]
                    if s["port"] == port]
    sources = {s["name"]: s for s in fallback["sources"]}
    assert all(sources[n]["ok"] for n in ("processes", "device_files", "ports", "run_markers"))
    assert sources["run_markers"]["critical"] is True
    assert sources["kmsg"]["ok"] is False and sources["kmsg"]["critical"] is False
    # Processes alive throughout appear in both (short-lived ones may come and go).
    assert set(by_f) & set(by_c) >= {owner.pid, 1}


# --- hostile names, live ------------------------------------------------------------------------

#: What the old, ``@@``-line format would have taken for a new process list with only PID 1.
OLD_FORMAT_FORGERY = "\n@@ps\n    1     0     1     1 Ss  100    1     0 init\n@@rc 0\n@@end"


def _marked_stray(procs: Processes, tmp_path: Path, marker: str, **env: str) -> int:
    ready = tmp_path / f"ready-{uuid.uuid4().hex}"
    code = ("import ctypes, os, sys, time\n"
            "name = os.environ.get('RENAME_TO')\n"
            "if name: ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)\n"
            "open(sys.argv[1], 'w').close(); time.sleep(60)\n")
    proc = procs.python(code, str(ready), *env.pop("ARGV", "").split("\0"),
                        env={**os.environ, "CLEANSLATE_RUN": marker, **env})
    _wait_for(ready)
    return proc.pid


def _scope(marker: str) -> Scope:
    # Only our marker counts: other software on this machine cannot change the verdict.
    return Scope(engines=(), markers=frozenset({marker}), exclude_roots=frozenset({os.getpid()}))


def test_hostile_shm_name_does_not_hide_a_stray(procs: Processes, tmp_path: Path) -> None:
    """The issue's reproduction: a file name in /dev/shm (any local user can make one) that
    carries the old framing replaced the process list and turned DIRTY into CLEAN."""
    marker = f"r-shm-{uuid.uuid4().hex[:8]}"
    pid = _marked_stray(procs, tmp_path, marker)
    shm = tmp_path / "shm"
    shm.mkdir()
    guessed = f"@@{new_token()} begin ps"  # a frame with a guessed token is just text
    hostile = [f"nccl-x{OLD_FORMAT_FORGERY}", f"nccl-y\n{guessed}\n1 0 1 1 S 1 1 0 init",
               "nccl-z with spaces\tand\\backslash"]
    for name in hostile:
        (shm / name).write_bytes(b"\0" * 16)

    snapshot = asyncio.run(probe_host(_no_python(tmp_path), NoGpuBackend(), timeout=15,
                                      shm_dir=str(shm)))
    sources = {s.name: s for s in snapshot.sources}
    assert sources["collector"].ok if "collector" in sources else True
    assert all(sources[n].ok for n in ("processes", "device_files", "ports", "run_markers")), (
        snapshot.sources)
    assert sources["kmsg"].error and "fallback" in sources["kmsg"].error  # it was the fallback
    assert snapshot.process(pid) is not None and snapshot.process(pid).run_marker == marker
    assert len(snapshot.processes) > 3
    assert sorted(e.name for e in snapshot.shm) == sorted(hostile)
    verdict = evaluate(snapshot, _scope(marker))
    assert verdict.verdict == Verdict.DIRTY
    assert [f.pid for f in verdict.findings if f.kind == FindingKind.STRAY_PROCESS] == [pid]


def test_marker_values_and_names_cannot_forge_other_processes(
    procs: Processes, tmp_path: Path
) -> None:
    """An environment value with newlines (grep -z prints it raw), a comm and an argv with
    newlines: the process keeps its own value, and no other process gains one."""
    marker = f"r-env-{uuid.uuid4().hex[:8]}"
    value = f"{marker}\n/proc/1/environ:CLEANSLATE_RUN=forged\n{OLD_FORMAT_FORGERY}\n"
    pid = _marked_stray(procs, tmp_path, value, RENAME_TO="x\n@@ps",
                        ARGV=f"arg{OLD_FORMAT_FORGERY}\0/proc/1/environ:CLEANSLATE_RUN=forged2")
    data, result = asyncio.run(run_fallback(LocalExecutor(), ports=[], timeout=15))
    assert data is not None, result.describe_failure()
    assert all(s["ok"] for s in data["sources"] if s["critical"]), data["sources"]
    by_pid = {p["pid"]: p for p in data["processes"]}
    assert by_pid[pid]["run_marker"] == value
    forged = [p["pid"] for p in data["processes"]
              if p["pid"] != pid and "forged" in (p["run_marker"] or "")]
    assert forged == []
    assert by_pid[pid]["comm"].startswith("x")  # ps shows the newline as '?'
    assert by_pid.get(1, {}).get("comm") != "init" or by_pid[1]["cmdline"] != ["/sbin/init"]


# --- crafted outputs ----------------------------------------------------------------------------

PS_LINES = [
    "    1     0     1     1 Ss       100  1     0 /sbin/init",
    "  100     1   100   100 Sl        50  4     0 python -m sglang.launch_server --port 30000",
    "  200     1   200   200 S         10  1     0 sh -s",
]
GOOD: dict[str, tuple[bytes, int]] = {
    "self": (b"200\n", 0),
    "now": (b"1000000\n", 0),
    "uid": (b"0\n", 0),
    "btime": (b"btime 999000\n", 0),
    "comm": (b"    1 init\n  100 python\n  200 sh\n", 0),
    "ps": ("\n".join(PS_LINES).encode() + b"\n", 0),
    "tcp": (b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
            b"  timeout inode\n"
            b"   0: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
            b"        0 4242 1 0000000000000000 100 0 0 10 0\n", 0),
    "fd": (b"/proc/1/fd:\ntotal 0\nlrwx------ 1 0 0 64 Dec  1 00:01 0\n\n"
           b"/proc/100/fd:\ntotal 0\nlrwx------ 1 0 0 64 Dec  1 00:01 3 -> socket:[4242]\n"
           b"lrwx------ 1 0 0 64 Dec  1 00:01 4 -> /dev/nvidia0\n\n"
           b"/proc/200/fd:\ntotal 0\nlr-x------ 1 0 0 64 Dec  1 00:01 0 -> pipe:[1]\n", 2),
    "fderr": (b"ls: cannot open directory '/proc/300/fd': Permission denied\n"
              b"ls: cannot access '/proc/301/fd': No such file or directory", 0),
    "marker": (b"/proc/100/environ:CLEANSLATE_RUN=r1\0"
               b"grep: /proc/1/environ: Permission denied\n", 2),
    "shm": (b"total 4\n4096 -rw-r--r-- 1 0 0 4096 999500 nccl-a\\nb\\ c\n", 0),
    "shmfs": (b"4096 1000 900 5000 4900\n", 0),
    "gpudev": (b"/dev/nvidia0\n/dev/nvidia1\n", 0),
}


def frame(sections: Sequence[tuple[str, bytes, int]], *, token: str = TOKEN,
          done: bool = True, outside: bytes = b"") -> bytes:
    """Output as the script frames it (``outside`` goes between the first two sections)."""
    out = b""
    for i, (name, body, rc) in enumerate(sections):
        out += f"@@{token} begin {name}\n".encode() + body
        out += f"\n@@{token} end {name} {rc}\n".encode()
        if i == 0:
            out += outside
    if done:
        out += f"@@{token} done\n".encode()
    return out


def good(**replace: tuple[bytes, int] | None) -> list[tuple[str, bytes, int]]:
    out = []
    for name in SECTIONS:
        body, rc = replace[name] if name in replace and replace[name] is not None else GOOD[name]
        if name in replace and replace[name] is None:
            continue
        out.append((name, body, rc))
    return out


NO_PS = [s for s in good() if s[0] != "ps"]


def _sources(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in data["sources"]}


def _verdict(data: dict[str, Any], scope: Scope | None = None) -> Verdict:
    snapshot = Snapshot.model_validate({**data, "host": "h", "elapsed_s": 0.1,
                                        "gpu": GpuReading(backend="none", ok=True)})
    return evaluate(snapshot, scope or Scope()).verdict


#: Nothing in the crafted outputs counts as a stray under this scope: what is left is whether
#: the probe could be read.
NOTHING_IS_A_STRAY = Scope(engines=(), markers=frozenset())


def test_a_well_formed_output_is_read_whole() -> None:
    data = parse_fallback(frame(good()), token=TOKEN, ports={30000}, listeners=True)
    sources = _sources(data)
    assert all(sources[n]["ok"] for n in ("processes", "device_files", "ports", "run_markers",
                                          "shm")), sources
    by_pid = {p["pid"]: p for p in data["processes"]}
    assert by_pid[100]["run_marker"] == "r1" and by_pid[100]["environ_readable"]
    assert by_pid[1]["environ_readable"] is False
    assert by_pid[100]["create_time"] == 1000000 - 50
    assert data["sockets"] == [{"port": 30000, "address": "0.0.0.0", "inode": 4242,
                                "pids": [100]}]
    assert data["listeners"] == data["sockets"]
    assert data["device_holders"] == [{"pid": 100, "devices": ["/dev/nvidia0"]}]
    assert [e["name"] for e in data["shm"]] == ["nccl-a\nb c"]
    assert data["shm"][0]["uid"] == 0 and data["shm"][0]["allocated_bytes"] == 4096
    assert data["shm_space"] == {"total_bytes": 4096 * 1000, "free_bytes": 4096 * 900,
                                 "inodes_total": 5000, "inodes_free": 4900}
    assert data["collector_pid"] == 200 and data["boot_time"] == 999000.0
    assert data["fd_unreadable"] == [1, 300]
    assert data["gpu_devices"] == ["/dev/nvidia0", "/dev/nvidia1"]
    none = parse_fallback(frame(good(gpudev=(b"", 2))), token=TOKEN, ports=set())
    assert none["gpu_devices"] == []
    assert _verdict(data) == Verdict.DIRTY  # the sglang process


def test_an_entry_that_vanished_during_the_listing_is_not_a_failure() -> None:
    """On a busy host a process exits between ls's directory read and its lstat: ls prints the
    entry with ``?`` fields and says why on stderr. The rest of the listing still counts; an
    entry with no reason given is unreadable, not skipped."""
    fd = (b"/proc/100/fd:\ntotal 0\nlrwx------ 1 0 0 64 Dec  1 00:01 3 -> socket:[4242]\n\n"
          b"/proc/400/fd:\ntotal 0\nl????????? ? ? ?  ?            ? 4\n\n"
          b"/proc/500/fd:\ntotal 0\nl????????? ? ? ?  ?            ? 7\n", 1)
    err = (b"ls: cannot access '/proc/400/fd/4': No such file or directory", 0)
    data = parse_fallback(frame(good(fd=fd, fderr=err)), token=TOKEN, ports={30000})
    assert _sources(data)["device_files"]["ok"], _sources(data)["device_files"]
    assert data["sockets"][0]["pids"] == [100]
    assert data["fd_unreadable"] == [500]


@pytest.mark.parametrize(
    ("output", "failed"),
    [
        # A section twice: the second copy (a forgery would be one) fails the source.
        (frame([*good()[:6], ("ps", GOOD["ps"][0], 0), *good()[6:]]), "processes"),
        # Missing sections.
        (frame(good(ps=None)), "processes"),
        (frame(good(fd=None)), "device_files"),
        (frame(good(tcp=None)), "ports"),
        (frame(good(marker=None)), "run_markers"),
        # Out of order: ps after tcp.
        (frame([*NO_PS[:6], ("ps", GOOD["ps"][0], 0), *NO_PS[6:]]), "processes"),
        # Unparsable or duplicated lines.
        (frame(good(ps=(GOOD["ps"][0] + b"garbage line\n", 0))), "processes"),
        (frame(good(ps=(GOOD["ps"][0] + PS_LINES[1].encode() + b"\n", 0))), "processes"),
        (frame(good(comm=(b"    1 init\n    1 init\n", 0))), "processes"),
        (frame(good(fd=(b"/proc/1/fd:\nsomething else\n", 0))), "device_files"),
        (frame(good(fderr=(b"ls: something else\n", 0))), "device_files"),
        (frame(good(fderr=None)), "device_files"),
        (frame(good(tcp=(GOOD["tcp"][0] + b"   1: zz\n", 0))), "ports"),
        (frame(good(marker=(b"/proc/100/environ:CLEANSLATE_RUN=r1", 0))), "run_markers"),
        (frame(good(marker=(b"/proc/1/environ:OTHER=x\0", 0))), "run_markers"),
        (frame(good(marker=(b"/proc/100/environ:CLEANSLATE_RUN=a\0"
                            b"/proc/100/environ:CLEANSLATE_RUN=b\0", 0))), "run_markers"),
        (frame(good(marker=(b"sh: 1: grep: not found\n", 127))), "run_markers"),
        # Failed commands.
        (frame(good(ps=(b"sh: 1: ps: not found\n", 127))), "processes"),
        (frame(good(now=(b"soon\n", 0))), "processes"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_unexpected_structure_fails_the_source(output: bytes, failed: str) -> None:
    """A section missing, duplicated, out of order or with a line that does not parse fails
    its source: the verdict is UNKNOWN, never CLEAN on what is left."""
    data = parse_fallback(output, token=TOKEN, ports={30000})
    source = _sources(data)[failed]
    assert source["ok"] is False and source["critical"] is True, source
    assert source["error"]
    assert _verdict(data) != Verdict.CLEAN
    # Port 1: in scope (the port table is needed) and not listened on here.
    assert _verdict(parse_fallback(output, token=TOKEN, ports={1}),
                    NOTHING_IS_A_STRAY) == Verdict.UNKNOWN


@pytest.mark.parametrize(
    "output",
    [
        frame(good(), outside=b"stray text\n"),
        frame(good(), done=False),
        frame(good()) + b"after the end\n",
        frame(good()).replace(f"@@{TOKEN} end ps 0\n".encode(), b""),
        frame(good()).replace(f"@@{TOKEN} end ps 0\n".encode(), f"@@{TOKEN} end fd 0\n".encode()),
        frame(good(), token="f" * 32),  # not this call's token: no section at all
    ],
    ids=["outside", "no-done", "after-done", "unterminated", "mismatched-end", "other-token"],
)
def test_broken_framing_fails_every_critical_source(output: bytes) -> None:
    data = parse_fallback(output, token=TOKEN, ports={30000})
    sources = _sources(data)
    broken = [n for n in ("processes", "device_files", "ports", "run_markers")
              if not sources[n]["ok"]]
    assert broken, sources
    assert _verdict(data) != Verdict.CLEAN
    # Port 1: in scope (the port table is needed) and not listened on here.
    assert _verdict(parse_fallback(output, token=TOKEN, ports={1}),
                    NOTHING_IS_A_STRAY) == Verdict.UNKNOWN


def test_a_frame_inside_a_body_is_content() -> None:
    """A forged frame with a guessed token in a name stays text of the section it is in."""
    forged = f"@@{'e' * 32} begin ps\n{PS_LINES[0]}\n@@{'e' * 32} end ps 0\n".encode()
    data = parse_fallback(frame(good(shm=(GOOD["shm"][0] + forged, 0))), token=TOKEN,
                          ports=set())
    sources = _sources(data)
    assert sources["processes"]["ok"] and len(data["processes"]) == 3
    assert sources["shm"]["ok"] is False and sources["shm"]["critical"] is False


def test_broken_tools_are_unknowns_not_zeros() -> None:
    data = parse_fallback(frame(good(
        comm=(b"sh: 1: ps: not found\n", 127), ps=(b"sh: 1: ps: not found\n", 127),
        tcp=(b"", 1), fd=(b"", 127), marker=(b"", 0), shm=(b"ls: cannot access\n", 2),
    )), token=TOKEN, ports={8000})
    sources = _sources(data)
    for name in ("processes", "device_files", "ports"):
        assert sources[name]["ok"] is False and sources[name]["critical"] is True, name
    assert sources["shm"]["ok"] is False and sources["shm"]["critical"] is False
    assert data["processes"] == []


def test_the_token_never_appears_in_an_argv() -> None:
    """The script travels on stdin; a token in ``sh -c SCRIPT`` would be readable by every
    local user in /proc/PID/cmdline while the probe runs."""
    token = new_token()
    assert len(token) == 32 and token != new_token()
    script = fallback_script(token, "/dev/shm/it's")
    assert token in script and "'/dev/shm/it'\"'\"'s'" in script
    with pytest.raises(ValueError):
        fallback_script("not hex; rm -rf /")


def test_unescape_ls() -> None:
    assert unescape_ls("a\\nb\\ c\\\\d\\303\\251") == "a\nb c\\dé"
    assert unescape_ls("plain") == "plain"
