"""What the spread's prior (``tune.race.noise_prior``) buys and costs in one race.

A race compares a challenger with the incumbent in pairs (``stats.compare_paired``, as
``tune.race.Racer`` calls it through ``tune.race.compare``): a pair's log ratio is the true
ratio's log plus two independent restart factors, ``N(0, cv)`` each. The race looks after every
pair from the second, up to ``--max-pairs`` (5, the default ``max_replicates``), and ends at
the first outcome. Each cell runs ``--races`` races (seeded: the same draws for both rows) with
and without the prior, at the true restart noise ``cv`` and the true ratio ``ratio``:

- at ratio 1.00 a **win** or **loss** is a false difference (the error the Bonferroni split
  holds near 5 % in all);
- at ratios beyond the tie margin a **tie** is a false tie, and a **loss** the worst error;
- **pairs** is the mean number of pairs a race took (each pair is two launches).

The prior counts ``PRIOR_DF`` degrees of freedom at ``SPREAD_PRIOR_CV`` (2.4 %, the H200's
restart noise): where the true noise is near it, it decides sooner and errs less; where the
true noise is well above it, the first races' spread is taken too narrow until the study's
own races outweigh it, and this benchmark says by how much.

    python benchmarks/race_prior.py [--races 4000] [--cvs 0.02,0.024,0.035,0.05,0.07]
                                    [--ratios 1.0,1.03,1.06,1.1,1.25] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from typing import Any

from cleanslate.stats import Outcome, compare_paired, wilson
from cleanslate.tune.race import PRIOR_DF, SPREAD_PRIOR_CV, noise_prior

TIE_MARGIN = 0.05
CONFIDENCE = 0.95


def one_race(ratio: float, cv: float, prior: tuple[float, int] | None, rng: random.Random,
             max_pairs: int) -> tuple[str, int]:
    """One race's outcome and the pairs it took."""
    base: list[float] = []
    other: list[float] = []
    for n in range(1, max_pairs + 1):
        base.append(math.exp(rng.gauss(0.0, cv)))
        other.append(ratio * math.exp(rng.gauss(0.0, cv)))
        if n < 2:
            continue
        found = compare_paired(base, other, tie_margin=TIE_MARGIN, confidence=CONFIDENCE,
                               max_pairs=max_pairs, prior=prior)
        if found.outcome is not None:
            return str(found.outcome), n
    return str(Outcome.UNDECIDED), max_pairs


def cell(ratio: float, cv: float, prior: tuple[float, int] | None, races: int,
         max_pairs: int) -> dict[str, Any]:
    rng = random.Random(f"{ratio}:{cv}")
    counts = {str(o): 0 for o in (Outcome.WIN, Outcome.TIE, Outcome.LOSS, Outcome.UNDECIDED)}
    pairs = 0
    for _ in range(races):
        outcome, used = one_race(ratio, cv, prior, rng, max_pairs)
        counts[outcome] += 1
        pairs += used
    wrong = counts["win"] + counts["loss"] if ratio == 1.0 else (
        counts["tie"] + counts["loss"] if ratio > 1 + TIE_MARGIN else counts["loss"])
    low, high = wilson(wrong, races)
    return {"ratio": ratio, "cv": cv, "prior": prior is not None, "races": races, **counts,
            "pairs": pairs / races, "wrong": wrong, "wrong_low": low, "wrong_high": high}


def wrong_name(ratio: float) -> str:
    if ratio == 1.0:
        return "false difference"
    return "false tie or loss" if ratio > 1 + TIE_MARGIN else "loss"


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| noise cv | true ratio | prior | win | tie | loss | undecided | pairs | wrong |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["races"]

        def share(key: str, races: int = n, row: dict[str, Any] = r) -> str:
            return f"{row[key] / races * 100:.1f} %"

        out.append(
            f"| {r['cv'] * 100:.1f} % | {r['ratio']:.2f} | {'yes' if r['prior'] else 'no'} | "
            f"{share('win')} | {share('tie')} | {share('loss')} | {share('undecided')} | "
            f"{r['pairs']:.2f} | {wrong_name(r['ratio'])} {r['wrong'] / n * 100:.1f} % "
            f"[{r['wrong_low'] * 100:.1f}, {r['wrong_high'] * 100:.1f}] |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--races", type=int, default=4000)
    parser.add_argument("--cvs", default="0.02,0.024,0.035,0.05,0.07")
    parser.add_argument("--ratios", default="1.0,1.03,1.06,1.1,1.25")
    parser.add_argument("--max-pairs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        cvs = [float(x) for x in args.cvs.split(",")]
        ratios = [float(x) for x in args.ratios.split(",")]
    except ValueError:
        print("race_prior.py: --cvs and --ratios are comma-separated numbers", file=sys.stderr)
        return 2
    if args.races < 1 or args.max_pairs < 2 or any(c <= 0 for c in cvs) \
            or any(r < 1 for r in ratios):
        print("race_prior.py: --races at least 1, --max-pairs at least 2, positive --cvs, "
              "--ratios at least 1 (the challenger as fast as the incumbent or faster: what is "
              "wrong is named for that)", file=sys.stderr)
        return 2
    started = time.monotonic()
    rows = [cell(ratio, cv, prior, args.races, args.max_pairs)
            for cv in cvs for ratio in ratios for prior in (None, noise_prior())]
    lines = [f"`python benchmarks/race_prior.py --races {args.races}`: one race of up to "
             f"{args.max_pairs} pairs, tie margin {TIE_MARGIN:.0%}, confidence "
             f"{CONFIDENCE:.0%}; the prior {PRIOR_DF} degrees of freedom at "
             f"{SPREAD_PRIOR_CV * 100:.1f} % per measurement. Wrong: the share of races that "
             "ended in the error named, with its Wilson 95 % interval.", "", *table(rows)]
    elapsed = time.monotonic() - started
    print("\n".join(lines))
    print(f"({elapsed:.1f} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "race_prior", "races": args.races, "max_pairs":
                       args.max_pairs, "tie_margin": TIE_MARGIN, "confidence": CONFIDENCE,
                       "prior_df": PRIOR_DF, "spread_prior_cv": SPREAD_PRIOR_CV,
                       "rows": rows, "seconds": round(elapsed, 1)}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
