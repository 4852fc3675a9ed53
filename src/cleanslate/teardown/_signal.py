"""Send a signal to processes, but only to the ones that are still who we think they are.

A self-contained, stdlib-only script (shipped to a host's ``python3`` like the collector). For
each target ``{"pid": P, "create_time": T}`` it reads ``/proc/P/stat`` and signals P only when
its start time still equals T (the PID was not reused by another process since the snapshot).

Input (argv[1], JSON): ``{"signal": "SIGTERM", "targets": [{"pid": .., "create_time": ..}]}``.
Output (stdout, JSON): ``{"sent": [..], "gone": [..], "reused": [..], "zombie": [..],
"d_state": [..], "errors": {pid: message}}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def identity(pid: int, boot: float, ticks: int) -> tuple[float, str] | None:
    """``(create_time, state)`` of a live PID, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return round(boot + int(fields[19]) / ticks, 2), fields[0]


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    name = spec.get("signal", "SIGTERM")
    signum = 0 if name == "0" else getattr(signal, name)
    boot = _boot_time()
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, Any] = {"sent": [], "gone": [], "reused": [], "zombie": [], "d_state": [],
                           "errors": {}}
    for target in spec.get("targets", []):
        pid = int(target["pid"])
        found = identity(pid, boot, ticks)
        if found is None:
            out["gone"].append(pid)
            continue
        create_time, state = found
        expected = target.get("create_time")
        if expected is not None and abs(create_time - expected) > 0.02:
            out["reused"].append(pid)
            continue
        if state == "Z":
            out["zombie"].append(pid)  # dead already; its parent has not reaped it yet
            continue
        if state == "D":
            out["d_state"].append(pid)
        try:
            os.kill(pid, signum)
            out["sent"].append(pid)
        except ProcessLookupError:
            out["gone"].append(pid)
        except OSError as exc:
            out["errors"][str(pid)] = str(exc)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
