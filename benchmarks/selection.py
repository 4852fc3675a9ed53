"""Which configuration a study reports as its best, single-shot against noise-aware (issue 24).

The surface is the sim engine's performance model in steady state
(``cleanslate.sim.model.steady_value``, as ``benchmarks/search_efficiency.py`` uses it): a
configuration's *true value* is its best level's output tokens/s, the levels climbing until the
first crash or a mean TTFT above 8 s. Every measurement is a whole cycle on a new server and
carries the restart-to-restart noise measured on the H200 (``docs/sim-model.md``, "Noise"): the
true value times ``exp(N(0, sigma))``, sigma 0.02 by default (``--noise``), drawn independently
per measurement from ``(seed, trial, measurement index)``, so that every policy sees the same
first measurements (the policies are compared in pairs). The sim's cold first level is left out:
studies warm each server up before the first measured level.

Surfaces: ``ablation``, the quick start as it runs (``examples/quickstart.yaml``: 7 trials, the
baseline first), the target surface; ``grid``, the full grid of the same space (24 trials);
``space``, the 120-configuration grid of ``QUICKSTART_SPACE`` (``--surfaces`` picks).

Policies, each run on every surface for every seed (``--seeds``, at least 30 for the table):

- ``single-shot`` (``replicates: 1``, today): each configuration once; the best is the highest
  value, with no tie set.
- ``auto`` (``replicates: auto``): the product's racing code, :class:`cleanslate.tune.race.Racer`,
  with an in-memory store (``load``/``save`` over a dict of ``TrialRecord``) and a ``measure``
  callback that returns a ``Replicate`` of the true value times the noise; the trials run in
  the plan's order, each raced against the incumbent when its first measurement is within the
  noise, and :func:`cleanslate.tune.race.tie_set` gives the result.
- ``replicates-3`` (``replicates: 3``): every configuration three times (``Racer.repeat``), the
  comparisons with the best made at the end by ``tie_set``.

Metrics, per policy (rates with Wilson 95 % intervals, ``cleanslate.stats.wilson``):

- **wrong winner**: the share of studies whose reported best is more than 1 % below the best
  true value among the configurations the study measured, and is not declared *tied* with a
  configuration of that best true value (``undecided`` does not count as tied).
- **false difference**: configurations are *truly equal* when their true values are the same
  (relative difference below 1e-9: on this surface, flags that cannot matter, such as a memory
  fraction whose batch is capped by ``max-running-requests``). For each study, every truly
  equal pair that contains the reported best is counted once; the study *declares a difference*
  for that pair unless the other member is in the best's ``tied`` or ``undecided`` set: either
  explicitly (a race lost) or *silently* (never compared with the best, so the report ranks it
  below the best with nothing said; the table counts these as ``silent``). A
  single-shot study never declares a tie, so each such pair counts as a difference (its best is
  ranked strictly above a configuration of the same speed): that is the definition, not a
  measurement of chance. The rate pools pairs over seeds (pairs of one study are not
  independent: read the interval as approximate). ``race false difference`` is the same share
  over every race the study ran between truly equal configurations that ended win or loss.
- **GPU-seconds per study**: each measurement costs one cycle, modelled from
  ``benchmarks/RESULTS.md`` ("Tool overhead per trial", the quick start on this machine):
  a cycle that starts costs ``--overhead-s`` (6.4 s: the median benchmarked trial's 12.4 s
  less its three 2 s levels) plus ``--level-s`` (2 s) per level run (the failing level counts
  whole), one that does not start ``--not-started-s`` (1.6 s); one GPU. A replicate is a new
  cycle that climbs the levels, as the first measurement did, up to the highest one that could
  be the configuration's best (it met the SLO within ``tune.trial.NEAR_BEST``, 10 %, of the best
  level's value; ``tune.trial.run_replicate``): ``--overhead-s`` plus those levels
  (``--replicate-levels all``: every level the first measurement ran, its failing one too).

Targets, on the ``ablation`` surface for ``auto``: wrong winner at most 5 %, false difference
at most 5 %, GPU-seconds at most 2x single-shot's. "met" compares the point estimate; the
table also says whether the interval's upper end is below the target.

``--sweep`` varies Racer's knobs one at a time (``PRIOR_CV``, ``BAND_SDS``, the spread's prior
``PRIOR_DF`` (0: none) and ``SPREAD_PRIOR_CV``, ``max_replicates``, ``tie_margin``, and the
Bonferroni split of ``stats.compare_paired`` turned off: every look at
the full error rate) and prints what each moves, on the ablation and grid surfaces.

    python benchmarks/selection.py [--seeds 30] [--noise 0.02] [--surfaces ablation,grid]
                                   [--sweep] [--sweep-seeds N] [--replicate-levels best]
                                   [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cleanslate import stats as cs_stats
from cleanslate.sim.model import (
    QUICKSTART_FIXED,
    QUICKSTART_SPACE,
    QUICKSTART_TTFT_SLO_S,
    QUICKSTART_WORKLOAD,
    SimModel,
    settings_from_flags,
    steady_value,
)
from cleanslate.stats import Comparison, Outcome, wilson
from cleanslate.store._trials import Replicate, TrialRecord, TrialStatus
from cleanslate.tune import race as race_mod
from cleanslate.tune.race import Racer, tie_set
from cleanslate.tune.space import planned_configs
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import NEAR_BEST

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "examples" / "quickstart.yaml"

#: Cycle costs of the quick start on this machine (RESULTS.md, "Tool overhead per trial"):
#: a benchmarked trial 12.4 s in the median, three levels of 2 s; one that did not start 1.6 s.
OVERHEAD_S = 12.405 - 3 * 2.0
LEVEL_S = 2.0
NOT_STARTED_S = 1.575

WITHIN = 0.01  # a reported best within 1 % of the true best is not a wrong winner
EQUAL = 1e-9  # true values closer than this (relative) are truly equal
TARGET_WRONG = 0.05
TARGET_FALSE_DIFF = 0.05
TARGET_COST = 2.0
SLOT = "slot-0"

POLICIES: dict[str, dict[str, Any]] = {
    "single-shot": {"replicates": 1},
    "auto": {"replicates": "auto"},
    "replicates-3": {"replicates": 3},
}


@dataclass(frozen=True)
class Surface:
    """A study's plan on the steady-state surface: each planned configuration's true value
    (``None``: does not start or meets no level) and the cost of one cycle of it."""

    name: str
    spec: StudySpec
    plan: list[dict[str, Any]]
    truth: list[float | None]
    cost_s: list[float]
    replicate_s: list[float]

    @property
    def optimum(self) -> float:
        return max(v for v in self.truth if v is not None)

    def equal_pairs(self) -> list[tuple[int, int]]:
        out = []
        for i, a in enumerate(self.truth):
            for j in range(i + 1, len(self.truth)):
                b = self.truth[j]
                if a is not None and b is not None and abs(a / b - 1) < EQUAL:
                    out.append((i, j))
        return out


def levels_run(flags: dict[str, Any], concurrency: list[int], slo_s: float) -> int:
    """How many levels a trial of ``flags`` runs before it stops (the level that crashes or
    misses the SLO included), as :func:`cleanslate.sim.model.steady_value` climbs them; 0 when
    the server does not start."""
    model = SimModel(settings_from_flags(flags))
    plan = model.memory_plan()
    if plan.oom_at_start or plan.not_enough_for_kv:
        return 0
    work = QUICKSTART_WORKLOAD
    ran = 0
    for level in sorted(concurrency):
        ran += 1
        est = model.estimate(level, int(work["input_len"]), int(work["output_len"]))
        if est["batch"] <= 0 or model.crashes_at_batch(int(est["batch"])):
            break
        if est["ttft_s"] > slo_s:
            break
    return ran


def levels_near_best(flags: dict[str, Any], concurrency: list[int], slo_s: float) -> int:
    """How many levels a replicate of ``flags`` runs: it climbs the ladder, as the first
    measurement did, up to the highest level that met the SLO with a value within
    ``tune.trial.NEAR_BEST`` of the best level's (``tune.trial.run_replicate``); at least one."""
    model = SimModel(settings_from_flags(flags))
    work = QUICKSTART_WORKLOAD
    passed: list[float] = []
    for level in sorted(concurrency):
        est = model.estimate(level, int(work["input_len"]), int(work["output_len"]))
        if est["batch"] <= 0 or model.crashes_at_batch(int(est["batch"])):
            break
        if est["ttft_s"] > slo_s:
            break
        passed.append(est["output_throughput"])
    if not passed:
        return 1
    top = max(passed)
    return 1 + max(i for i, v in enumerate(passed) if v >= top * (1 - NEAR_BEST))


def make_surface(name: str, spec: StudySpec, overhead_s: float, level_s: float,
                 not_started_s: float, replicate_levels: str = "best") -> Surface:
    plan = planned_configs(spec) or []
    truth, cost, again = [], [], []
    for config in plan:
        flags = {**spec.fixed, **config}
        truth.append(steady_value(flags, spec.concurrency, QUICKSTART_TTFT_SLO_S))
        n = levels_run(flags, spec.concurrency, QUICKSTART_TTFT_SLO_S)
        cost.append(not_started_s if n == 0 else overhead_s + level_s * n)
        near = levels_near_best(flags, spec.concurrency, QUICKSTART_TTFT_SLO_S)
        again.append(overhead_s + level_s * (near if replicate_levels == "best" else n))
    return Surface(name=name, spec=spec, plan=plan, truth=truth, cost_s=cost, replicate_s=again)


def surfaces(names: list[str], overhead_s: float, level_s: float,
             not_started_s: float, replicate_levels: str = "best",
             quickstart: Path = QUICKSTART) -> list[Surface]:
    """The surfaces named, from the quick start's study file (its levels, SLO and
    ``statistics:`` too; a policy's ``replicates`` replaces the file's)."""
    quick = yaml.safe_load(quickstart.read_text())
    quick.pop("time-scale", None)
    out = []
    for name in names:
        if name == "ablation":
            data = dict(quick)
        elif name == "grid":
            data = {**quick, "strategy": "grid"}
        elif name == "space":
            data = {**quick, "fixed": QUICKSTART_FIXED, "space": QUICKSTART_SPACE,
                    "strategy": "grid", "baseline": {}}
        else:
            raise SystemExit(f"selection.py: --surfaces: unknown surface {name!r} "
                             "(ablation, grid, space)")
        spec = StudySpec.model_validate({**data, "name": f"selection-{name}"})
        out.append(make_surface(name, spec, overhead_s, level_s, not_started_s,
                                replicate_levels))
    return out


def noise(seed: int, number: int, index: int, sigma: float) -> float:
    """The restart factor of measurement ``index`` of trial ``number`` in study ``seed``."""
    return math.exp(random.Random(f"{seed}:{number}:{index}").gauss(0.0, sigma))


@dataclass
class Study:
    """One study's outcome under one policy."""

    best: int | None
    tied: tuple[int, ...]
    undecided: tuple[int, ...]
    measurements: int
    gpu_s: float
    races: list[tuple[int, int, str]]  # (challenger, against, outcome)
    wrong: bool
    pairs: int  # truly equal pairs containing the best
    pairs_different: int
    pairs_silent: int  # of those, the other is in no set of the tie set (never compared)
    pairs_after_check: int  # still different if the best were compared with it by seed
    race_pairs: int  # races between truly equal configurations
    race_different: int


async def _run(surface: Surface, spec: StudySpec, seed: int, sigma: float) -> Study:
    store: dict[int, TrialRecord] = {}
    count = {"n": 0}

    def load(number: int) -> TrialRecord | None:
        return store.get(number)

    def save(trial: TrialRecord) -> TrialRecord:
        store[trial.number] = trial
        return trial

    async def measure(trial: TrialRecord, rep_seed: int, pair: int,
                      against: int | None) -> Replicate:
        latest = store.get(trial.number, trial)
        index = len(latest.replicates)
        true = surface.truth[trial.number]
        assert true is not None  # only feasible trials are measured again
        count["n"] += 1
        return Replicate(index=index, seed=rep_seed, status=TrialStatus.FEASIBLE,
                         value=true * noise(seed, trial.number, index, sigma), slot=SLOT,
                         pair=pair, against=against,
                         gpu_s=surface.replicate_s[trial.number])

    racer = Racer(spec, load=load, save=save, measure=measure, trials=lambda: list(store.values()))
    stats = spec.statistics
    for number, config in enumerate(surface.plan):
        true = surface.truth[number]
        count["n"] += 1
        if true is None:
            record = TrialRecord(study=spec.name, number=number, params=config,
                                 status=TrialStatus.INFEASIBLE, cause="no level",
                                 gpu_s=surface.cost_s[number], slot=SLOT)
        else:
            record = TrialRecord(study=spec.name, number=number, params=config,
                                 status=TrialStatus.FEASIBLE,
                                 value=true * noise(seed, number, 0, sigma),
                                 gpu_s=surface.cost_s[number], slot=SLOT)
        save(record)
        if true is None:
            continue
        if stats.racing:
            await racer.race(record, SLOT)
        elif stats.fixed_count() > 1:
            await racer.repeat(record)
    trials = list(store.values())
    result = tie_set(trials, spec)
    return judge(surface, spec, result, trials, count["n"])


def judge(surface: Surface, spec: StudySpec, result: race_mod.TieSet,
          trials: list[TrialRecord], measurements: int) -> Study:
    truth = surface.truth
    optimum = surface.optimum
    best = result.best.number if result.best is not None else None
    tied = set(result.tied)
    undecided = set(result.undecided)
    at_optimum = {i for i, v in enumerate(truth) if v is not None and abs(v / optimum - 1)
                  < EQUAL}
    wrong = True
    if best is not None:
        close = (truth[best] or 0.0) >= optimum * (1 - WITHIN)
        wrong = not close and not (tied & at_optimum)
    pairs = different = silent = after = 0
    beaten = set(result.beaten)
    by_number = {t.number: t for t in trials}
    pooled = race_mod.pooled_noise(trials)
    equal = surface.equal_pairs()
    for i, j in equal:
        if best not in (i, j):
            continue
        other = j if best == i else i
        pairs += 1
        if other not in tied and other not in undecided:
            different += 1
            silent += other not in beaten
            if other in beaten or best is None:
                after += 1
                continue
            # Not the product: what a final comparison by seed with the best would say.
            found = race_mod.compare(by_number[best], by_number[other], spec, pooled, SLOT)
            after += found is None or found.pairs < 2 or found.outcome in (Outcome.WIN,
                                                                            Outcome.LOSS)
    equal_set = set(equal)
    races = []
    race_pairs = race_different = 0
    for t in trials:
        for r in t.races:
            races.append((t.number, r.against, r.outcome))
            key = (min(t.number, r.against), max(t.number, r.against))
            if key in equal_set:
                race_pairs += 1
                race_different += r.outcome in (Outcome.WIN, Outcome.LOSS)
    return Study(best=best, tied=tuple(sorted(tied)), undecided=tuple(sorted(undecided)),
                 measurements=measurements, gpu_s=result.total_gpu_s, races=races, wrong=wrong,
                 pairs=pairs, pairs_different=different, pairs_silent=silent,
                 pairs_after_check=after,
                 race_pairs=race_pairs,
                 race_different=race_different)


def run_policy(surface: Surface, statistics_: dict[str, Any], seeds: int,
               sigma: float) -> list[Study]:
    spec = surface.spec.model_copy(update={
        "statistics": surface.spec.statistics.model_validate(
            {**surface.spec.statistics.model_dump(), **statistics_})})
    return [asyncio.run(_run(surface, spec, seed, sigma)) for seed in range(seeds)]


def _rate(k: int, n: int) -> dict[str, Any]:
    low, high = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "low": low, "high": high}


def summarize(studies: list[Study], single_cost: float | None) -> dict[str, Any]:
    cost = [s.gpu_s for s in studies]
    ci = cs_stats.t_interval(cost)
    mean_cost = ci.mean
    return {
        "wrong": _rate(sum(s.wrong for s in studies), len(studies)),
        "false_difference": _rate(sum(s.pairs_different for s in studies),
                                  sum(s.pairs for s in studies)),
        "false_difference_silent": sum(s.pairs_silent for s in studies),
        "false_difference_after_check": _rate(sum(s.pairs_after_check for s in studies),
                                              sum(s.pairs for s in studies)),
        "race_false_difference": _rate(sum(s.race_different for s in studies),
                                       sum(s.race_pairs for s in studies)),
        "gpu_s": mean_cost, "gpu_s_low": ci.low, "gpu_s_high": ci.high,
        "cost_ratio": mean_cost / single_cost if single_cost else 1.0,
        "measurements": statistics.mean(s.measurements for s in studies),
        "races": statistics.mean(len(s.races) for s in studies),
        "tied": statistics.mean(len(s.tied) for s in studies),
        "undecided": statistics.mean(len(s.undecided) for s in studies),
        "bests": sorted({s.best for s in studies if s.best is not None}),
    }


def evaluate(surface: Surface, policies: dict[str, dict[str, Any]], seeds: int,
             sigma: float) -> list[dict[str, Any]]:
    rows = []
    single: float | None = None
    for name, stats in policies.items():
        studies = run_policy(surface, stats, seeds, sigma)
        if name == "single-shot":
            single = statistics.mean(s.gpu_s for s in studies)
        rows.append({"policy": name, "statistics": stats, **summarize(studies, single)})
    return rows


# --- knobs ------------------------------------------------------------------------------------


@contextmanager
def knob(name: str, value: Any) -> Iterator[None]:
    """Set one of Racer's module-level knobs for the block (``bonferroni`` False: every look of
    a race at the full error rate)."""
    if name == "bonferroni":
        original: Callable[..., Comparison] = getattr(race_mod, "compare_paired")  # noqa: B009

        def unsplit(base: Any, other: Any, **kw: Any) -> Comparison:
            # compare_paired spends (1 - confidence) / (max_pairs - 1) per look: asking for a
            # confidence that much lower gives every look the whole error rate, and leaves the
            # rest (ties, the last pair, stopping for futility) as it is.
            looks = max(1, int(kw.get("max_pairs", 5)) - 1)
            kw["confidence"] = max(0.5, 1 - (1 - float(kw.get("confidence", 0.95))) * looks)
            return original(base, other, **kw)

        setattr(race_mod, "compare_paired", unsplit)  # noqa: B010
        try:
            yield
        finally:
            setattr(race_mod, "compare_paired", original)  # noqa: B010
        return
    old = getattr(race_mod, name)
    setattr(race_mod, name, value)
    try:
        yield
    finally:
        setattr(race_mod, name, old)


#: (knob, value shown, the study's statistics, a module knob of race.py and its value).
SWEEP: list[tuple[str, str, dict[str, Any], str, Any]] = [
    ("default", "-", {}, "", None),
    ("PRIOR_CV", "0.02", {}, "PRIOR_CV", 0.02),
    ("PRIOR_CV", "0.05", {}, "PRIOR_CV", 0.05),
    ("PRIOR_DF (the spread's prior)", "0", {}, "PRIOR_DF", 0),
    ("PRIOR_DF (the spread's prior)", "4", {}, "PRIOR_DF", 4),
    ("SPREAD_PRIOR_CV", "0.03", {}, "SPREAD_PRIOR_CV", 0.03),
    ("BAND_SDS", "1", {}, "BAND_SDS", 1.0),
    ("BAND_SDS", "3", {}, "BAND_SDS", 3.0),
    ("max_replicates", "3", {"max_replicates": 3}, "", None),
    ("max_replicates", "8", {"max_replicates": 8}, "", None),
    ("tie_margin", "0.02", {"tie_margin": 0.02}, "", None),
    ("tie_margin", "0.05", {"tie_margin": 0.05}, "", None),
    ("Bonferroni split", "off", {}, "bonferroni", False),
    ("tie_margin, max_replicates", "0.05, 3", {"tie_margin": 0.05, "max_replicates": 3}, "",
     None),
    ("confidence", "0.9", {"confidence": 0.9}, "", None),
]


def sweep(surfaces_: list[Surface], seeds: int, sigma: float) -> list[dict[str, Any]]:
    out = []
    for label, shown, update, name, value in SWEEP:
        for surface in surfaces_:
            single = statistics.mean(
                s.gpu_s for s in run_policy(surface, POLICIES["single-shot"], seeds, sigma))
            stats: dict[str, Any] = {"replicates": "auto", **update}
            if name:
                with knob(name, value):
                    studies = run_policy(surface, stats, seeds, sigma)
            else:
                studies = run_policy(surface, stats, seeds, sigma)
            out.append({"knob": label, "value": shown, "surface": surface.name,
                        **summarize(studies, single)})
    return out


# --- output -----------------------------------------------------------------------------------


def _pct(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "- (no pair)"
    return (f"{r['rate'] * 100:.1f} % [{r['low'] * 100:.1f}, {r['high'] * 100:.1f}] "
            f"({r['k']}/{r['n']})")


def _fd(row: dict[str, Any]) -> str:
    """The false difference, with how many of its pairs were never compared (silent)."""
    text = _pct(row["false_difference"])
    silent = row.get("false_difference_silent", 0)
    return f"{text}, {silent} silent" if row["false_difference"]["n"] else text


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| surface | policy | wrong winner | false difference | race false difference "
             "| GPU-s per study | x single-shot | measurements | tied with the best "
             "| undecided |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cost = f"{r['gpu_s']:.1f}"
        if r.get("gpu_s_low") is not None:
            cost += f" [{r['gpu_s_low']:.1f}, {r['gpu_s_high']:.1f}]"
        lines.append(f"| {r['surface']} | {r['policy']} | {_pct(r['wrong'])} | "
                     f"{_fd(r)} | {_pct(r['race_false_difference'])} | "
                     f"{cost} | {r['cost_ratio']:.2f} | {r['measurements']:.1f} | "
                     f"{r['tied']:.2f} | {r['undecided']:.2f} |")
    return lines


def target_checks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The three targets, on the ablation surface for ``auto``."""
    row = next((r for r in data.get("rows", []) if r["surface"] == "ablation"
                and r["policy"] == "auto"), None)
    if row is None:
        return []
    return [
        {"what": "wrong winner", "target": TARGET_WRONG, "value": row["wrong"]["rate"],
         "high": row["wrong"]["high"], "met": row["wrong"]["rate"] <= TARGET_WRONG,
         "upper_below": row["wrong"]["high"] <= TARGET_WRONG},
        {"what": "false difference", "target": TARGET_FALSE_DIFF,
         "value": row["false_difference"]["rate"], "high": row["false_difference"]["high"],
         "met": (row["false_difference"]["rate"] or 0.0) <= TARGET_FALSE_DIFF,
         "upper_below": row["false_difference"]["high"] <= TARGET_FALSE_DIFF},
        {"what": "GPU-seconds against single-shot", "target": TARGET_COST,
         "value": row["cost_ratio"], "high": None, "met": row["cost_ratio"] <= TARGET_COST,
         "upper_below": None},
    ]


def render(data: dict[str, Any]) -> list[str]:
    """The Markdown block of RESULTS.md (``benchmarks/results.py``)."""
    sweep_args = (f" --sweep --sweep-seeds {data.get('sweep_seeds', data.get('seeds'))}"
                  if data.get("sweep") else "")
    lines = [f"`python benchmarks/selection.py --seeds {data.get('seeds')} --noise "
             f"{data.get('noise')}{sweep_args}`: the sim's steady-state surface, each measurement "
             "times a seeded restart factor, the product's `Racer` and `tie_set` over an "
             "in-memory store (definitions in the script's docstring). Single-shot's false "
             "difference is 100 % by definition: it never declares a tie, so its best is always "
             "ranked over a configuration of the same speed.", ""]
    lines += table(data.get("rows", []))
    lines += ["", "False difference of `auto` if `tie_set` also compared the best, by seed, with "
              "every configuration it was never raced against (not what the product does; "
              "the silent pairs above): "
              + "; ".join(f"{r['surface']} {_pct(r['false_difference_after_check'])}"
                          for r in data.get("rows", []) if r["policy"] == "auto") + "."]
    lines += ["", "Targets (quick-start ablation, `replicates: auto`):", ""]
    for t in data.get("targets", []):
        value = (f"{t['value']:.2f}x" if t["what"].startswith("GPU")
                 else f"{(t['value'] or 0) * 100:.1f} %")
        bound = "" if t["upper_below"] is None else (
            "; the interval's upper end is below it" if t["upper_below"]
            else f"; the interval's upper end ({t['high'] * 100:.1f} %) is not")
        limit = (f"{t['target']:g}x" if t["what"].startswith("GPU")
                 else f"{t['target'] * 100:g} %")
        lines.append(f"- {t['what']} at most {limit}: {value}, "
                     f"**{'met' if t['met'] else 'not met'}**{bound}.")
    lines += ["", f"Settings: {data.get('seeds')} seeds per surface and policy, restart noise "
              f"sigma {data.get('noise')}, cycle {data.get('overhead_s'):.1f} s + "
              f"{data.get('level_s'):g} s per level ({data.get('not_started_s'):g} s when it "
              "does not start), a replicate "
              + ("the levels up to the highest within 10 % of the best"
                 if data.get("replicate_levels", "best") == "best" else "every level again")
              + "; surfaces: "
              + "; ".join(f"{s['name']} {s['configs']} configurations ({s['feasible']} "
                          f"feasible, {s['equal_pairs']} truly equal pairs, optimum "
                          f"{s['optimum']:.0f} tok/s)" for s in data.get("surfaces", []))
              + "."]
    if data.get("sweep"):
        lines += ["", f"Racer's knobs, one at a time (`replicates: auto`, "
                  f"{data.get('sweep_seeds', data.get('seeds'))} seeds):", "",
                  "| knob | value | surface | wrong winner | false difference | race false "
                  "difference | x single-shot | measurements |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in data["sweep"]:
            lines.append(f"| {r['knob']} | {r['value']} | {r['surface']} | {_pct(r['wrong'])} "
                         f"| {_fd(r)} | "
                         f"{_pct(r['race_false_difference'])} | {r['cost_ratio']:.2f} | "
                         f"{r['measurements']:.1f} |")
    return lines


def results_targets(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """The targets as ``benchmarks/results.py`` lists them."""
    out: list[tuple[str, bool | None]] = []
    for t in data.get("targets", []):
        if t["what"].startswith("GPU"):
            said = f"auto at most {t['target']:g}x single-shot's GPU-seconds ({t['value']:.2f}x)"
        else:
            said = (f"auto's {t['what']} at most {t['target'] * 100:g} % "
                    f"({(t['value'] or 0) * 100:.1f} %)")
        out.append((said, bool(t["met"])))
    return out


def run(seeds: int, sigma: float, names: list[str], do_sweep: bool, overhead_s: float,
        level_s: float, not_started_s: float, replicate_levels: str = "best",
        say: Callable[[str], None] = print, sweep_seeds: int | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    found = surfaces(names, overhead_s, level_s, not_started_s, replicate_levels)
    rows = []
    for surface in found:
        for row in evaluate(surface, POLICIES, seeds, sigma):
            rows.append({"surface": surface.name, **row})
        say(f"{surface.name}: done ({time.monotonic() - t0:.1f} s)")
    data: dict[str, Any] = {
        "benchmark": "selection", "seeds": seeds, "noise": sigma, "within": WITHIN,
        "overhead_s": overhead_s, "level_s": level_s, "not_started_s": not_started_s,
        "replicate_levels": replicate_levels,
        "surfaces": [{"name": s.name, "configs": len(s.plan),
                      "feasible": sum(v is not None for v in s.truth), "optimum": s.optimum,
                      "equal_pairs": len(s.equal_pairs()),
                      "truth": s.truth, "plan": s.plan} for s in found],
        "rows": rows,
        "knobs": {"PRIOR_CV": race_mod.PRIOR_CV, "BAND_SDS": race_mod.BAND_SDS,
                  "MIN_POOLED_DF": race_mod.MIN_POOLED_DF, "PRIOR_DF": race_mod.PRIOR_DF,
                  "SPREAD_PRIOR_CV": race_mod.SPREAD_PRIOR_CV},
    }
    data["targets"] = target_checks(data)
    if do_sweep:
        data["sweep_seeds"] = sweep_seeds or seeds
        data["sweep"] = sweep([s for s in found if s.name in ("ablation", "grid")],
                              sweep_seeds or seeds, sigma)
    data["wall_s"] = round(time.monotonic() - t0, 1)
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--noise", type=float, default=0.02,
                        help="sigma of the log-normal restart noise of a measurement")
    parser.add_argument("--surfaces", default="ablation,grid,space")
    parser.add_argument("--sweep", action="store_true", help="also vary Racer's knobs")
    parser.add_argument("--sweep-seeds", type=int, default=None,
                        help="seeds per row of the sweep (default: --seeds)")
    parser.add_argument("--overhead-s", type=float, default=OVERHEAD_S)
    parser.add_argument("--level-s", type=float, default=LEVEL_S)
    parser.add_argument("--not-started-s", type=float, default=NOT_STARTED_S)
    parser.add_argument("--replicate-levels", choices=("best", "all"), default="best",
                        help="what a replicate runs: the levels up to the highest within 10 %% "
                        "of the best (as tune/trial.run_replicate), or every level again")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.seeds < 1 or args.noise < 0 or (args.sweep_seeds is not None
                                             and args.sweep_seeds < 1):
        print("selection.py: --seeds must be at least 1 and --noise at least 0",
              file=sys.stderr)
        return 2
    data = run(args.seeds, args.noise, [n for n in args.surfaces.split(",") if n], args.sweep,
               args.overhead_s, args.level_s, args.not_started_s, args.replicate_levels,
               say=lambda m: print(m, file=sys.stderr), sweep_seeds=args.sweep_seeds)
    print("\n".join(render(data)))
    print(f"\n{data['wall_s']} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
