"""The no-python3 probe (:mod:`cleanslate.probe.fallback`) against the collector, on this host.

Both read the same processes at nearly the same moment: for processes the test started, every
field the fallback claims to read must agree with the collector's reading.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path
from typing import Any

from cleanslate.hosts.base import CommandResult
from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.collect import run_collector
from cleanslate.probe.fallback import needs_fallback, parse_fallback, run_fallback
from cleanslate.probe.snapshot import ProcessInfo
from tests.conftest import Processes


def _result(code: int | None, stderr: bytes = b"", timed_out: bool = False) -> CommandResult:
    return CommandResult(("python3",), code, b"", stderr, 0.1, timed_out=timed_out)


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
    while not ready.exists():
        time.sleep(0.02)

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        ex = LocalExecutor()
        (data, result), (fb, fb_result) = await asyncio.gather(
            run_collector(ex, ports=[port], timeout=10),
            run_fallback(ex, ports=[port], timeout=10))
        assert data is not None, result.describe_failure()
        assert fb is not None, fb_result.describe_failure()
        return data, fb

    collected, fallback = asyncio.run(both())
    by_c = {p["pid"]: ProcessInfo.model_validate(p) for p in collected["processes"]}
    by_f = {p["pid"]: ProcessInfo.model_validate(p) for p in fallback["processes"]}
    c, f = by_c[owner.pid], by_f[owner.pid]
    for name in ("ppid", "pgid", "sid", "state", "comm", "uid", "run_marker", "threads"):
        assert getattr(c, name) == getattr(f, name), name
    assert f.run_marker == "r-fallback" and f.environ_readable
    assert " ".join(c.cmdline).split() == list(f.cmdline)
    assert abs(c.create_time - f.create_time) < 1.5
    assert [(s["port"], s["pids"]) for s in fallback["sockets"]] == [(port, [owner.pid])]
    assert collected["sockets"][0]["address"] == fallback["sockets"][0]["address"]
    sources = {s["name"]: s for s in fallback["sources"]}
    assert all(sources[n]["ok"] for n in ("processes", "device_files", "ports"))
    assert sources["kmsg"]["ok"] is False and sources["kmsg"]["critical"] is False
    # Processes alive throughout appear in both (short-lived ones may come and go).
    assert set(by_f) & set(by_c) >= {owner.pid, 1}


def test_broken_tools_are_unknowns_not_zeros() -> None:
    text = "\n".join([
        "@@self 10", "@@now 1000", "@@uid 0", "@@btime",
        "@@comm", "sh: 1: ps: not found", "@@rc 127",
        "@@ps", "sh: 1: ps: not found", "@@rc 127",
        "@@tcp", "@@rc 1",
        "@@fd", "@@rc 127",
        "@@marker", "@@rc 0",
        "@@shm", "@@rc 2",
        "@@end",
    ])
    data = parse_fallback(text, ports={8000})
    sources = {s["name"]: s for s in data["sources"]}
    for name in ("processes", "device_files", "ports"):
        assert sources[name]["ok"] is False and sources[name]["critical"] is True, name
    assert sources["shm"]["ok"] is False and sources["shm"]["critical"] is False
    assert data["processes"] == []
