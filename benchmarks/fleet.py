"""Fleet: a 12-trial grid of the simulated engine on 1, 2 and 4 slots of this machine, and a
worker SIGKILLed in the middle of a trial.

Each study runs through ``cleanslate tune`` (a child process, as a user runs it) on a fresh
SQLite store and simulated GPU ledger, with one slot per simulated GPU (``slots: [{gpus: [0]},
...]``). Printed, as a Markdown table: the wall time of each, its ratio to one slot, and the
trials *lost* (planned configurations without a result) and *duplicated* (results beyond one
per configuration). The sim's ``time-scale`` stretches every simulated duration: at 1.0 (the
default here, four times the tests' 0.25) a level of ``--level-s`` seconds sends a quarter of the
requests, so the engines mostly wait rather than compute and the 2 CPUs of the machines this
project is built on are not what limits four slots.

Then the re-queue: a controller on one slot and a worker (``cleanslate worker``) on another;
once the worker's server is ready, the worker is SIGKILLed and a second worker starts; printed:
the seconds from the kill until the killed worker's configuration runs again (its trial
recorded with another number), and whether the killed worker's server was torn down.

Usage::

    python benchmarks/fleet.py                      # about 4-5 minutes on 2 cores
    python benchmarks/fleet.py --slots 1 4 --time-scale 0.5 --level-s 1

It runs in private PID, network and mount namespaces (as root, like ``benchmarks/soak.py``):
the slots' checks see every process of the machine, and another program's engines there (a test
run) would make them DIRTY. Every process the script starts is ended by its PID when it is done
(or interrupted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _isolate import reexec_isolated

INSIDE_ENV = "CLEANSLATE_FLEET_BENCH_ISOLATED"

GRID = """\
name: {name}
engine: sim
model: sim
port: {port}
{slots}
fixed: {{tp-size: 1, time-scale: {time_scale}}}
space:
  max-running-requests: [16, 32, 64]
  chunked-prefill-size: [512, 1024]
  disable-radix-cache: [true, false]
strategy: grid
workload: {{kind: random, input_len: 128, output_len: 16}}
concurrency: [4]
duration_s_per_level: {level_s}
ready_timeout_s: 60
smoke_timeout_s: 15
grace_s: 5
verify_deadline_s: 20
lease_timeout_s: 10
"""

PLANNED = 12


def free_port_block(n: int) -> int:
    """A port ``p`` with ``p .. p + n - 1`` free now."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        ok = True
        for port in range(base + 1, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base


def rows(db: Path, table: str) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
            return [json.loads(r[0]) for r in conn.execute(f"select data from {table}")]
    except sqlite3.OperationalError:  # not created yet, or busy
        return []


def results(db: Path, study: str) -> list[dict[str, Any]]:
    return [t for t in rows(db, "cs_trials")
            if t["study"] == study and t["status"] in ("feasible", "infeasible")]


def config(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


class Procs:
    """The processes this script started; :meth:`end` ends exactly those, by PID."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as fh:
            proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT)
        self.started.append(proc)
        return proc

    def end(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def cleanslate(*args: str) -> list[str]:
    return [sys.executable, "-m", "cleanslate", *args]


def workdir(base: Path, name: str) -> tuple[Path, dict[str, str]]:
    here = base / name
    (here / "gpus").mkdir(parents=True)
    env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": str(here / "gpus"),
           "CLEANSLATE_ARTIFACTS": str(here / "artifacts")}
    env.pop("CLEANSLATE_STORE", None)
    return here, env


def write_study(here: Path, name: str, port: int, slots: str, args: argparse.Namespace) -> Path:
    path = here / f"{name}.yaml"
    path.write_text(GRID.format(name=name, port=port, slots=slots, time_scale=args.time_scale,
                                level_s=args.level_s))
    return path


def grid_on(slots: int, base: Path, procs: Procs, args: argparse.Namespace) -> dict[str, Any]:
    name = f"slots{slots}"
    here, env = workdir(base, name)
    entries = ", ".join(f"{{gpus: [{i}]}}" for i in range(slots))
    study = write_study(here, name, free_port_block(slots), f"slots: [{entries}]", args)
    db = here / "s.db"
    started = time.monotonic()
    proc = procs.start(cleanslate("tune", str(study), "--store", f"sqlite:///{db}"), env,
                       here / "tune.log")
    code = proc.wait(timeout=args.timeout)
    wall = time.monotonic() - started
    found = results(db, name)
    distinct = {config(t["params"]) for t in found}
    return {"slots": slots, "wall_s": wall, "exit": code, "results": len(found),
            "lost": PLANNED - len(distinct), "duplicated": len(found) - len(distinct)}


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def sigkill(base: Path, procs: Procs, args: argparse.Namespace) -> dict[str, Any]:
    """A controller on GPU 0, a worker on GPU 1 SIGKILLed once its server is ready, a second
    worker on GPU 2 started then: seconds until the killed worker's configuration runs again."""
    name = "kill"
    here, env = workdir(base, name)
    port = free_port_block(3)
    study = write_study(here, name, port, "gpus: [0]", args)
    db = here / "s.db"
    store = f"sqlite:///{db}"
    controller = procs.start(cleanslate("tune", str(study), "--store", store), env,
                             here / "tune.log")
    wait_for(lambda: [x for x in rows(db, "cs_leases") if x["study"] == name], 120,
             "the controller's first lease")
    victim = procs.start(cleanslate("worker", "--study", name, "--store", store, "--gpus", "1",
                                    "--port", str(port + 1)), env, here / "victim.log")
    run = wait_for(lambda: next((r for r in rows(db, "cs_runs") if r["status"] == "ready"
                                 and r["port"] == port + 1), None), 180, "the victim's run")
    [lease] = [x for x in rows(db, "cs_leases") if x["run_id"] == run["id"]]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    killed = time.monotonic()
    other = procs.start(cleanslate("worker", "--study", name, "--store", store, "--gpus", "2",
                                   "--port", str(port + 2)), env, here / "other.log")
    wait_for(lambda: next((t for t in rows(db, "cs_trials") if t["params"] == lease["params"]
                           and t["number"] != lease["trial"]), None), 180, "the re-run")
    again = time.monotonic() - killed
    codes = [controller.wait(timeout=args.timeout), other.wait(timeout=args.timeout)]
    found = results(db, name)
    distinct = {config(t["params"]) for t in found}
    state = next(x.get("state") for x in rows(db, "cs_leases") if x["id"] == lease["id"])
    return {"rerun_s": again, "torn_down": not alive(int(run["pid"])), "exits": codes,
            "results": len(found), "lost": PLANNED - len(distinct),
            "duplicated": len(found) - len(distinct), "lease": state}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="the sim's time-scale (default 1.0)")
    parser.add_argument("--level-s", type=float, default=2.0,
                        help="duration_s_per_level (default 2)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-kill", action="store_true", help="skip the SIGKILL measurement")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    reexec_isolated(INSIDE_ENV, "fleet")

    procs = Procs()
    out: dict[str, Any] = {"cpus": os.cpu_count(), "time_scale": args.time_scale,
                           "level_s": args.level_s, "grids": []}
    with tempfile.TemporaryDirectory(prefix="cleanslate-fleet-") as tmp:
        try:
            for n in args.slots:
                out["grids"].append(grid_on(n, Path(tmp), procs, args))
            if not args.no_kill:
                out["kill"] = sigkill(Path(tmp), procs, args)
        finally:
            procs.end()

    print(f"{PLANNED}-trial sim grid (time-scale {args.time_scale:g}, {args.level_s:g} s per "
          f"level), one `cleanslate tune` per row, {out['cpus']} CPUs\n")
    print("| slots | wall time (s) | ratio to 1 slot | results | lost | duplicated | exit |")
    print("|---|---|---|---|---|---|---|")
    first = next((g["wall_s"] for g in out["grids"] if g["slots"] == 1), None)
    for g in out["grids"]:
        ratio = f"{g['wall_s'] / first:.2f}" if first else "-"
        print(f"| {g['slots']} | {g['wall_s']:.1f} | {ratio} | {g['results']} | {g['lost']} | "
              f"{g['duplicated']} | {g['exit']} |")
    if "kill" in out:
        k = out["kill"]
        print("\n| worker SIGKILLed mid-trial | |\n|---|---|")
        print(f"| its trial ran again after | {k['rerun_s']:.1f} s |")
        print(f"| its server torn down | {'yes' if k['torn_down'] else 'NO'} |")
        print(f"| its lease | {k['lease']} |")
        print(f"| results / lost / duplicated | {k['results']} / {k['lost']} / "
              f"{k['duplicated']} |")
        print(f"| exits (controller, other worker) | {k['exits']} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    bad = any(g["lost"] or g["duplicated"] or g["exit"] for g in out["grids"])
    if "kill" in out:
        bad = bad or out["kill"]["lost"] or out["kill"]["duplicated"] or any(out["kill"]["exits"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
