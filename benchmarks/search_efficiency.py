"""How few trials each strategy needs to find the best configuration (issue: search efficiency).

The surface is the sim engine's performance model (``cleanslate.sim.model``, the same model the
running sim steps through), evaluated in steady state so that thousands of trials take seconds:
for a configuration of the quick-start space (memory fraction x CUDA graphs x
max-running-requests x chunked-prefill size, 120 configurations) the levels (concurrency 32,
128, 256) climb until the first crash (CUDA graphs above ``cuda-graph-max-bs``) or mean TTFT
above the SLO (8 s), and a trial's value is its best level's output tokens/s, as in
``cleanslate tune`` (``cleanslate.sim.model.steady_value``). Every measurement carries the
sim's run-to-run noise (log-normal, sigma 2 %, ``--noise``), so a strategy can be fooled by a
lucky run as it would on a real server.

The optimum is the full grid's best true value. For each strategy and seed, the trials needed
are the first trial after which the configuration the strategy would report (the best one it
measured) is within 2 % of the optimum in true value; a seed that never gets there counts as
more than the strategy's trials (``> 120``). ``tpe`` and ``random`` are the samplers
``cleanslate tune`` uses (``cleanslate.tune.space.make_sampler``, with its constraints and
startup trials; the baseline first); the ablation runs its plan in order; the grid runs its
120 in order, baseline first.

    python benchmarks/search_efficiency.py [--seeds 30] [--within 0.02] [--noise 0.02]
                                           [--json out.json]

Prints a Markdown table: median and worst trials per strategy, the median as a share of the
grid, and whether the target (tpe median at most 25 % of the grid) is met. ``--json`` writes
the same: ``rows`` (strategy, median, worst, share, not_reached; a count is ``"> N"`` where
seeds never got there within the strategy's N trials) and ``target_met``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
import warnings
from typing import Any

import optuna

from cleanslate.sim.model import (
    QUICKSTART_CONCURRENCY,
    QUICKSTART_FIXED,
    QUICKSTART_SPACE,
    QUICKSTART_TTFT_SLO_S,
    QUICKSTART_WORKLOAD,
    steady_value,
)
from cleanslate.tune.space import make_sampler, mark_feasible, planned_configs
from cleanslate.tune.study import StudySpec

TTFT_SLO_S = QUICKSTART_TTFT_SLO_S  # mean TTFT, as the steady-state estimate gives it
TARGET_SHARE = 0.25
BASELINE = {"mem-fraction-static": 0.88, "disable-cuda-graph": True,
            "max-running-requests": 128, "chunked-prefill-size": 4096}


def true_value(config: dict[str, Any]) -> float | None:
    """Best feasible level's output tokens/s, or ``None`` when no level is feasible."""
    return steady_value({**QUICKSTART_FIXED, **config}, QUICKSTART_CONCURRENCY, TTFT_SLO_S)


def _count(value: float, cap: int) -> str:
    """A trial count for the table: ``> cap`` when the strategy never got there."""
    return f"{value:g}" if math.isfinite(value) else f"> {cap}"


def _json_count(value: float, cap: int) -> int | float | str:
    """A trial count for JSON: a number, or ``"> cap"`` when some seed never got there."""
    if not math.isfinite(value):
        return f"> {cap}"
    return int(value) if value == int(value) else value


def key(config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))


def spec_for(strategy: str, seed: int) -> StudySpec:
    return StudySpec.model_validate({
        "name": f"efficiency-{strategy}-{seed}", "engine": "sim", "model": "sim",
        "fixed": QUICKSTART_FIXED, "space": QUICKSTART_SPACE, "baseline": BASELINE,
        "strategy": strategy, "workload": QUICKSTART_WORKLOAD,
        "concurrency": QUICKSTART_CONCURRENCY, "seed": seed,
        "budget": {"trials": 120}})


class Run:
    """One strategy's trials for one seed: what it measured and when it got close enough."""

    def __init__(self, truth: dict[tuple[tuple[str, str], ...], float | None], optimum: float,
                 within: float, seed: int, noise: float) -> None:
        self.truth = truth
        self.noise = noise
        self.target = optimum * (1 - within)
        self.rng = random.Random(seed * 7919 + 1)
        self.best_seen: tuple[float, float] | None = None  # (measured, true) of the best
        self.trials = 0
        self.reached: int | None = None
        # Where the trials went: on configurations that do not start or score nothing, on
        # configurations measured before, and when a close one was first measured.
        self.infeasible = 0
        self.repeats = 0
        self.first_close: int | None = None
        self._seen: set[tuple[tuple[str, str], ...]] = set()

    def measure(self, config: dict[str, Any]) -> float | None:
        self.trials += 1
        k = key(config)
        self.repeats += k in self._seen
        self._seen.add(k)
        value = self.truth[k]
        if value is None:
            self.infeasible += 1
            return None
        if self.first_close is None and value >= self.target:
            self.first_close = self.trials
        measured = value * math.exp(self.rng.gauss(0.0, self.noise))
        if self.best_seen is None or measured > self.best_seen[0]:
            self.best_seen = (measured, value)
        if self.reached is None and self.best_seen[1] >= self.target:
            self.reached = self.trials
        return measured


def run_sampler(strategy: str, seed: int, run: Run, limit: int) -> None:
    spec = spec_for(strategy, seed)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(spec))
    from cleanslate.tune.space import distributions

    dists = distributions(spec)
    study.enqueue_trial(dict(BASELINE))  # the baseline is a sampler's first trial, as in tune
    while run.reached is None and run.trials < limit:
        trial = study.ask(dists)
        measured = run.measure(dict(trial.params))
        mark_feasible(trial, measured is not None)
        study.tell(trial, measured if measured is not None else 0.0)


def run_plan(strategy: str, seed: int, run: Run) -> int:
    plan = planned_configs(spec_for(strategy, seed)) or []
    for config in plan:
        run.measure(config)
        if run.reached is not None:
            break
    return len(plan)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--within", type=float, default=0.02)
    parser.add_argument("--noise", type=float, default=0.02,
                        help="sigma of the log-normal noise of a measurement (0: none)")
    parser.add_argument("--json", default=None,
                        help="also write the table here: rows (strategy, median, worst, share) "
                             "and target_met")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    t0 = time.monotonic()
    grid = planned_configs(spec_for("grid", 0)) or []
    truth = {key(c): true_value(c) for c in grid}
    feasible = {k: v for k, v in truth.items() if v is not None}
    optimum_key = max(feasible, key=lambda k: feasible[k] or 0.0)
    optimum = feasible[optimum_key]
    optimum_config = next(c for c in grid if key(c) == optimum_key)
    close = sum(1 for v in feasible.values() if v >= optimum * (1 - args.within))
    print(f"noise sigma {args.noise:.0%}; surface: {len(grid)} configurations, "
          f"{len(feasible)} feasible, optimum {optimum:.0f} tok/s at {optimum_config}; "
          f"{close} configuration(s) within {args.within:.0%} of it\n")
    results: dict[str, list[int | None]] = {}
    profiles: dict[str, list[Run]] = {}
    plan_sizes: dict[str, int] = {}
    for strategy in ("tpe", "random", "ablation", "grid"):
        results[strategy] = []
        profiles[strategy] = []
        for seed in range(args.seeds):
            run = Run(truth, optimum, args.within, seed, args.noise)
            if strategy in ("tpe", "random"):
                run_sampler(strategy, seed, run, limit=len(grid))
            else:
                plan_sizes[strategy] = run_plan(strategy, seed, run)
            results[strategy].append(run.reached)
            profiles[strategy].append(run)
    print(f"| strategy | median trials | worst | median / grid ({len(grid)}) | not reached |")
    print("|---|---|---|---|---|")
    rows: list[dict[str, Any]] = []
    for strategy, reached in results.items():
        cap = plan_sizes.get(strategy, len(grid))
        # A seed that never got within reach counts as more than the cap (never as a success).
        ordered = sorted(r if r is not None else math.inf for r in reached)
        median = statistics.median(ordered)
        worst = ordered[-1]
        missing = sum(1 for r in reached if r is None)
        share = median / len(grid) if math.isfinite(median) else None
        print(f"| {strategy} | {_count(median, cap)} | {_count(worst, cap)} | "
              f"{f'{share:.0%}' if share is not None else '-'} | {missing} of {len(reached)} |")
        runs = profiles[strategy]
        first = statistics.median(r.first_close or math.inf for r in runs)
        profile = {"infeasible": statistics.median(r.infeasible for r in runs),
                   "repeats": statistics.median(r.repeats for r in runs),
                   "first_close": _json_count(first, cap)}
        rows.append({"strategy": strategy, "median": _json_count(median, cap),
                     "worst": _json_count(worst, cap), "share": share,
                     "not_reached": missing, "cap": cap, "reached": reached,
                     "profile": profile})
    print("\nWhere the trials went (medians over seeds, up to the trial that got close or the "
          "cap): trials on configurations that do not start or meet no level; trials repeating "
          "a configuration already measured; the trial that first measured a configuration "
          "within reach (the noise can make a strategy report another one as its best)\n")
    print("| strategy | infeasible | repeats | first measured within reach |")
    print("|---|---|---|---|")
    for row in rows:
        prof = row["profile"]
        print(f"| {row['strategy']} | {prof['infeasible']:g} | {prof['repeats']:g} | "
              f"{prof['first_close']} |")
    tpe = next(r for r in rows if r["strategy"] == "tpe")
    target_met = (isinstance(tpe["median"], (int, float))
                  and tpe["median"] <= TARGET_SHARE * len(grid))
    print(f"\ntarget (tpe median <= {TARGET_SHARE:.0%} of the grid's {len(grid)} trials): "
          f"{'met' if target_met else 'not met'}; {time.monotonic() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "search_efficiency", "rows": rows, "target_met": target_met,
                       "target": f"tpe median <= {TARGET_SHARE:.0%} of the grid",
                       "grid": len(grid), "optimum": optimum,
                       "optimum_config": optimum_config,
                       "close": close, "seeds": args.seeds, "within": args.within,
                       "noise": args.noise, "ttft_slo_s": TTFT_SLO_S,
                       "concurrency": QUICKSTART_CONCURRENCY}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
