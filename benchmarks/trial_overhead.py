"""What the tool costs per trial, against the engine's own time in it (issue: performance).

Runs the quick start's study (``examples/quickstart.yaml``: the simulated engine, an ablation of
7 trials) through ``cleanslate tune`` on a fresh SQLite store, then reads each trial's recorded
phases and splits its wall time in two:

- **engine time**: what the server itself needs: ``ready_s`` (from launch until it answers),
  ``smoke_s`` (the smoke request) and every benchmark level (``level_*_s``);
- **tool time**: everything else in the trial's ``total_s`` (the sum of its phases for a
  configuration that did not start): the check before
  (``verify_before_s``), the host snapshot (``doctor_s``), starting the supervisor and the
  engine (``launch_s``), teardown with its verification (``teardown_s``, which includes the
  engine's own exit and the settle window), and what lies between the phases.

Infeasible trials (a configuration that does not start) have no levels; they are reported
apart. Prints a Markdown table (median and worst per trial, and the tool/engine ratio), and
with ``--json`` writes it.

    python benchmarks/trial_overhead.py [--json out.json] [--study examples/quickstart.yaml]

It runs in private PID, network and mount namespaces (as root, like the other benchmarks), so
that other engines on the machine cannot make its checks DIRTY.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _isolate import reexec_isolated

REPO = Path(__file__).resolve().parents[1]
ENGINE_PHASES = ("ready_s", "smoke_s")
TOOL_PHASES = ("verify_before_s", "doctor_s", "launch_s", "teardown_s")


def split(phases: dict[str, float]) -> dict[str, float]:
    """A trial's seconds: engine, tool (the rest of ``total_s``) and the tool's named phases."""
    engine = sum(phases.get(k, 0.0) for k in ENGINE_PHASES) + sum(
        v for k, v in phases.items() if k.startswith("level_"))
    # A configuration that did not start has no ``total_s``: its phases are all there is.
    total = phases.get("total_s") or round(sum(phases.values()), 3)
    out = {"total_s": total, "engine_s": round(engine, 3),
           "tool_s": round(total - engine, 3)}
    named = 0.0
    for key in TOOL_PHASES:
        out[key] = phases.get(key, 0.0)
        named += out[key]
    out["between_s"] = round(total - engine - named, 3)
    return out


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return round(float(statistics.median(t[key] for t in trials)), 3)

    def worst(key: str) -> float:
        return round(float(max(t[key] for t in trials)), 3)

    keys = ("total_s", "engine_s", "tool_s", *TOOL_PHASES, "between_s")
    ratios = [t["tool_s"] / t["engine_s"] for t in trials if t["engine_s"] > 0]
    return {"trials": len(trials), **{f"{k}_median": med(k) for k in keys},
            **{f"{k}_worst": worst(k) for k in keys},
            "tool_over_engine_median": round(statistics.median(ratios), 3) if ratios else None}


def table(summary: dict[str, Any]) -> list[str]:
    """The Markdown table of a summary (also ``benchmarks/results.py``'s)."""
    lines = ["| trials | n | total | engine | tool (worst) | check before | host snapshot "
             "| launch | teardown + verify | between | tool / engine |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, key in (("benchmarked", "benchmarked"), ("did not start", "not_started")):
        p = summary.get(key)
        if not p:
            continue
        ratio = p.get("tool_over_engine_median")
        lines.append(
            f"| {label} | {p['trials']} | {p['total_s_median']:.2f} s "
            f"| {p['engine_s_median']:.2f} s | {p['tool_s_median']:.2f} s "
            f"({p['tool_s_worst']:.2f} s) | {p['verify_before_s_median']:.2f} s "
            f"| {p['doctor_s_median']:.2f} s | {p['launch_s_median']:.2f} s "
            f"| {p['teardown_s_median']:.2f} s | {p['between_s_median']:.2f} s "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=REPO / "examples" / "quickstart.yaml")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reexec_isolated("CLEANSLATE_OVERHEAD_BENCH_ISOLATED", "trial_overhead")
    from cleanslate.store import Store

    with tempfile.TemporaryDirectory(prefix="cs-overhead-") as tmp:
        url = f"sqlite:///{tmp}/cs.db"
        env = {**os.environ, "CLEANSLATE_STORE": url, "CLEANSLATE_ARTIFACTS": f"{tmp}/artifacts",
               "CLEANSLATE_SIM_GPU_DIR": f"{tmp}/gpus"}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "cleanslate", "tune", str(args.study),
                               "--json"], env=env, capture_output=True, text=True, timeout=1800,
                              check=False)
        wall = time.monotonic() - started
        if done.returncode not in (0, 1):
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        store = Store(url, create=False)
        name = next(iter(store.studies()))
        records = store.trials(name)
        store.close()
    feasible = [split(dict(t.phases)) | {"number": t.number, "status": str(t.status)}
                for t in records if t.phases and any(
                    k.startswith("level_") for k in t.phases)]
    failed = [split(dict(t.phases)) | {"number": t.number, "status": str(t.status)}
              for t in records if t.phases and not any(
                  k.startswith("level_") for k in t.phases)]
    summary: dict[str, Any] = {
        "study": name, "wall_s": round(wall, 1),
        "benchmarked": summarize(feasible) if feasible else None,
        "not_started": summarize(failed) if failed else None}
    print(f"Study {name}: {len(records)} trials in {wall:.1f} s ({os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d')}).\n")
    print("\n".join(table(summary)))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "per_trial": feasible + failed},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
