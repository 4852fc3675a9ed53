"""SIGKILL a ``tune`` controller or a ``worker`` at random moments, rerun it, and check the study.

Each cycle starts a fresh store and a small grid study of the simulated engine (3
configurations, one short level each), SIGKILLs the process at a moment drawn from a seeded
random generator, then reruns the same command once without a kill and checks:

- the rerun exits 0 and every planned configuration has exactly one result (none lost, none
  run twice);
- no slot was quarantined (a leftover of the study's own runs never makes its slot dirty);
- Optuna agrees with cleanslate's table: every result (its last record per trial number) is a
  ``COMPLETE`` Optuna trial with the value cleanslate tells it, the trial itself or one added
  for it (``result_of_trial``);
- no process carrying one of the study's run markers is left.

Kill moments: one cycle in three (``--every``) is killed just after a run supervisor appears
(its ``supervise.py`` seen in ``/proc``, plus 0-300 ms, ``--window``: where a launch has
processes and, before ``launching`` records, no run record); the others at a uniform moment in
the first ``--span`` seconds of the study.

    python benchmarks/kill_cycles.py --tune 20 --worker 20 --seed 35

Prints one line per cycle and the totals; needs no GPU. On a shared machine, run it (as root)
in private PID, network and mount namespaces as the tests run, so that another user's server
or stray does not make a slot dirty (that would be a finding, not a leftover of the study's):

    unshare --pid --fork --mount-proc --net --mount --propagation private \
        python tests/_nsinit.py -- "$(command -v python)" benchmarks/kill_cycles.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._kit import marked_pids, supervisors_under  # noqa: E402

STUDY = """\
name: kills
engine: sim
model: sim
port: {port}
gpus: [0]
fixed: {{tp-size: 1, time-scale: 0.25}}
space:
  max-running-requests: [16, 32, 64]
strategy: grid
workload: {{kind: random, input_len: 64, output_len: 8}}
concurrency: [2]
requests_per_level: 4
ready_timeout_s: 30
smoke_timeout_s: 10
grace_s: 5
verify_deadline_s: 20
lease_timeout_s: 10
"""
CONFIGS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cycle:
    """One kill and its rerun, as measured."""

    mode: str
    moment: str
    killed_at_s: float | None = None
    rerun_code: int | None = None
    rerun_s: float = 0.0
    results: int = 0
    lost: int = 0
    twice: int = 0
    quarantined: int = 0
    disagree: list[str] = field(default_factory=list)
    told: int = 0
    reconciled: int = 0
    leftovers: int = 0
    launching_seen: int = 0
    note: str = ""

    @property
    def ok(self) -> bool:
        return (self.rerun_code == 0 and self.lost == 0 and self.twice == 0
                and self.quarantined == 0 and not self.disagree and self.leftovers == 0)


def rows(db: Path, table: str) -> list[dict[str, Any]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(r[0]) for r in conn.execute(f"select data from {table}")]




def optuna_disagreements(db: Path) -> tuple[list[str], int]:
    """Trials whose result in cleanslate's table Optuna does not hold (with why), and how many
    results Optuna holds through a trial added for them."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="kills", storage=f"sqlite:///{db}")
    last: dict[int, dict[str, Any]] = {}
    for record in rows(db, "cs_trials"):
        last[record["number"]] = record
    trials = study.get_trials(deepcopy=False)
    complete = optuna.trial.TrialState.COMPLETE
    out, added = [], 0
    for number, record in sorted(last.items()):
        if record["status"] not in ("feasible", "infeasible"):
            continue
        value = record.get("value")
        expected = value if value is not None else 0.0
        holders = [t for t in trials if t.state == complete and (
            t.number == number or t.user_attrs.get("result_of_trial") == number)]
        if not holders:
            states = [t.state.name for t in trials if t.number == number]
            out.append(f"#{number} {record['status']} here, {states or 'absent'} in Optuna")
        elif not any(abs((t.value or 0.0) - expected) <= 1e-9 * max(1.0, abs(expected))
                     for t in holders):
            out.append(f"#{number}: {expected} here, {[t.value for t in holders]} in Optuna")
        elif all(t.number != number for t in holders):
            added += 1
    return out, added


def run_cycle(index: int, mode: str, rng: random.Random, span: float, every: int,
              window: float, root: Path, env: dict[str, str]) -> Cycle:
    folder = root / f"{mode}-{index:02d}"
    folder.mkdir()
    (folder / "gpus").mkdir()
    study = folder / "study.yaml"
    port = free_port()
    study.write_text(STUDY.format(port=port))
    db = folder / "s.db"
    store = f"sqlite:///{db}"
    cycle_env = {**env, "CLEANSLATE_SIM_GPU_DIR": str(folder / "gpus")}
    cleanslate = [sys.executable, "-m", "cleanslate"]
    if mode == "tune":
        command = [*cleanslate, "tune", str(study), "--store", store]
    else:
        subprocess.run([*cleanslate, "tune", str(study), "--store", store, "--register"],
                       env=cycle_env, capture_output=True, check=True, timeout=120)
        command = [*cleanslate, "worker", "--study", "kills", "--store", store, "--gpus", "0",
                   "--port", str(port)]
    at_supervisor = index % every == 0
    cycle = Cycle(mode=mode, moment="supervisor" if at_supervisor else "uniform")
    delay = rng.uniform(0.0, window) if at_supervisor else rng.uniform(0.0, span)
    log = (folder / "killed.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(command, env=cycle_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        if at_supervisor:
            deadline = started + 120
            while time.monotonic() < deadline and proc.poll() is None \
                    and not supervisors_under(folder):
                time.sleep(0.005)
            cycle.moment = f"supervisor+{delay * 1000:.0f}ms"
        else:
            cycle.moment = f"{delay:.1f}s"
        target = time.monotonic() + delay
        while time.monotonic() < target and proc.poll() is None:
            time.sleep(0.005)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            cycle.killed_at_s = round(time.monotonic() - started, 2)
        else:
            cycle.note = f"finished before the kill (exit {proc.returncode})"
        proc.wait(timeout=30)
    finally:
        log.close()
    if db.exists():
        cycle.launching_seen = sum(1 for r in rows(db, "cs_runs") if r["status"] == "launching")
    t0 = time.monotonic()
    rerun = subprocess.run(command, env=cycle_env, capture_output=True, text=True, timeout=600,
                           check=False)
    cycle.rerun_s = round(time.monotonic() - t0, 1)
    cycle.rerun_code = rerun.returncode
    found = re.search(r"Optuna told the recorded results of (\d+)", rerun.stdout)
    cycle.reconciled = (int(found.group(1)) if found else 0) + rerun.stdout.count(
        "has a recorded result: telling Optuna its value")
    if rerun.returncode != 0:
        (folder / "rerun.log").write_text(rerun.stdout + rerun.stderr)
        cycle.note += f" rerun: {(rerun.stdout + rerun.stderr).strip()[-300:]}"
    results = [t for t in rows(db, "cs_trials") if t["status"] in ("feasible", "infeasible")]
    keys = [json.dumps(t["params"], sort_keys=True) for t in results]
    cycle.results = len(results)
    cycle.twice = len(keys) - len(set(keys))
    cycle.lost = CONFIGS - len(set(keys))
    cycle.quarantined = sum(1 for s in rows(db, "cs_slots") if s.get("state") == "quarantined")
    cycle.disagree, cycle.told = optuna_disagreements(db)
    # A run is named by its record and, from before its launch, by its lease.
    left = marked_pids({r["id"] for r in rows(db, "cs_runs")}
                  | {lease["run_id"] for lease in rows(db, "cs_leases") if lease.get("run_id")})
    cycle.leftovers = len(left)
    for pid in left:  # this benchmark's own runs: end them so the next cycle starts clean
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return cycle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", type=int, default=20, help="cycles that kill `tune`")
    parser.add_argument("--worker", type=int, default=20, help="cycles that kill a `worker`")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--span", type=float, default=8.0,
                        help="uniform kill moments are drawn in [0, span] seconds")
    parser.add_argument("--every", type=int, default=3,
                        help="one cycle in EVERY is killed just after a supervisor appears")
    parser.add_argument("--window", type=float, default=0.3,
                        help="a kill after a supervisor appears comes within WINDOW seconds")
    parser.add_argument("--keep", action="store_true", help="keep the cycles' folders")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEANSLATE_SIM_")}
    root = Path(tempfile.mkdtemp(prefix="cs-kills-"))
    cycles: list[Cycle] = []
    plan = [("tune", i) for i in range(args.tune)] + [("worker", i) for i in range(args.worker)]
    print(f"{len(plan)} cycles, seed {args.seed}, folders in {root}")
    print(f"{'mode':6} {'#':>2} {'moment':>18} {'killed':>7} {'rerun':>6} {'s':>5} "
          f"{'results':>7} {'lost':>4} {'twice':>5} {'quar':>4} {'optuna':>6} {'told':>4} "
          f"{'left':>4} {'launching':>9}")
    for mode, index in plan:
        cycle = run_cycle(index, mode, rng, args.span, max(1, args.every), args.window, root,
                          env)
        cycles.append(cycle)
        print(f"{mode:6} {index:>2} {cycle.moment:>18} "
              f"{cycle.killed_at_s if cycle.killed_at_s is not None else '-':>7} "
              f"{cycle.rerun_code:>6} {cycle.rerun_s:>5} {cycle.results:>7} {cycle.lost:>4} "
              f"{cycle.twice:>5} {cycle.quarantined:>4} {len(cycle.disagree):>6} "
              f"{cycle.told:>4} {cycle.leftovers:>4} {cycle.launching_seen:>9}"
              + ("" if cycle.ok else "  FAILED") + (f"  {cycle.note}" if cycle.note else ""),
              flush=True)
        for line in cycle.disagree:
            print(f"    optuna: {line}")
    killed = [c for c in cycles if c.killed_at_s is not None]
    print()
    for mode in ("tune", "worker"):
        mine = [c for c in cycles if c.mode == mode]
        if not mine:
            continue
        print(f"{mode}: {sum(c.killed_at_s is not None for c in mine)} killed of {len(mine)}; "
              f"completed on rerun {sum(c.rerun_code == 0 for c in mine)}; "
              f"lost {sum(c.lost for c in mine)}; run twice {sum(c.twice for c in mine)}; "
              f"quarantined {sum(c.quarantined for c in mine)}; "
              f"Optuna disagreeing {sum(len(c.disagree) for c in mine)}; "
              f"results Optuna was told on recovery {sum(c.reconciled for c in mine)} "
              f"(through an added trial {sum(c.told for c in mine)}); "
              f"leftover processes {sum(c.leftovers for c in mine)}; "
              f"killed while a run was launching {sum(c.launching_seen > 0 for c in mine)}")
    print(f"all: {sum(c.ok for c in cycles)} of {len(cycles)} cycles passed "
          f"({len(killed)} killed)")
    if not args.keep:
        subprocess.run(["rm", "-rf", "--", str(root)], check=False)
    return 0 if all(c.ok for c in cycles) else 1


if __name__ == "__main__":
    sys.exit(main())
