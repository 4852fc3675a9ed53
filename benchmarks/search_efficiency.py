"""How many launches each strategy needs to find the best configuration (issue 39, search
efficiency; first measured for tpe, random, ablation and grid before ``strategy: guided``).

The surface is the sim engine's performance model (``cleanslate.sim.model``, the same model the
running sim steps through), in steady state so that thousands of studies take seconds. A trial
climbs the study's concurrency ladder in ascending order, as ``cleanslate tune`` does, and
stops at the first level that crashes or misses the SLO (mean TTFT above 8 s, as
``cleanslate.sim.model.steady_value`` judges it). What binds each level is the sim's known
truth, ``cleanslate.sim.model.binding_constraint`` (the verdict the bottleneck diagnosis gave
on the sim in every clear case of ``benchmarks/diagnosis.py``); a level crashes where the
steady-state batch or the KV admission takes a decode batch over ``cuda-graph-max-bs`` with
CUDA graphs on. The trial is recorded as ``cleanslate tune`` records it: a
:class:`~cleanslate.store.TrialRecord` with its level verdicts, the verdict of each level as a
``clear`` :class:`~cleanslate.bench.Bottleneck` (evidence: the truth's reason), and
``best_bottleneck`` / ``limit_level`` / ``limit_bottleneck`` from the product's
:func:`~cleanslate.store.trial_bottlenecks`; a server that does not start is infeasible
(``oom``), one that crashed at a level is infeasible (``python_exception``, decided by its
crash: the levels below are not its value), one that met no level is infeasible
(``slo_miss``). A feasible trial's value is its best level's output tokens/s times the sim's
run-to-run noise (log-normal, sigma 2 %, ``--noise``; ``benchmarks/selection.py``'s seeded
factor per study, trial and measurement).

Every strategy runs under the quick start's statistics (``statistics: {replicates: auto,
max_replicates: 3, tie_margin: 0.05}``), as ``cleanslate tune`` runs it: each trial's first
measurement, then the product's :class:`~cleanslate.tune.race.Racer` (an in-memory store, as
in ``benchmarks/selection.py``) races it against the incumbent when it is within the noise,
every race measurement a launch. ``tpe`` and ``random`` are the product's samplers
(:func:`cleanslate.tune.space.make_sampler`, the baseline first, each result told with
:func:`cleanslate.tune.fleet.tell_result`); ``ablation`` and ``grid`` run their plans in order
and are raced too (``tune`` races any trial under ``replicates: auto``); ``guided`` replays
the product's path (:func:`cleanslate.tune.notebook.path_state` for the next step,
``Racer.race(..., against=incumbent)`` as ``tune.fleet`` does, :func:`~cleanslate.tune.notebook.
noted` for kept or reverted) until the path ends; ``guided+tpe`` is ``guided: {then: tpe}``.

Reached: the configuration the strategy would report (``tune``'s best,
:func:`cleanslate.tune.fleet.best_trial`, for every strategy, guided included) is within the
tie margin (5 %) of the optimum in true value. Counted at the first trial after which
that holds: **launches** (every measurement: each trial's first and every race replicate) and
**trials**. A seed that never gets there counts as more than what it spent (``> N``): the
samplers stop after as many trials as the space has configurations, the plans at their end, the
guided path where it ends. Two spaces: ``quick`` (the quick-start space, 120 configurations,
its baseline as before) and ``large`` (:data:`LARGE_SPACE`: five flags, 480 configurations, a
crash region where CUDA graphs meet a batch above ``cuda-graph-max-bs``, a KV wall where a low
memory fraction cannot hold the cap at c=256; the baseline the founding story's: 64 running
requests, CUDA graphs off).

    python benchmarks/search_efficiency.py [--seeds 30] [--noise 0.02] [--spaces quick,large]
                                           [--strategies ...] [--json out.json]

Prints, per space, its size, feasible count, optimum and ties, a Markdown table (strategy |
median launches | worst | median trials | worst | not reached), where the guided path ended
when it did not reach the optimum, and the targets (guided's median launches at most half of
TPE's on every space; guided's worst at most TPE's median). ``--json`` writes the same with
each seed's counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from cleanslate.bench import Bottleneck, ClosedLoop, LevelResult
from cleanslate.sim.model import (
    QUICKSTART_CONCURRENCY,
    QUICKSTART_FIXED,
    QUICKSTART_SPACE,
    QUICKSTART_TTFT_SLO_S,
    QUICKSTART_WORKLOAD,
    Binding,
    SimModel,
    binding_constraint,
    settings_from_flags,
)
from cleanslate.store import LevelVerdict, Replicate, TrialRecord, TrialStatus, trial_bottlenecks
from cleanslate.tune.fleet import best_trial, tell_result
from cleanslate.tune.notebook import noted, path_state
from cleanslate.tune.race import Racer
from cleanslate.tune.space import distributions, make_sampler, planned_configs
from cleanslate.tune.study import StudySpec
from selection import SLOT, noise

TTFT_SLO_S = QUICKSTART_TTFT_SLO_S  # mean TTFT, as the steady-state estimate gives it
#: The quick start's statistics (``examples/quickstart.yaml``, ``examples/guided.yaml``).
STATISTICS: dict[str, Any] = {"replicates": "auto", "max_replicates": 3, "tie_margin": 0.05}
STRATEGIES = ("guided", "guided+tpe", "tpe", "random", "ablation", "grid")
#: Targets: guided's median launches at most this share of TPE's (on every space), and its
#: worst at most TPE's median.
TARGET_SHARE = 0.5

#: The larger space: every flag the sim reads that a relax row maps. Crashes: CUDA graphs on
#: (``disable-cuda-graph: false``) with a decode batch above ``cuda-graph-max-bs``; a KV wall:
#: at 0.80-0.85 the cache holds fewer full requests than a cap of 128 or more at c=256.
LARGE_SPACE: dict[str, list[Any]] = {
    "mem-fraction-static": [0.80, 0.85, 0.88, 0.92],
    "disable-cuda-graph": [True, False],
    "cuda-graph-max-bs": [64, 128, 256],
    "max-running-requests": [32, 64, 128, 256, 512],
    "chunked-prefill-size": [2048, 4096, 8192, 16384],
}
LARGE_FIXED: dict[str, Any] = {"tp-size": 1}
#: The founding story's start: 64 running requests, CUDA graphs off.
LARGE_BASELINE: dict[str, Any] = {"mem-fraction-static": 0.85, "disable-cuda-graph": True,
                                  "cuda-graph-max-bs": 128, "max-running-requests": 64,
                                  "chunked-prefill-size": 4096}
QUICK_BASELINE: dict[str, Any] = {"mem-fraction-static": 0.88, "disable-cuda-graph": True,
                                  "max-running-requests": 128, "chunked-prefill-size": 4096}

Key = tuple[tuple[str, str], ...]


def key(config: dict[str, Any]) -> Key:
    return tuple(sorted((k, repr(v)) for k, v in config.items()))


@dataclass(frozen=True)
class Level:
    """One level of a trial's ladder: how it went and what bound it (the sim's truth)."""

    concurrency: int
    verdict: LevelVerdict
    throughput: float
    binding: Binding

    @property
    def label(self) -> str:
        return f"c={self.concurrency}"

    def bottleneck(self) -> Bottleneck:
        """The level's verdict as a clear diagnosis would give it: ``crashed`` for a level the
        server died in (the diagnosis' own first rule), else the truth's verdict."""
        crashed = self.verdict == LevelVerdict.CRASHED
        b = self.binding
        return Bottleneck(verdict="crashed" if crashed else b.verdict, confidence="clear",
                          evidence=(b.reason,), rule="sim truth (binding_constraint)",
                          figures={"batch": b.batch, "cap": b.running_cap,
                                   "kv_limit": b.kv_limit, "graph_max_bs": b.graph_max_bs,
                                   "marginal_gain": b.marginal_gain,
                                   # as the engine's metrics give them to a diagnosis
                                   "running_mean": b.batch, "running_max": b.batch,
                                   "kv_usage_max": min(1.0, b.batch / b.kv_limit)
                                   if b.kv_limit > 0 else 1.0})


@dataclass
class Space:
    """A search space on the steady-state surface, with each configuration's ladder and true
    value cached."""

    name: str
    fixed: dict[str, Any]
    space: dict[str, list[Any]]
    baseline: dict[str, Any]
    concurrency: list[int]
    _ladders: dict[Key, list[Level] | None] = field(default_factory=dict)

    def ladder(self, config: dict[str, Any]) -> list[Level] | None:
        """The levels a trial of ``config`` runs, in ascending load, up to the first that
        crashes, fails or misses the SLO; ``None`` when the server does not start."""
        k = key(config)
        if k not in self._ladders:
            self._ladders[k] = climb({**self.fixed, **config}, self.concurrency)
        return self._ladders[k]

    def truth(self, config: dict[str, Any]) -> float | None:
        """The configuration's true value as ``tune`` scores it: the best passing level's
        output tokens/s; ``None`` when it does not start, crashed at a level or met none."""
        levels = self.ladder(config)
        if levels is None or any(lv.verdict == LevelVerdict.CRASHED for lv in levels):
            return None
        ok = [lv.throughput for lv in levels if lv.verdict == LevelVerdict.OK]
        return max(ok) if ok else None

    def spec(self, strategy: str, seed: int, trials: int) -> StudySpec:
        guided = strategy.startswith("guided")
        data: dict[str, Any] = {
            "name": f"efficiency-{self.name}-{strategy.replace('+', '-then-')}-{seed}",
            "engine": "sim", "model": "sim",
            "fixed": self.fixed, "space": self.space, "baseline": self.baseline,
            "strategy": "guided" if guided else strategy, "workload": QUICKSTART_WORKLOAD,
            "concurrency": self.concurrency, "seed": seed, "budget": {"trials": trials},
            "statistics": STATISTICS}
        if strategy == "guided+tpe":
            data["guided"] = {"then": "tpe"}
        return StudySpec.model_validate(data)

    def grid(self) -> list[dict[str, Any]]:
        return planned_configs(self.spec("grid", 0, 1)) or []


def climb(flags: dict[str, Any], concurrency: list[int]) -> list[Level] | None:
    """:meth:`Space.ladder` for the sim started with ``flags`` (see the module docstring)."""
    settings = settings_from_flags(flags)
    model = SimModel(settings)
    plan = model.memory_plan()
    if plan.oom_at_start or plan.not_enough_for_kv:
        return None
    n_in, n_out = int(QUICKSTART_WORKLOAD["input_len"]), int(QUICKSTART_WORKLOAD["output_len"])
    levels: list[Level] = []
    for c in sorted(concurrency):
        est = model.estimate(c, n_in, n_out)
        binding = binding_constraint(settings, n_in, n_out, c)
        batch = int(est["batch"])
        # The truth's crash also counts the KV admission's overshoot past the steady batch.
        if binding.verdict == "crashed" or (batch > 0 and model.crashes_at_batch(batch)):
            levels.append(Level(c, LevelVerdict.CRASHED, 0.0, binding))
            break
        if binding.verdict == "errors" or batch <= 0:
            levels.append(Level(c, LevelVerdict.ERRORS, 0.0, binding))
            break
        missed = est["ttft_s"] > TTFT_SLO_S
        levels.append(Level(c, LevelVerdict.SLO_MISS if missed else LevelVerdict.OK,
                            est["output_throughput"], binding))
        if missed:
            break
    return levels


def record(space: Space, spec: StudySpec, number: int, params: dict[str, Any],
           factor: float) -> TrialRecord:
    """Trial ``number`` of ``params`` as ``cleanslate tune`` records it, its value the true
    value times ``factor`` (the measurement's noise)."""
    levels = space.ladder(params)
    common: dict[str, Any] = {"study": spec.name, "number": number, "params": params,
                              "slot": SLOT}
    if levels is None:
        return TrialRecord(**common, status=TrialStatus.INFEASIBLE, cause="oom",
                           detail="the server does not start: out of memory at start or no "
                                  "room for the KV cache")
    verdicts = {lv.label: lv.verdict for lv in levels}
    # The product's own reading of the levels; only the fields it reads are filled in.
    results = tuple(LevelResult.model_construct(label=lv.label,
                                                load=ClosedLoop(concurrency=lv.concurrency),
                                                bottleneck=lv.bottleneck()) for lv in levels)
    ok = [lv for lv in levels if lv.verdict == LevelVerdict.OK]
    best = max(ok, key=lambda lv: lv.throughput) if ok else None
    last = levels[-1]
    crashed = last.verdict == LevelVerdict.CRASHED
    cause: str | None = None
    detail: str | None = None
    if crashed:
        cause, detail = "python_exception", f"{last.label}: {last.binding.reason}"
    elif last.verdict == LevelVerdict.ERRORS:
        cause, detail = "request_errors", f"{last.label}: {last.binding.reason}"
    elif not ok:
        cause = "slo_miss"
    feasible = best is not None and not crashed
    value = space.truth(params) if feasible else None
    return TrialRecord(**common, status=TrialStatus.FEASIBLE if feasible else
                       TrialStatus.INFEASIBLE, cause=cause, detail=detail,
                       value=value * factor if value is not None else None,
                       best_level=best.label if best is not None else None,
                       level_verdicts=verdicts,
                       **trial_bottlenecks(results, verdicts,
                                           best.label if best is not None else None))


class Lab:
    """One study of one strategy and seed, in memory: every trial measured and raced as
    ``tune`` does it, the launches counted, and when the reported configuration first came
    within the tie margin of the optimum."""

    def __init__(self, space: Space, spec: StudySpec, seed: int, sigma: float,
                 optimum: float) -> None:
        self.space = space
        self.spec = spec
        self.seed = seed
        self.sigma = sigma
        self.target = optimum * (1 - spec.statistics.tie_margin)
        self.store: dict[int, TrialRecord] = {}
        self.launches = 0
        self.trials = 0
        self.reached: tuple[int, int] | None = None  # (launches, trials)
        self.racer = Racer(spec, load=self.store.get, save=self.save, measure=self.measure,
                           trials=lambda: list(self.store.values()))

    def save(self, trial: TrialRecord) -> TrialRecord:
        self.store[trial.number] = trial
        return trial

    async def measure(self, trial: TrialRecord, rep_seed: int, pair: int,
                      against: int | None) -> Replicate:
        latest = self.store.get(trial.number, trial)
        index = len(latest.replicates)
        true = self.space.truth(trial.params)
        assert true is not None  # only feasible trials are raced
        self.launches += 1
        return Replicate(index=index, seed=rep_seed, status=TrialStatus.FEASIBLE,
                         value=true * noise(self.seed, trial.number, index, self.sigma),
                         best_level=trial.best_level, slot=SLOT, pair=pair, against=against)

    async def trial(self, params: dict[str, Any], against: int | None = None,
                    max_pairs: int | None = None) -> TrialRecord:
        """Trial ``params``: its first measurement, then a race against the incumbent (the
        study's best, or trial ``against``) as ``statistics: {replicates: auto}`` asks."""
        number = len(self.store)
        found = self.save(record(self.space, self.spec, number, params,
                                 noise(self.seed, number, 0, self.sigma)))
        self.launches += 1
        self.trials += 1
        if found.status == TrialStatus.FEASIBLE:
            found = (await self.racer.race(found, SLOT, against, max_pairs)).challenger
        return found

    def check(self, reported: TrialRecord | None) -> None:
        """Note the first time the reported configuration is within reach of the optimum."""
        if self.reached is not None or reported is None:
            return
        value = self.space.truth(reported.params)
        if value is not None and value >= self.target:
            self.reached = (self.launches, self.trials)

    def records(self) -> list[TrialRecord]:
        return list(self.store.values())


async def run_sampler(lab: Lab, limit: int) -> None:
    spec = lab.spec
    study = optuna.create_study(direction="maximize", sampler=make_sampler(spec))
    dists = distributions(spec)
    study.enqueue_trial(dict(lab.space.baseline))  # the baseline first, as in tune
    while lab.reached is None and lab.trials < limit:
        trial = study.ask(dists)
        found = await lab.trial(dict(trial.params))
        tell_result(study, trial, found, spec)
        lab.check(best_trial(lab.records(), spec))


async def run_plan(lab: Lab) -> None:
    for config in planned_configs(lab.spec) or []:
        await lab.trial(config)
        lab.check(best_trial(lab.records(), lab.spec))
        if lab.reached is not None:
            return


@dataclass
class Path_:
    """How a guided study's path went: why it ended, its incumbent, its steps (each with its
    notebook line, outcome, note, effect, pairs, status and launches)."""

    ended: str = ""
    incumbent: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    launches: int = 0
    trials: int = 0


async def run_guided(lab: Lab, limit: int) -> Path_:
    """The guided path as ``tune.fleet`` runs it (``_guide``, ``_guided_trial``,
    ``_statistics``, ``_note``), to its end or ``limit`` trials."""
    spec = lab.spec
    study = optuna.create_study(direction="maximize", sampler=make_sampler(spec))
    dists = distributions(spec)
    path = Path_()
    while lab.trials < limit:
        state = path_state(spec, lab.records())
        if state.proposal is None:
            path.ended = state.ended
            break
        proposal = state.proposal
        held = {k: v for k, v in proposal.params.items() if k not in proposal.sample}
        if held:
            study.enqueue_trial(held, skip_if_exists=False)
        trial = study.ask(dists)
        step = proposal.step
        before = lab.launches
        found = await lab.trial(dict(trial.params), step.against if step.step else None,
                                proposal.max_pairs)
        others = [t for t in lab.records() if t.number != found.number]
        found, line = noted(spec, found, others, step)
        lab.save(found)
        entry = found.guided
        path.steps.append({"step": step.step, "flag": step.flag, "new": step.new, "line": line,
                           "outcome": entry.outcome if entry else None,
                           "note": entry.note if entry else None,
                           "effect": entry.effect if entry else None,
                           "pairs": entry.pairs if entry else 0,
                           "status": str(found.status), "launches": lab.launches - before})
        lab.check(best_trial(lab.records(), spec))  # what tune reports, as for the others
        tell_result(study, trial, found, spec)
    else:
        path.ended = f"the budget of {limit} trials"
    incumbent = path_state(spec, lab.records()).incumbent
    path.incumbent = dict(incumbent.params) if incumbent is not None else {}
    path.launches, path.trials = lab.launches, lab.trials
    return path


def spaces() -> dict[str, Space]:
    return {
        "quick": Space("quick", dict(QUICKSTART_FIXED), dict(QUICKSTART_SPACE),
                       QUICK_BASELINE, list(QUICKSTART_CONCURRENCY)),
        "large": Space("large", LARGE_FIXED, LARGE_SPACE, LARGE_BASELINE,
                       list(QUICKSTART_CONCURRENCY)),
    }


def describe(space: Space) -> dict[str, Any]:
    """The space's size, feasible count, optimum, and how many configurations tie with it."""
    grid = space.grid()
    truth = {key(c): space.truth(c) for c in grid}
    feasible = [v for v in truth.values() if v is not None]
    optimum = max(feasible)
    margin = float(STATISTICS["tie_margin"])
    ties = sum(1 for v in feasible if v >= optimum * (1 - margin))
    best = next(c for c in grid if truth[key(c)] == optimum)
    crashed = sum(1 for c in grid if (lv := space.ladder(c)) is not None
                  and lv[-1].verdict == LevelVerdict.CRASHED)
    return {"name": space.name, "configs": len(grid), "feasible": len(feasible),
            "not_started": sum(1 for c in grid if space.ladder(c) is None),
            "crashed": crashed, "optimum": optimum, "optimum_config": best, "ties": ties,
            "tie_margin": margin, "baseline": space.baseline,
            "baseline_value": space.truth(space.baseline), "fixed": space.fixed,
            "space": space.space, "concurrency": space.concurrency}


def run_one(space: Space, strategy: str, seed: int, sigma: float, optimum: float,
            limit: int) -> dict[str, Any]:
    """One study: launches and trials to reach the optimum (``None``: never), what it spent."""
    lab = Lab(space, space.spec(strategy, seed, limit), seed, sigma, optimum)
    path: Path_ | None = None
    if strategy in ("tpe", "random"):
        asyncio.run(run_sampler(lab, limit))
    elif strategy in ("ablation", "grid"):
        asyncio.run(run_plan(lab))
    else:
        path = asyncio.run(run_guided(lab, limit))
    out: dict[str, Any] = {
        "seed": seed, "launches": lab.reached[0] if lab.reached else None,
        "trials": lab.reached[1] if lab.reached else None,
        "spent_launches": lab.launches, "spent_trials": lab.trials}
    if path is not None:
        value = space.truth(path.incumbent) if path.incumbent else None
        out.update({"ended": path.ended, "incumbent": path.incumbent,
                    "incumbent_share": value / optimum if value else None,
                    "steps": path.steps})
    return out


def _median(runs: list[dict[str, Any]], what: str) -> float:
    return statistics.median(r[what] if r[what] is not None else math.inf for r in runs)


def _worst(runs: list[dict[str, Any]], what: str) -> float:
    return max(r[what] if r[what] is not None else math.inf for r in runs)


def _shown(value: float, runs: list[dict[str, Any]], what: str) -> str:
    """A count for the table; ``> N`` (N: the most any seed that never reached spent) when the
    count is a seed that never reached."""
    if math.isfinite(value):
        return f"{value:g}"
    spent = max(r[f"spent_{what}"] for r in runs if r[what] is None)
    return f"> {spent}"


def _json(value: float, runs: list[dict[str, Any]], what: str) -> int | float | str:
    if math.isfinite(value):
        return int(value) if value == int(value) else value
    return _shown(value, runs, what)


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median: the order statistics ``k`` and ``n + 1 -
    k`` (1-based) with ``k`` the largest such that ``P(Binomial(n, 1/2) < k)`` is at most half
    the error rate (30 seeds: the 10th and 21st). Seeds that never reached count as infinite;
    too few values for the confidence give the range."""
    xs = sorted(values)
    n = len(xs)
    tail, k = 0.0, 0
    while k < n and tail + math.comb(n, k) / 2 ** n <= (1 - confidence) / 2:
        tail += math.comb(n, k) / 2 ** n
        k += 1
    return (xs[0], xs[-1]) if k == 0 else (xs[k - 1], xs[n - k])


#: What a guided step's launches went on, in the order :func:`step_kind` tests them.
STEP_KINDS = ("baseline", "kept", "reverted: did not start or crashed",
              "reverted: raced (2+ pairs)", "reverted: on its first measurement")


def step_kind(step: dict[str, Any]) -> str:
    """The kind of a guided step for :data:`STEP_KINDS` (from its notebook entry)."""
    if step["outcome"] in ("baseline", "kept"):
        return str(step["outcome"])
    if step["status"] != str(TrialStatus.FEASIBLE):
        return STEP_KINDS[2]
    return STEP_KINDS[3] if step["pairs"] >= 2 else STEP_KINDS[4]


def spent_on(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """For the seeds that reached the optimum, the median launches and steps of each kind
    (:data:`STEP_KINDS`) up to and including the step that reached it."""
    out: dict[str, dict[str, float]] = {}
    reached = [run for run in runs if run["launches"] is not None]
    if not reached:
        return out
    for kind in STEP_KINDS:
        launches, steps = [], []
        for run in reached:
            upto = run["steps"][:run["trials"]]
            mine = [s for s in upto if step_kind(s) == kind]
            launches.append(sum(s["launches"] for s in mine))
            steps.append(len(mine))
        out[kind] = {"launches": statistics.median(launches), "steps": statistics.median(steps)}
    return out


def summarize(strategy: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": strategy, "not_reached": sum(
        1 for r in runs if r["launches"] is None), "seeds": len(runs)}
    for what in ("launches", "trials"):
        med, worst = _median(runs, what), _worst(runs, what)
        row[f"median_{what}"] = _json(med, runs, what)
        row[f"worst_{what}"] = _json(worst, runs, what)
        row[f"_{what}"] = (med, worst)
        low, high = median_interval([r[what] if r[what] is not None else math.inf
                                     for r in runs])
        row[f"median_{what}_ci"] = [_json(low, runs, what), _json(high, runs, what)]
    row["median_spent_launches"] = statistics.median(r["spent_launches"] for r in runs)
    row["median_spent_trials"] = statistics.median(r["spent_trials"] for r in runs)
    if strategy.startswith("guided"):
        row["spent_on"] = spent_on(runs)
    row["runs"] = runs
    return row


def _with_ci(row: dict[str, Any], what: str) -> str:
    low, high = row[f"median_{what}_ci"]
    return f"{row[f'median_{what}']} [{low}, {high}]"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of one space's rows (as the JSON keeps them)."""
    lines = ["| strategy | median launches [95 % interval] | worst | median trials [95 % "
             "interval] | worst | not reached |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {_with_ci(r, 'launches')} | {r['worst_launches']} "
                     f"| {_with_ci(r, 'trials')} | {r['worst_trials']} | "
                     f"{r['not_reached']} of {r['seeds']} |")
    return lines


def space_lines(info: dict[str, Any]) -> list[str]:
    """One space as the page shows it: what it is, its table, how long the guided paths ran,
    and where those that never reached the optimum ended."""
    base = info["baseline_value"]
    lines = [f"**{info['name']}**: {info['configs']} configurations, {info['feasible']} "
             f"feasible ({info['not_started']} do not start, {info['crashed']} crash at a "
             f"level); optimum {info['optimum']:.0f} tok/s at `{info['optimum_config']}`, "
             f"{info['ties']} configuration(s) within the tie margin "
             f"({info['tie_margin']:.0%}) of it; baseline `{info['baseline']}` at "
             + (f"{base:.0f} tok/s ({base / info['optimum']:.1%} of the optimum)" if base
                else "no value") + f"; levels {info['concurrency']}.", ""]
    lines += table(info["rows"])
    ends = [f"{r['strategy']} {r['median_spent_launches']:g} launches "
            f"({r['median_spent_trials']:g} trials)" for r in info["rows"]
            if r["strategy"].startswith("guided")]
    if ends:
        lines += ["", "The guided path ends (median, reached or not): " + "; ".join(ends) + "."]
    guided = next((r for r in info["rows"] if r["strategy"] == "guided"), None)
    if guided is not None and guided.get("spent_on"):
        lines += ["", "Guided, the seeds that reached it: median launches (steps) up to the "
                  "step that reached it, by what each step came to: " + "; ".join(
                      f"{kind} {v['launches']:g} ({v['steps']:g})"
                      for kind, v in guided["spent_on"].items()) + "."]
    where = stuck(info["rows"], info["optimum_config"])
    if where:
        lines += ["", "Where the guided path ended without reaching the optimum:", *where]
    return lines


def targets(by_space: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Guided against TPE on each space: median launches at most half of TPE's; worst at most
    TPE's median."""
    out = []
    for name, rows in by_space.items():
        found = {r["strategy"]: r for r in rows}
        if "guided" not in found or "tpe" not in found:
            continue
        g_med, g_worst = found["guided"]["_launches"]
        t_med, _ = found["tpe"]["_launches"]
        out.append({"space": name, "what": "guided median launches <= half of tpe's median",
                    "guided": _with_ci(found["guided"], "launches"),
                    "tpe": _with_ci(found["tpe"], "launches"),
                    "met": math.isfinite(g_med) and g_med <= TARGET_SHARE * t_med})
        out.append({"space": name, "what": "guided worst launches <= tpe's median",
                    "guided": _json(g_worst, found["guided"]["runs"], "launches"),
                    "tpe": _with_ci(found["tpe"], "launches"),
                    "met": math.isfinite(g_worst) and g_worst <= t_med})
    return out


def _change(line: str) -> str:
    """The change of a notebook line: ``raise chunked-prefill-size 4096 -> 16384`` (the text
    between the evidence and the outcome)."""
    change = line.split(" -> ", 1)[-1] if ") -> " in line else line
    return change.split(": ", 1)[0] if ": " in change else change


def stuck(rows: list[dict[str, Any]], best: dict[str, Any]) -> list[str]:
    """Where the guided paths that never reached the optimum ended, the seeds grouped by the
    same story: why the path ended, the incumbent's share of the optimum, and each flag whose
    optimum value it lacks with the step that tried that value (its change, outcome and
    notes, the effects' range), or "never tried". A strategy whose every path equals an
    earlier one's is said in one line."""
    lines = []
    for r in rows:
        if not r["strategy"].startswith("guided"):
            continue
        if r.get("same_paths_as"):
            lines.append(f"- {r['strategy']}: every seed's path is {r['same_paths_as']}'s")
            continue
        groups: dict[str, list[dict[str, Any]]] = {}
        for run in r["runs"]:
            if run["launches"] is not None:
                continue
            share = run["incumbent_share"]
            what = [f"ended: {run['ended']}; the path's incumbent at "
                    + (f"{share:.1%} of the optimum" if share else "no value")]
            for flag, value in best.items():
                have = run["incumbent"].get(flag)
                if have == value:
                    continue
                tried = next((s for s in run["steps"] if s["flag"] == flag
                              and s["new"] == value), None)
                what.append(f"{flag} {have} (optimum {value}): " + (
                    f"step {tried['step']} `{_change(tried['line'])}` {tried['outcome']}"
                    if tried else "never tried"))
            groups.setdefault("; ".join(what), []).append(run)
        for story, runs in groups.items():
            notes = sorted({s["note"] for run in runs for s in run["steps"]
                            if s["note"] and f"step {s['step']} `" in story
                            and s["flag"] is not None and f"{s['flag']} " in story
                            and s["new"] == best.get(s["flag"])})
            effects = [s["effect"] for run in runs for s in run["steps"]
                       if s["effect"] is not None and s["flag"] is not None
                       and s["new"] == best.get(s["flag"]) and f"step {s['step']} `" in story]
            span = (f"{min(effects):+.1%}" if min(effects) == max(effects) else
                    f"{min(effects):+.1%} to {max(effects):+.1%}") if effects else ""
            extra = (f" ({'; '.join(notes)}" + (f"; effect {span}" if span else "")
                     + ")") if notes else ""
            seeds = ", ".join(str(run["seed"]) for run in runs)
            lines.append(f"- {r['strategy']}, {len(runs)} seed(s) ({seeds}): {story}{extra}")
    return lines


def compact(rows: list[dict[str, Any]]) -> None:
    """Keep the JSON small: a guided strategy whose every path is an earlier one's says so
    (``same_paths_as``) instead of repeating them; a path that reached the optimum keeps its
    counts (its steps are in the row's ``spent_on``), one that did not its steps."""
    seen: dict[str, str] = {}
    for r in rows:
        if not r["strategy"].startswith("guided"):
            continue
        paths = json.dumps([run["steps"] for run in r["runs"]])
        if paths in seen:
            r["same_paths_as"] = seen[paths]
            for run in r["runs"]:
                run.pop("steps")
            continue
        seen[paths] = r["strategy"]
        for run in r["runs"]:
            if run["launches"] is not None:
                run.pop("steps")


def run(names: list[str], strategies: list[str], seeds: int, sigma: float,
        say: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.monotonic()
    found = spaces()
    data: dict[str, Any] = {"benchmark": "search_efficiency", "seeds": seeds, "noise": sigma,
                            "statistics": STATISTICS, "ttft_slo_s": TTFT_SLO_S, "spaces": []}
    by_space: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        space = found[name]
        info = describe(space)
        limit = info["configs"]
        rows = []
        for strategy in strategies:
            runs = [run_one(space, strategy, seed, sigma, info["optimum"], limit)
                    for seed in range(seeds)]
            rows.append(summarize(strategy, runs))
        compact(rows)
        by_space[name] = rows
        data["spaces"].append({**info, "rows": [
            {k: v for k, v in r.items() if not k.startswith("_")} for r in rows]})
        for line in ["", *space_lines(data["spaces"][-1])]:
            say(line)
        say(f"({time.monotonic() - t0:.1f} s)\n")
    data["targets"] = targets(by_space)
    data["target_met"] = bool(data["targets"]) and all(t["met"] for t in data["targets"])
    for line in target_lines(data):
        say(line)
    data["wall_s"] = round(time.monotonic() - t0, 1)
    say(f"\n{data['wall_s']} s")
    return data


def target_lines(data: dict[str, Any]) -> list[str]:
    return [f"- {t['space']}: {t['what']}: guided {t['guided']}, tpe {t['tpe']}: "
            f"**{'met' if t['met'] else 'not met'}**" for t in data.get("targets", [])]


def render(data: dict[str, Any]) -> list[str]:
    """The Markdown block of RESULTS.md (``benchmarks/results.py``)."""
    stats = data.get("statistics", {})
    lines = [f"`python benchmarks/search_efficiency.py --seeds {data.get('seeds')} --noise "
             f"{data.get('noise')}`: the sim's steady-state surface, every strategy under "
             f"`statistics: {stats}` (races by the product's `Racer`), the guided path by "
             "`path_state` / `noted`. Reached: the configuration the strategy would report "
             "(tune's best, `best_trial`, guided included) within the tie margin of the "
             "optimum in true value; a launch is every measurement (a trial's first and each "
             "race replicate). `> N`: a seed that never reached it, N what it spent.", ""]
    for info in data.get("spaces", []):
        lines += [*space_lines(info), ""]
    lines += ["Targets:", "", *target_lines(data)]
    return lines


def results_targets(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    """The targets as ``benchmarks/results.py`` lists them."""
    return [(f"{t['space']}: {t['what']} (guided {t['guided']}, tpe {t['tpe']})",
             bool(t["met"])) for t in data.get("targets", [])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--noise", type=float, default=0.02,
                        help="sigma of the log-normal noise of a measurement (0: none)")
    parser.add_argument("--spaces", default="quick,large", help="quick, large")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    names = [n for n in args.spaces.split(",") if n]
    strategies = [s for s in args.strategies.split(",") if s]
    bad = [n for n in names if n not in spaces()] + [s for s in strategies
                                                     if s not in STRATEGIES]
    if args.seeds < 1 or args.noise < 0 or bad or not names or not strategies:
        print("search_efficiency.py: --seeds at least 1, --noise at least 0, --spaces of "
              f"quick, large, --strategies of {', '.join(STRATEGIES)}"
              + (f" (not known: {', '.join(bad)})" if bad else ""), file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    data = run(names, strategies, args.seeds, args.noise)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
