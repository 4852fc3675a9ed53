"""Capacity under an SLO on the sim: the search's boundary against the true one, 10 seeds.

For each seed a new sim server (``--noise-seed SEED``: its own run factor) and an SLO on median
ITL (16 to 28 ms over the seeds, so the true boundaries spread over 11-31 clients); the true
boundary is :func:`cleanslate.sim.model.true_capacity` of that server (its logged run factor);
the search is :func:`cleanslate.bench.find_max` with :class:`CapacitySearch` (start 8,
tolerance 10 %); then, on the same server, the climb studies make today: the levels 8, 16, 32,
..., 512 in turn, each judged the same way, stopping at the first that does not pass (its answer
is the highest level that passed). Configuration as ``tests/bench/test_find_max_sim.py``: tp 2,
a shared 16,000-token prefix and 64 fresh tokens per request, 32 output tokens, time scale 1, no
drift, no cold start, each probe one burst of c requests (duration 0.5 s).

*Within the tolerance*: the true boundary T lies in ``[capacity x 0.9, upper x 1.1]`` (the
bracket widened by the tolerance). The error is ``(found - T) / T``.

    python benchmarks/capacity.py [--seeds 10] [--json benchmarks/results/capacity.json]

Runs in private PID, network and mount namespaces (root; ``_isolate.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _isolate import ROOT, reexec_isolated
from cleanslate.bench import (
    BenchConfig,
    CapacitySearch,
    CapacitySLO,
    RandomWorkload,
)
from cleanslate.bench._capacity import CapacityResult, StopReason
from cleanslate.bench._find_max import find_max
from cleanslate.sim.model import SimModel, SimSettings, median_itl_ms, true_capacity

PREFIX, INPUT, OUTPUT = 16_000, 64, 32
TOLERANCE = 0.10
START = 8
FIXED_LEVELS = (8, 16, 32, 64, 128, 256, 512)
#: A probe sends for this long: every client sends once, and no request ends before it is over
#: (the first ends after its 16,000-token prefill and 31 decode steps: 0.6 s or more).
BURST_S = 0.5
FLAGS = ("--model", "sim", "--tp-size", "2", "--time-scale", "1", "--drift", "0",
         "--cold-start-steps", "0")


def limit_of(seed: int, seeds: int) -> float:
    """The seed's SLO: median ITL from 16 to 28 ms, evenly over the seeds."""
    return round(16.0 + 12.0 * (seed - 1) / max(1, seeds - 1), 2)


class FixedLevels(CapacitySearch):
    """Today's climb: the listed levels in turn, stopping at the first that does not pass."""

    def __init__(self, slo: CapacitySLO, levels: tuple[int, ...]) -> None:
        super().__init__("concurrency", slo, start=levels[0], max_load=levels[-1],
                         tolerance=TOLERANCE, max_probes=len(levels))
        self.levels = levels

    def next_load(self) -> float | None:
        if self._stopped is not None:
            return None
        if self.probes and not self.probes[-1].passed:
            self._stopped = StopReason.TOLERANCE
            return None
        if len(self.probes) == len(self.levels):
            self._stopped = StopReason.MAX_LOAD
            return None
        return float(self.levels[len(self.probes)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def within(truth: int, result: CapacityResult) -> bool:
    if result.capacity is None:
        return truth == 0
    high = float("inf") if result.upper is None else result.upper * (1 + TOLERANCE)
    return result.capacity * (1 - TOLERANCE) <= truth <= high


def one_seed(seed: int, seeds: int, tmp: str) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gpus = os.path.join(tmp, f"gpus-{seed}")
    os.makedirs(gpus)
    log_path = os.path.join(tmp, f"server-{seed}.log")
    env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": gpus,
           "CLEANSLATE_RUN": f"bench-capacity-{uuid.uuid4().hex[:8]}"}
    argv = [sys.executable, "-m", "cleanslate.sim", "serve", "--port", str(port), *FLAGS,
            "--noise-seed", str(seed)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(Path(log_path).read_text(errors="replace"))
            time.sleep(0.05)
        logged = re.search(r"run factor (\d+\.\d+)", Path(log_path).read_text())
        model = SimModel(SimSettings(tp_size=2, drift=0.0, cold_start_steps=0,
                                     noise_seed=seed))
        limit = limit_of(seed, seeds)
        truth = true_capacity(model, limit, PREFIX + INPUT, OUTPUT)
        slo = CapacitySLO(limits={"median_itl_ms": limit})
        config = BenchConfig(url=url, model="sim", workload=RandomWorkload(
            input_len=INPUT, output_len=OUTPUT, prefix_len=PREFIX), duration_s=BURST_S, seed=seed)
        t0 = time.monotonic()
        found = asyncio.run(find_max(config, CapacitySearch(
            "concurrency", slo, start=START, max_load=512, tolerance=TOLERANCE), warmup=4))
        search_s = time.monotonic() - t0
        t0 = time.monotonic()
        fixed = asyncio.run(find_max(config.model_copy(update={"seed": seed + 500}),
                                     FixedLevels(slo, FIXED_LEVELS)))
        fixed_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)

    def err(x: float | None) -> float | None:
        return None if x is None or truth == 0 else 100.0 * (x - truth) / truth

    return {
        "seed": seed, "limit_ms": limit, "run_factor": model.run_factor,
        "logged_run_factor": float(logged.group(1)) if logged else None,
        "truth": truth, "capacity": found.capacity, "upper": found.upper,
        "stopped_by": found.stopped_by.value, "probes": len(found.probes),
        "measurements": sum(p.measurements for p in found.probes),
        "requests": sum(p.requests for p in found.probes),
        "unresolved": list(found.unresolved), "crash": found.crash,
        "error_pct": err(found.capacity), "within": within(truth, found),
        "wall_s": search_s, "summary": found.summary(),
        "probe_loads": [p.load for p in found.probes],
        "probe_verdicts": [p.verdict.value for p in found.probes],
        # The model checked against the running sim: each probe's measured median ITL
        # against median_itl_ms of the same concurrency.
        "itl_measured_ms": [p.level.itl_ms.median if p.level else None
                            for p in found.probes + fixed.probes],
        "itl_model_ms": [median_itl_ms(model, int(p.load), PREFIX + INPUT, OUTPUT)
                         for p in found.probes + fixed.probes],
        "itl_loads": [p.load for p in found.probes + fixed.probes],
        "fixed_loads": [p.load for p in fixed.probes],
        "fixed_verdicts": [f"{p.verdict.value} {p.cause or ''} {p.detail or ''}".strip()
                           for p in fixed.probes],
        "fixed_capacity": fixed.capacity,
        # Probes that sent fewer requests than clients (the client could not send them all
        # in BURST_S: the batch was smaller than the probe's load).
        "short_probes": sum(p.requests < p.load for p in found.probes + fixed.probes),
        "fixed_probes": len(fixed.probes),
        "fixed_measurements": sum(p.measurements for p in fixed.probes),
        "fixed_error_pct": err(fixed.capacity), "fixed_wall_s": fixed_s,
    }


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| seed | SLO median ITL ms | run factor | true c | found c | bracket | within | "
           "error | probes (measurements) | wall s | fixed list c | its error | its probes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bracket = f"[{fmt(r['capacity'], '.0f')}, {fmt(r['upper'], '.0f')})"
        out.append(
            f"| {r['seed']} | {r['limit_ms']:g} | {r['run_factor']:.4f} | {r['truth']} | "
            f"{fmt(r['capacity'], '.0f')} | {bracket} | {'yes' if r['within'] else 'no'} | "
            f"{fmt(r['error_pct'], '+.1f')} % | {r['probes']} ({r['measurements']}) | "
            f"{r['wall_s']:.1f} | {fmt(r['fixed_capacity'], '.0f')} | "
            f"{fmt(r['fixed_error_pct'], '+.1f')} % | {r['fixed_probes']} |")
    return "\n".join(out)


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = sorted(m / p for r in rows for m, p in zip(r["itl_measured_ms"], r["itl_model_ms"],
                                                        strict=True) if m is not None)
    def mean_abs(key: str) -> float:
        vals = [abs(r[key]) for r in rows if r[key] is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    return {
        "within": sum(r["within"] for r in rows), "seeds": len(rows),
        "mean_abs_error_pct": mean_abs("error_pct"),
        "max_abs_error_pct": max((abs(r["error_pct"]) for r in rows
                                  if r["error_pct"] is not None), default=None),
        "fixed_mean_abs_error_pct": mean_abs("fixed_error_pct"),
        "mean_probes": sum(r["probes"] for r in rows) / len(rows),
        "mean_measurements": sum(r["measurements"] for r in rows) / len(rows),
        "fixed_mean_probes": sum(r["fixed_probes"] for r in rows) / len(rows),
        "mean_wall_s": sum(r["wall_s"] for r in rows) / len(rows),
        "fixed_mean_wall_s": sum(r["fixed_wall_s"] for r in rows) / len(rows),
        "short_probes": sum(r["short_probes"] for r in rows),
        "itl_ratio": ratios,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--json", default=None, help="write the result here (results.py passes "
                    "its own path and keeps it as benchmarks/results/capacity.json)")
    args = ap.parse_args()
    reexec_isolated("CLEANSLATE_BENCH_CAPACITY_ISOLATED", "benchmarks/capacity.py")
    load_before = os.getloadavg()
    t0 = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, args.seeds + 1):
            row = one_seed(seed, args.seeds, tmp)
            print(f"seed {seed}: truth c={row['truth']}; {row['summary']}; fixed list "
                  f"c={row['fixed_capacity']} ({row['fixed_probes']} probes)", flush=True)
            rows.append(row)
    total = totals(rows)
    print(table(rows))
    print(f"within the tolerance: {total['within']} of {total['seeds']}; mean |error| "
          f"{total['mean_abs_error_pct']:.1f} % (fixed list {total['fixed_mean_abs_error_pct']:.1f}"
          f" %); probes {total['mean_probes']:.1f} (fixed list {total['fixed_mean_probes']:.1f})"
          f"; probes that sent fewer requests than clients: {total['short_probes']}")
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip(),
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "cpus": os.cpu_count(), "wall_s": time.monotonic() - t0,
           "totals": total, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    ratios = total["itl_ratio"]
    if ratios:
        q = [ratios[int(f * (len(ratios) - 1))] for f in (0.0, 0.1, 0.5, 0.9, 1.0)]
        print(f"measured / model median ITL over {len(ratios)} probes: min {q[0]:.3f}, "
              f"p10 {q[1]:.3f}, median {q[2]:.3f}, p90 {q[3]:.3f}, max {q[4]:.3f}")
    print(f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
          + (f"; wrote {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
