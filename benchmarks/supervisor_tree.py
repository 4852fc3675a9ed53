"""What does the run supervisor's tree recording cost, and how fast does it record a new child?
(issue 35, item 7: without a cgroup, teardown selects only what the supervisor recorded.)

The supervisor script (``src/cleanslate/launch/_supervise_script.py``, run as ``serve`` runs
it, without a cgroup) starts a small engine that forks a short-lived-parent grandchild every
0.37 s (``fork``, ``setsid`` in the child, the middle process exits: the pattern that leaves
the run's group and session) and logs each grandchild's PID with the time it started. The
script polls ``tree.txt`` every 2 ms and notes when each PID appears. Meanwhile
``--idle N`` unrelated idle processes stand for a busy host (the supervisor reads every
``/proc/PID/stat`` on each pass).

Printed, per host size: the supervisor's CPU time per second of wall time (``utime + stime``
of ``/proc/PID/stat`` over the run, minus the same for an idle moment before the children),
the CPU time of a full pass (every ``stat`` read) and the mean of 40 passes as the supervisor
makes them (only new PIDs read, a full pass every 20), timed in this process, and the latency
from a grandchild's start to its line in ``tree.txt`` (median, max).

    python benchmarks/supervisor_tree.py [--idle 0 500 1500] [--children 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUPERVISOR = ROOT / "src" / "cleanslate" / "launch" / "_supervise_script.py"
sys.path.insert(0, str(ROOT / "src"))

from cleanslate.launch._supervise_script import (  # noqa: E402
    TREE_FULL_EVERY,
    TREE_INTERVAL_S,
    TreeRecorder,
)

ENGINE = r"""
import os, sys, time
log, count = sys.argv[1], int(sys.argv[2])
time.sleep(1.0)
for _ in range(count):
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        pid = os.fork()
        if pid == 0:
            started = time.time()
            os.write(write, f"{os.getpid()} {started}\n".encode())
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    os.close(write)
    line = os.read(read, 100).decode()
    os.close(read)
    with open(log, "a") as fh:
        fh.write(line)
    os.wait()
    time.sleep(0.37)
time.sleep(1.0)
"""


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def one(idle: int, children: int) -> dict[str, float]:
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(idle)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            log = folder / "children.log"
            spec = {"argv": [sys.executable, "-c", ENGINE, str(log), str(children)],
                    "env": {}, "log": str(folder / "server.log"),
                    "state": str(folder / "state.json"), "daemonize": True, "cgroup": None}
            (folder / "spec.json").write_text(json.dumps(spec))
            subprocess.run([sys.executable, "-I", "-S", str(SUPERVISOR),
                            str(folder / "spec.json")], check=True)
            while not (folder / "state.json").exists():
                time.sleep(0.01)
            state = json.loads((folder / "state.json").read_text())
            sup = int(state["supervisor_pid"])
            hz = os.sysconf("SC_CLK_TCK")
            start_cpu, start_wall = cpu_ticks(sup), time.monotonic()
            seen: dict[int, float] = {}
            tree = folder / "tree.txt"
            started: dict[int, float] = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                now = time.time()
                for line in tree.read_text().splitlines()[1:]:
                    seen.setdefault(int(line.split()[0]), now)
                if log.exists():
                    started = {int(p): float(t) for p, t in
                               (line.split() for line in log.read_text().splitlines()
                                if line.count(" ") == 1)}
                if len(started) >= children and set(started) <= set(seen):
                    break
                time.sleep(0.002)
            cpu, wall = cpu_ticks(sup), time.monotonic()
            lags = [seen[pid] - at for pid, at in started.items() if pid in seen]
            missed = len(started) - len(lags)
            for pid in started:  # the grandchildren this script's engine started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            recorder = TreeRecorder(str(folder / "bench-tree.txt"), None)
            t0 = time.process_time()
            recorder.new_descendants()
            full = time.process_time() - t0
            passes = TREE_FULL_EVERY * 2
            t0 = time.process_time()
            for _ in range(passes):
                recorder.new_descendants()
            per_pass = (time.process_time() - t0) / passes
            return {"processes": float(len([n for n in os.listdir("/proc") if n.isdigit()])),
                    "cpu_per_s": (cpu - start_cpu) / hz / (wall - start_wall),
                    "full_ms": full * 1000,
                    "pass_ms": per_pass * 1000,
                    "lag_median_s": statistics.median(lags) if lags else float("nan"),
                    "lag_max_s": max(lags) if lags else float("nan"),
                    "missed": float(missed)}
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, nargs="+", default=[0, 500, 1500])
    parser.add_argument("--children", type=int, default=20)
    args = parser.parse_args()
    print(f"interval {TREE_INTERVAL_S} s, {args.children} grandchildren per row")
    print("processes  supervisor CPU s/s  full pass ms  mean pass ms  record lag median / max s"
          "  missed")
    for idle in args.idle:
        row = one(idle, args.children)
        print(f"{row['processes']:9.0f}  {row['cpu_per_s']:18.4f}  {row['full_ms']:12.2f}  "
              f"{row['pass_ms']:12.2f}  "
              f"{row['lag_median_s']:10.3f} / {row['lag_max_s']:.3f}        "
              f"{row['missed']:.0f}")


if __name__ == "__main__":
    main()
