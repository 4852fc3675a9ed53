"""Soak: many randomized verified cycles with faults and random kills, and an independent census.

Each cycle runs a one-trial study of the simulated engine through ``cleanslate tune`` (a child
process, as a user runs it) with one fault of the engine (crash at concurrency, hang, ignore
SIGTERM, orphan grandchild, slow release, leave port, shm leftover, slow start, NaN, OOM) and,
at random, one disruption: the controller SIGKILLed at a random moment (then ``tune`` is rerun,
which must clean up and finish the study), or the server's root, supervisor, both, or a worker
SIGKILLed at a random moment after it is ready.

The census is the soak's own and does not use anything cleanslate records:

- the soak runs in private PID, network and mount namespaces (as root; see
  ``tests/_isolation.py``), so every process that exists there was started by the soak: after a
  cycle, any process that is not the soak itself or one of its decoys is *left behind*;
- decoys are processes the soak starts outside every run (in its own session, in a new session,
  one holding a ``/dev/shm`` file named like an engine's leftovers): each records every signal it
  receives; a decoy that got a signal, died, or lost its file was *signalled without being owned*;
- a run whose recorded verification says CLEAN while the census finds a process of that cycle
  alive, or the study's port still bound, is a *false CLEAN*;
- every trial the soak saw finished is compared, at the end, with the store: a finished trial
  that disappeared or changed is *lost*.

All four figures must be 0. Usage::

    python benchmarks/soak.py --cycles 100 --seed 1          # about 20-30 min on 2 cores
    python benchmarks/soak.py --cycles 4 --seed 7 --json out.json

Without root (no private namespaces) the census cannot tell the soak's processes from the
machine's: the script says so and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _isolate import reexec_isolated

ROOT = Path(__file__).resolve().parents[1]
INSIDE_ENV = "CLEANSLATE_SOAK_ISOLATED"

FAULTS = (
    "crash-at-concurrency=4",
    "hang-after=6",
    "ignore-sigterm",
    "orphan-grandchild=512",
    "slow-release=1.5",
    "leave-port=PORT",
    "shm-leftover",
    "slow-start=2",
    "nan",
    "oom-at-start",
    None,
)
DISRUPTIONS = ("none", "none", "kill-controller", "kill-server")
SERVER_TARGETS = ("root", "supervisor", "root+supervisor", "worker")

STUDY = """\
name: {name}
engine: sim
model: sim
port: {port}
gpus: {gpus}
fixed: {{tp-size: {tp}, time-scale: 0.25}}
space:
  fault: [{fault}]
strategy: grid
workload: {{kind: random, input_len: 128, output_len: 16}}
concurrency: [4, 8]
duration_s_per_level: 1
ready_timeout_s: 30
smoke_timeout_s: 5
grace_s: 2
verify_deadline_s: 15
"""

DECOY = r"""
import os, signal, sys, time, mmap
log = open(sys.argv[1], "a", buffering=1)
shm = sys.argv[2] if len(sys.argv) > 2 else ""
keep = None
if shm:
    fd = os.open(shm, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    keep = mmap.mmap(fd, 4096)
def note(signum, frame):
    log.write(f"{os.getpid()} {signal.Signals(signum).name}\n")
for s in signal.valid_signals():
    if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGWINCH):
        try:
            signal.signal(s, note)
        except (OSError, ValueError):
            pass
while True:
    time.sleep(3600)
"""


@dataclass
class Cycle:
    number: int
    fault: str | None
    disruption: str
    target: str | None = None
    kill_at_s: float | None = None
    killed: list[int] = field(default_factory=list)
    reruns: int = 0
    exit_codes: list[int | None] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)
    port_bound: bool = False
    false_clean: int = 0
    shm_left: list[str] = field(default_factory=list)
    verdicts: list[str | None] = field(default_factory=list)
    trial_statuses: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    note: str = ""


@dataclass
class Census:
    """The soak's own view of what is alive."""

    own: set[int]
    decoys: dict[int, str]

    def strays(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid == 1 or pid in self.own or pid in self.decoys:
                continue
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace").strip()
            except OSError:
                continue
            state = stat.rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue
            comm = stat[stat.find("(") + 1 : stat.rfind(")")]
            out[pid] = f"{pid} {comm} {cmd[:120]}"
        return out


def port_bound(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 3 and parts[3] == "0A" and int(parts[1].split(":")[1], 16) == port:
                    return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rows(db: Path, table: str) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
            return [json.loads(r[0]) for r in conn.execute(f"select data from {table}")]
    except sqlite3.Error:
        return []


def kill(pid: int | None, why: list[int]) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            why.append(pid)


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
    return out


class Soak:
    def __init__(self, work: Path, seed: int, verbose: bool) -> None:
        self.work = work
        self.rng = random.Random(seed)
        self.verbose = verbose
        self.db = work / "soak.db"
        self.env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": str(work / "gpus"),
                    "CLEANSLATE_ARTIFACTS": str(work / "artifacts")}
        (work / "gpus").mkdir()
        self.decoy_log = work / "decoys.log"
        self.decoys: dict[int, subprocess.Popen[bytes]] = {}
        self.decoy_shm: list[str] = []
        self.finished: dict[tuple[str, int], tuple[str, Any, Any]] = {}
        self.census = Census(own={os.getpid()}, decoys={})

    def say(self, text: str) -> None:
        if self.verbose:
            print(text, flush=True)

    # -- decoys ---------------------------------------------------------------------------------

    def start_decoys(self) -> None:
        specs: list[tuple[bool, str]] = [(False, ""), (True, ""),
                                         (True, "/dev/shm/sem.mp-soakdecoy"),
                                         (False, "/dev/shm/torch_soakdecoy")]
        for new_session, shm in specs:
            proc = subprocess.Popen([sys.executable, "-c", DECOY, str(self.decoy_log), shm],
                                    start_new_session=new_session)
            self.decoys[proc.pid] = proc
            self.census.decoys[proc.pid] = shm
            if shm:
                self.decoy_shm.append(shm)
        time.sleep(0.5)

    def decoy_damage(self) -> list[str]:
        out = []
        logged = self.decoy_log.read_text().splitlines() if self.decoy_log.exists() else []
        out += [f"decoy got a signal: {line}" for line in logged]
        for pid, proc in self.decoys.items():
            if proc.poll() is not None:
                out.append(f"decoy {pid} died (status {proc.returncode})")
        out += [f"decoy's file removed: {p}" for p in self.decoy_shm if not os.path.exists(p)]
        return out

    # -- one cycle --------------------------------------------------------------------------------

    def tune(self, study: Path) -> subprocess.Popen[bytes]:
        log = open(self.work / f"{study.stem}.log", "ab")  # noqa: SIM115 (closed by the child)
        return subprocess.Popen(
            [sys.executable, "-m", "cleanslate", "tune", str(study), "--store",
             f"sqlite:///{self.db}"], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=self.rng.random() < 0.5)

    def cycle(self, number: int) -> Cycle:
        fault = self.rng.choice(FAULTS)
        port = free_port()
        if fault == "leave-port=PORT":
            fault = f"leave-port={free_port()}"
        c = Cycle(number=number, fault=fault, disruption=self.rng.choice(DISRUPTIONS))
        name = f"soak-{number}"
        study = self.work / f"{name}.yaml"
        tp = self.rng.choice((1, 2))
        study.write_text(STUDY.format(name=name, port=port, tp=tp, gpus=list(range(tp)),
                                      fault=json.dumps(fault)))
        started = time.monotonic()
        proc = self.tune(study)
        if c.disruption == "kill-controller":
            c.kill_at_s = round(self.rng.uniform(0.3, 8.0), 2)
            self._wait_or_exit(proc, c.kill_at_s)
            if proc.poll() is None:
                kill(proc.pid, c.killed)
        elif c.disruption == "kill-server":
            c.target = self.rng.choice(SERVER_TARGETS)
            run = self._wait_ready(proc, name, 40.0)
            if run is not None:
                c.kill_at_s = round(self.rng.uniform(0.0, 2.5), 2)
                time.sleep(c.kill_at_s)
                if c.target in ("root", "root+supervisor"):
                    kill(run.get("pid"), c.killed)
                if c.target in ("supervisor", "root+supervisor"):
                    kill(run.get("supervisor_pid"), c.killed)
                if c.target == "worker":
                    workers = children(int(run.get("pid") or 0))
                    kill(self.rng.choice(workers) if workers else None, c.killed)
            else:
                c.note = "no run became ready (the fault stops it early)"
        try:
            c.exit_codes.append(proc.wait(timeout=300))
        except subprocess.TimeoutExpired:
            kill(proc.pid, [])
            c.exit_codes.append(None)
            c.note += " controller hung >300 s"
        # A killed controller (or one that ended unclean) is rerun: it must clean up and finish.
        while c.reruns < 2 and (c.exit_codes[-1] in (None, -9, 137) or self._unfinished(name)):
            c.reruns += 1
            rerun = self.tune(study)
            try:
                c.exit_codes.append(rerun.wait(timeout=300))
            except subprocess.TimeoutExpired:
                kill(rerun.pid, [])
                c.exit_codes.append(None)
        self._census(c, name, port)
        c.elapsed_s = round(time.monotonic() - started, 1)
        return c

    def _wait_or_exit(self, proc: subprocess.Popen[bytes], seconds: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=seconds)

    def _wait_ready(self, proc: subprocess.Popen[bytes], study: str, seconds: float
                    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and proc.poll() is None:
            ready = [r for r in rows(self.db, "cs_runs")
                     if r.get("study") == study and r.get("status") == "ready"]
            if ready:
                return ready[-1]
            time.sleep(0.1)
        return None

    def _unfinished(self, study: str) -> bool:
        trials = [t for t in rows(self.db, "cs_trials") if t.get("study") == study]
        done = [t for t in trials if t.get("status") in ("feasible", "infeasible")]
        return not done

    def _census(self, c: Cycle, study: str, port: int) -> None:
        time.sleep(0.2)
        strays = self.census.strays()
        c.left_behind = sorted(strays.values())
        c.port_bound = port_bound(port) or bool(
            c.fault and c.fault.startswith("leave-port=")
            and port_bound(int(c.fault.split("=")[1])))
        shm = sorted(set(os.listdir("/dev/shm")) - {os.path.basename(p)
                                                    for p in self.decoy_shm})
        c.shm_left = shm
        runs = [r for r in rows(self.db, "cs_runs") if r.get("study") == study]
        c.verdicts = [(r.get("verdict_after") or {}).get("verdict") for r in runs]
        if c.left_behind or c.port_bound:
            c.false_clean = sum(1 for v in c.verdicts if v == "clean")
        trials = [t for t in rows(self.db, "cs_trials") if t.get("study") == study]
        c.trial_statuses = [f"{t.get('status')}:{t.get('cause')}" if t.get("cause")
                            else str(t.get("status")) for t in trials]
        for t in trials:
            if t.get("status") in ("feasible", "infeasible"):
                self.finished[(study, int(t["number"]))] = (t["status"], t.get("value"),
                                                            t.get("run_id"))
        # End what was left (by PID, after the census), so the next cycle starts clean.
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in shm:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")

    def lost_trials(self) -> list[str]:
        now = {(t["study"], int(t["number"])): (t["status"], t.get("value"), t.get("run_id"))
               for t in rows(self.db, "cs_trials")
               if t.get("status") in ("feasible", "infeasible")}
        return [f"{k}: was {v}, now {now.get(k)}" for k, v in self.finished.items()
                if now.get(k) != v]

    def stop_decoys(self) -> None:
        for proc in self.decoys.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for path in self.decoy_shm:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _histogram(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return dict(sorted(out.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write every cycle's record here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args()
    reexec_isolated(INSIDE_ENV, "soak")
    work = Path(tempfile.mkdtemp(prefix="cleanslate-soak-"))
    soak = Soak(work, args.seed, verbose=not args.quiet)
    soak.start_decoys()
    cycles: list[Cycle] = []
    started = time.monotonic()
    try:
        for number in range(args.cycles):
            c = soak.cycle(number)
            cycles.append(c)
            flag = "" if not (c.left_behind or c.false_clean or c.port_bound) else "  <-- !"
            soak.say(f"cycle {number:3d}  {c.fault or 'no fault':24s} {c.disruption:15s} "
                     f"{c.target or '':16s} kill@{c.kill_at_s if c.kill_at_s is not None else '-'}"
                     f"  exits {c.exit_codes}  trials {c.trial_statuses}  "
                     f"verdicts {c.verdicts}  {c.elapsed_s:.0f} s{flag}")
            for line in c.left_behind:
                soak.say(f"          left behind: {line}")
        damage = soak.decoy_damage()
        lost = soak.lost_trials()
    finally:
        soak.stop_decoys()
    summary = {
        "cycles": len(cycles),
        "seed": args.seed,
        "elapsed_s": round(time.monotonic() - started, 1),
        "false_clean": sum(c.false_clean for c in cycles),
        "processes_left_behind": sum(len(c.left_behind) for c in cycles),
        "ports_left_bound": sum(1 for c in cycles if c.port_bound),
        "signalled_not_owned": len(damage),
        "finished_trials_lost": len(lost),
        "finished_trials": len(soak.finished),
        "shm_files_left": sum(len(c.shm_left) for c in cycles),
        "controller_kills": sum(1 for c in cycles if c.disruption == "kill-controller"
                                and c.killed),
        "server_kills": sum(1 for c in cycles if c.disruption == "kill-server" and c.killed),
        "faults": sorted({str(c.fault) for c in cycles}),
        "outcomes": _histogram(s for c in cycles for s in c.trial_statuses),
        "details": {"decoys": damage, "lost": lost},
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "faults"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary,
                                         "cycles": [asdict(c) for c in cycles]}, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    bad = (summary["false_clean"] or summary["processes_left_behind"]
           or summary["ports_left_bound"] or summary["signalled_not_owned"]
           or summary["finished_trials_lost"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
