"""The guided path's decisions on trial records (``cleanslate.tune.notebook``): which step comes
next from the incumbent's verdict, kept or reverted, and the notebook's lines."""

from __future__ import annotations

from typing import Any

from cleanslate.bench import Bottleneck
from cleanslate.engines import relaxers
from cleanslate.store import GuidedStep, Race, Replicate, TrialRecord, TrialStatus
from cleanslate.tune.guided import batch_bound
from cleanslate.tune.notebook import deciding, judge, notebook_lines, path_state, step_line
from cleanslate.tune.study import StudySpec

BASE = {"max-running-requests": 64, "mem-fraction-static": 0.85}


def _spec(space: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None,
          **overrides: Any) -> StudySpec:
    """A guided study of the sim; by default a space with a flag no rule maps."""
    return StudySpec.model_validate({
        "name": "g", "engine": "sim", "model": "sim", "strategy": "guided",
        "concurrency": [256],
        "space": space or {"max-running-requests": [64, 128, 256],
                           "mem-fraction-static": [0.85, 0.88],
                           "enable-mixed-chunk": [False, True]},
        "baseline": baseline or {**BASE, "enable-mixed-chunk": False}, **overrides})


def _trial(number: int, params: dict[str, Any], value: float | None, verdict: str = "compute",
           guided: GuidedStep | None = None, **more: Any) -> TrialRecord:
    found = Bottleneck(verdict=verdict, confidence="clear",  # type: ignore[arg-type]
                       evidence=(f"{verdict} evidence",))
    return TrialRecord(study="g", number=number, params=params, value=value,
                       status=TrialStatus.FEASIBLE if value else TrialStatus.INFEASIBLE,
                       best_level="c=256", best_bottleneck=found, guided=guided, **more)


def test_the_baseline_comes_first_then_the_flag_that_relaxes_its_verdict() -> None:
    spec = _spec()
    base = {**BASE, "enable-mixed-chunk": False}
    first = path_state(spec, [])
    assert first.proposal is not None and first.proposal.params == base
    assert first.not_guided == ("enable-mixed-chunk",)
    baseline = _trial(0, base, 100.0, "running_cap",
                      GuidedStep(step=0, outcome="baseline", verdict="running_cap"))
    state = path_state(spec, [baseline])
    assert state.proposal is not None and state.incumbent is baseline
    step = state.proposal.step
    assert state.proposal.params == {**base, "max-running-requests": 128}
    assert (step.step, step.against, step.level, step.verdict, step.evidence) == (
        1, 0, "c=256", "running_cap", "running_cap evidence")
    assert (step.flag, step.old, step.new) == ("max-running-requests", 64, 128)
    # reverted: the next value in the same direction, from the same incumbent
    tried = _trial(1, state.proposal.params, 90.0, "kv_capacity",
                   step.model_copy(update={"outcome": "reverted"}))
    again = path_state(spec, [baseline, tried])
    assert again.proposal is not None and again.incumbent is baseline
    assert again.proposal.params["max-running-requests"] == 256
    assert again.proposal.step.step == 2
    # kept: the new incumbent's verdict (kv_capacity) leads to the memory fraction
    kept = tried.model_copy(update={"guided": step.model_copy(update={"outcome": "kept"})})
    moved = path_state(spec, [baseline, kept])
    assert moved.incumbent is not None and moved.incumbent.number == 1
    assert moved.proposal is not None and moved.proposal.step.verdict == "kv_capacity"
    assert moved.proposal.params == {**base, "max-running-requests": 128,
                                     "mem-fraction-static": 0.88}


def test_a_verdict_without_a_step_ends_the_path_or_hands_over_to_tpe() -> None:
    base = {**BASE, "enable-mixed-chunk": False}
    baseline = _trial(0, base, 100.0, "offered_load",
                      GuidedStep(step=0, outcome="baseline", verdict="offered_load"))
    ended = path_state(_spec(), [baseline])
    assert ended.proposal is None
    assert ended.ended == "offered_load at c=256 has no step left in the space"
    handed = path_state(_spec(guided={"then": "tpe"}), [baseline])
    assert handed.proposal is not None and handed.proposal.step.sampler
    assert handed.proposal.sample == ("enable-mixed-chunk",)
    assert "TPE over the flags not guided (enable-mixed-chunk)" in handed.proposal.step.why
    unknown = baseline.model_copy(update={"best_bottleneck": None})
    sampled = path_state(_spec(), [unknown])
    assert sampled.proposal is not None and sampled.proposal.step.sampler
    assert sampled.proposal.step.verdict == "unknown"
    assert sampled.proposal.sample == tuple(_spec().space)


def test_a_step_is_kept_on_a_win_or_a_simpler_tie_and_reverted_otherwise() -> None:
    spec = _spec(space={"max-running-requests": [64, 128]}, baseline={"max-running-requests": 64})
    base = _trial(0, {"max-running-requests": 64}, 100.0)
    changed = {"max-running-requests": 128}
    step = GuidedStep(step=1, against=0, flag="max-running-requests", old=64, new=128)

    def raced(outcome: str) -> TrialRecord:
        race = Race(against=0, outcome=outcome, diff=0.05, low=0.01, high=0.09, pairs=3)
        return _trial(1, changed, 105.0, races=(race,))

    assert judge(step, raced("win"), base, spec).outcome == "kept"
    win = judge(step, raced("win"), base, spec)
    assert (win.effect, win.low, win.high, win.pairs) == (0.05, 0.01, 0.09, 3)
    assert judge(step, raced("loss"), base, spec).outcome == "reverted"
    assert judge(step, raced("undecided"), base, spec).note == "undecided after 3 pairs"
    tie = judge(step, raced("tie"), base, spec)
    assert tie.outcome == "reverted" and "not simpler" in tie.note
    # a tie back towards the baseline (fewer flags changed) is kept
    back = judge(step, _trial(2, {"max-running-requests": 64}, 99.0, races=(
        Race(against=1, outcome="tie", diff=-0.01, low=-0.03, high=0.01, pairs=3),)),
        _trial(1, changed, 100.0), spec)
    assert back.outcome == "kept" and back.note == "a tie, with fewer flags changed"
    one = judge(step, _trial(1, changed, 110.0), base, spec)
    assert one.outcome == "kept" and one.note == "one run" and abs(one.effect - 0.1) < 1e-9
    noise = judge(step, _trial(1, changed, 102.0), base, spec)  # inside the 3 % tie margin
    assert noise.outcome == "reverted"
    assert noise.note == "one run, inside the tie margin: not simpler than the incumbent"
    crashed = judge(step, _trial(1, changed, None, cause="oom"), base, spec)
    assert crashed.outcome == "reverted" and "oom" in crashed.note


def test_the_notebook_reads_as_the_issue_writes_it() -> None:
    entry = GuidedStep(step=2, against=1, level="c=256", verdict="running_cap",
                       evidence="running 64 of cap 64, 190 waiting", flag="max-running-requests",
                       old=64, new=128, effect=0.382, low=0.310, high=0.454, pairs=3,
                       outcome="kept", note="won the race")
    assert step_line(entry) == (
        "step 2: running_cap at c=256 (running 64 of cap 64, 190 waiting) -> raise "
        "max-running-requests 64 -> 128: kept, +38.2 % [+31.0, +45.4] (won the race)")
    graphs = entry.model_copy(update={"flag": "disable-cuda-graph", "old": True, "new": False,
                                      "verdict": "compute", "effect": 0.02, "low": None,
                                      "high": None, "outcome": "reverted", "note": "one run"})
    assert "-> turn disable-cuda-graph off (true -> false): reverted, +2.0 % (one run)" in \
        step_line(graphs)
    spec = _spec(space={"max-running-requests": [64, 128]}, baseline={"max-running-requests": 64})
    lines = notebook_lines(spec, [
        _trial(0, {"max-running-requests": 64}, 100.0, "running_cap",
               GuidedStep(step=0, outcome="baseline", verdict="running_cap", level="c=256")),
        _trial(1, {"max-running-requests": 128}, 130.0, "compute", GuidedStep(
            step=1, against=0, verdict="running_cap", flag="max-running-requests", old=64,
            new=128, why="raise max-running-requests 64 -> 128: requests queue", effect=0.3,
            outcome="kept", note="one run"))])
    assert lines[0] == "not guided: none (a rule maps every flag of the space)"
    assert lines[1] == "step 0: the baseline: running_cap at c=256 (trial 0)"
    assert lines[2].endswith("kept, +30.0 % (one run) (trial 1)")
    assert lines[-2] == "the path ended: compute at c=256 has no step left in the space"
    assert lines[-1] == "incumbent: trial 1 (max-running-requests=128)"


def test_a_server_that_did_not_start_or_crashed_is_a_crash_with_its_cause() -> None:
    spec = _spec(space={"mem-fraction-static": [0.8, 0.85]},
                 baseline={"mem-fraction-static": 0.85})
    oom = TrialRecord(study="g", number=0, params={"mem-fraction-static": 0.85},
                      status=TrialStatus.INFEASIBLE, cause="oom", detail="CUDA out of memory")
    state = path_state(spec, [oom.model_copy(update={"guided": GuidedStep(
        step=0, outcome="baseline")})])
    assert state.proposal is not None and state.proposal.params == {"mem-fraction-static": 0.8}
    step = state.proposal.step
    assert (step.verdict, step.cause, step.evidence) == ("crashed", "oom", "CUDA out of memory")
    assert step_line(step).startswith("step 1: crashed (CUDA out of memory) -> lower "
                                      "mem-fraction-static 0.85 -> 0.8")
    crashed = oom.model_copy(update={"cause": "python_exception",
                                     "level_verdicts": {"c=256": "crashed"}})
    assert deciding(crashed) == ("c=256", "crashed", "python_exception", None)


#: The founding story's space on the sim (examples/guided.yaml).
STORY = {"max-running-requests": [64, 128, 256], "mem-fraction-static": [0.85, 0.88, 0.92],
         "disable-cuda-graph": [True, False], "cuda-graph-max-bs": [112, 160, 256]}
STORY_BASE = {"max-running-requests": 64, "mem-fraction-static": 0.85,
              "disable-cuda-graph": True, "cuda-graph-max-bs": 112}


def _kept(number: int, params: dict[str, Any], verdict: str, against: int) -> TrialRecord:
    return _trial(number, params, 100.0 + number, verdict,
                  GuidedStep(step=number, against=against, outcome="kept"))


def test_a_reverted_steps_own_verdict_is_followed_with_its_change() -> None:
    """Cap 256 lost to cap 128 because the KV cache then bound (the founding story's third
    step): the path does not end at "running_cap has no step left"; it gives the cache memory
    *with* the larger cap (step 4 carries cap 256 from trial 3), raced against the incumbent.
    (A space of the two capacity flags: with compute's flags in it, those come first.)"""
    space = {k: STORY[k] for k in ("max-running-requests", "mem-fraction-static")}
    base = {k: STORY_BASE[k] for k in space}
    spec = _spec(space=space, baseline=base)
    baseline = _trial(0, base, 100.0, "running_cap", GuidedStep(step=0, outcome="baseline"))
    one = _kept(1, {**base, "max-running-requests": 128}, "kv_capacity", 0)
    two = _kept(2, {**one.params, "mem-fraction-static": 0.88}, "running_cap", 1)
    three = _trial(3, {**two.params, "max-running-requests": 256}, 98.0, "kv_capacity",
                   GuidedStep(step=3, against=2, flag="max-running-requests", old=128,
                              new=256, outcome="reverted"))
    state = path_state(spec, [baseline, one, two, three])
    assert state.proposal is not None and state.incumbent is two
    step = state.proposal.step
    assert state.proposal.params == {"max-running-requests": 256, "mem-fraction-static": 0.92}
    assert (step.step, step.against, step.base, step.verdict) == (4, 2, 3, "kv_capacity")
    assert (step.flag, step.old, step.new) == ("mem-fraction-static", 0.88, 0.92)
    assert step.carried == {"max-running-requests": 256}
    assert "from step 3 (trial 3, reverted), whose own verdict this is" in step.why
    assert step_line(step) == ("step 4: kv_capacity at c=256 of trial 3 (kv_capacity evidence) "
                               "-> raise mem-fraction-static 0.88 -> 0.92 with "
                               "max-running-requests=256")
    # reverted too, still bound by the cache: lowering the cap back would undo the change it
    # builds on, and no memory is left: the path ends
    four = _trial(4, state.proposal.params, 99.0, "kv_capacity",
                  step.model_copy(update={"outcome": "reverted"}))
    ended = path_state(spec, [baseline, one, two, three, four])
    assert ended.proposal is None
    assert ended.ended == "running_cap at c=256 has no step left in the space"
    # kept: it is the incumbent, and the path goes on from its own verdict
    won = four.model_copy(update={"guided": step.model_copy(update={"outcome": "kept"})})
    moved = path_state(spec, [baseline, one, two, three, won])
    assert moved.incumbent is won
    lines = notebook_lines(spec, [baseline, one, two, three, won])
    assert any(line.startswith("  why: more GPU memory for the KV cache; with "
                               "max-running-requests=256 from step 3") for line in lines), lines
    assert any("with max-running-requests=256: kept" in line for line in lines), lines


def test_a_capacity_verdict_without_a_step_goes_on_to_faster_steps() -> None:
    """The cap binds at the largest value of the space: the batch is as large as it gets here,
    and compute's rows (CUDA graphs on) come next, said so."""
    incumbent = {**STORY_BASE, "max-running-requests": 256}
    spec = _spec(space=STORY, baseline=incumbent)
    baseline = _trial(0, incumbent, 100.0, "running_cap", GuidedStep(step=0, outcome="baseline"))
    state = path_state(spec, [baseline])
    assert state.proposal is not None
    step = state.proposal.step
    assert (step.verdict, step.flag, step.new, step.base) == (
        "running_cap", "disable-cuda-graph", False, None)
    assert step.why.startswith("running_cap has no step left in the space, so the batch "
                               "cannot grow: compute is what is left; turn disable-cuda-graph "
                               "off")


def test_a_crashed_step_is_followed_before_the_incumbents_other_rows() -> None:
    """CUDA graphs on crashed at a batch beyond the captured ones (the founding story): the next
    step raises the captures *with* graphs on, before the compute rows that come after graphs
    (the graph limit alone, which changes nothing while graphs are off)."""
    spec = _spec(space=STORY, baseline=STORY_BASE)
    incumbent = _trial(0, {**STORY_BASE, "max-running-requests": 256}, 100.0, "compute",
                       GuidedStep(step=0, outcome="baseline"))
    spec = _spec(space=STORY, baseline=incumbent.params)
    state = path_state(spec, [incumbent])
    assert state.proposal is not None
    assert state.proposal.step.flag == "disable-cuda-graph"
    crash = TrialRecord(study="g", number=1, params=state.proposal.params,
                        status=TrialStatus.INFEASIBLE, cause="python_exception",
                        detail="RuntimeError: batch 256 beyond captured graphs",
                        level_verdicts={"c=256": "crashed"}, crashed_at="c=256",
                        guided=state.proposal.step.model_copy(update={"outcome": "reverted"}))
    after = path_state(spec, [incumbent, crash])
    assert after.proposal is not None
    step = after.proposal.step
    assert (step.verdict, step.cause, step.base) == ("crashed", "python_exception", 1)
    # the crash's own line, not what the client saw of it
    assert step.evidence == "RuntimeError: batch 256 beyond captured graphs"
    assert (step.flag, step.new, step.carried) == ("cuda-graph-max-bs", 160,
                                                   {"disable-cuda-graph": False})


def test_after_a_clear_loss_the_values_further_that_way_are_not_tried() -> None:
    """Lowering the cap 128 -> 64 lost beyond the noise: 32 is not measured; a tie going up
    does not stop the next value up."""
    space = {"max-running-requests": [32, 64, 128, 256, 512]}
    spec = _spec(space=space, baseline={"max-running-requests": 128})
    baseline = _trial(0, {"max-running-requests": 128}, 100.0, "kv_capacity",
                      GuidedStep(step=0, outcome="baseline"))
    down = _trial(1, {"max-running-requests": 64}, 80.0, "kv_capacity", GuidedStep(
        step=1, against=0, flag="max-running-requests", old=128, new=64, effect=-0.2,
        outcome="reverted", note="loss on its first pair, beyond the noise"))
    state = path_state(spec, [baseline, down])
    assert state.proposal is None, state.proposal
    assert state.ended == "kv_capacity at c=256 has no step left in the space"
    # single-shot: worse by more than the tie margin is a loss too
    one_run = down.model_copy(update={"guided": down.guided.model_copy(  # type: ignore[union-attr]
        update={"note": "one run"})})
    assert path_state(spec, [baseline, one_run]).proposal is None
    # a tie is not a loss: the next value that way is still tried
    tie = down.model_copy(update={"guided": down.guided.model_copy(  # type: ignore[union-attr]
        update={"effect": -0.01, "note": "a tie, and not simpler than the incumbent"})})
    nxt = path_state(spec, [baseline, tie]).proposal
    assert nxt is not None and nxt.params == {"max-running-requests": 32}


# -- what a step can add, and a race owed another look -----------------------------------------

CAPPED = {"max-running-requests": 128, "mem-fraction-static": 0.88,
          "disable-cuda-graph": True}
GRAPHS_SPACE = {"max-running-requests": [64, 128, 256], "mem-fraction-static": [0.85, 0.88],
                "disable-cuda-graph": [True, False]}


def _bound_trial(number: int, params: dict[str, Any], value: float | None, verdict: str,
                 figures: dict[str, float], guided: GuidedStep | None = None,
                 **more: Any) -> TrialRecord:
    found = Bottleneck(verdict=verdict, confidence="clear",  # type: ignore[arg-type]
                       evidence=(f"{verdict} evidence",), figures=figures)
    return TrialRecord(study="g", number=number, params=params, value=value,
                       status=TrialStatus.FEASIBLE, best_level="c=256", best_bottleneck=found,
                       guided=guided, **more)


def test_a_cap_the_full_cache_stops_at_is_tried_after_the_faster_steps() -> None:
    """The sim at cap 128 whose KV cache holds 129 (99 % full at the cap), a marginal gain of
    0.31 from c=32 to c=256: a cap of 256 lets the batch grow 128 -> 129, +0.2 % at most,
    inside the 5 % tie margin: CUDA graphs come first, the cap after them. Without a
    marginal gain (no level before with a smaller batch) nothing is deferred."""
    spec = _spec(space=GRAPHS_SPACE, baseline=CAPPED, statistics={"tie_margin": 0.05})
    figures = {"cap": 128, "running_mean": 128, "running_max": 128,
               "kv_usage_max": 128 / 129, "marginal_gain": 0.312}
    baseline = _bound_trial(0, CAPPED, 1745.0, "running_cap", figures,
                            GuidedStep(step=0, outcome="baseline", verdict="running_cap"))
    first = path_state(spec, [baseline])
    assert first.proposal is not None
    step = first.proposal.step
    assert (step.flag, step.old, step.new) == ("disable-cuda-graph", True, False)
    assert step.why.startswith(
        "running_cap's steps let the batch grow too little to matter (max-running-requests "
        "256: at most +0.2 %: the batch can grow 128 -> 129 (the KV cache 99% full at 128) at "
        "a marginal gain of 0.31, inside the tie margin of 5%): compute is what is left")
    graphs = _bound_trial(1, {**CAPPED, "disable-cuda-graph": False}, 1700.0, "running_cap",
                          figures, step.model_copy(update={"outcome": "reverted",
                                                           "note": "loss after 2 pairs"}))
    last = path_state(spec, [baseline, graphs])
    assert last.proposal is not None
    assert last.proposal.params == {**CAPPED, "max-running-requests": 256}
    assert last.proposal.step.why.endswith(
        "tried last: at most +0.2 %: the batch can grow 128 -> 129 (the KV cache 99% full at "
        "128) at a marginal gain of 0.31")
    blind = _bound_trial(0, CAPPED, 1745.0, "running_cap",
                         {k: v for k, v in figures.items() if k != "marginal_gain"},
                         GuidedStep(step=0, outcome="baseline", verdict="running_cap"))
    plain = path_state(spec, [blind])
    assert plain.proposal is not None
    assert plain.proposal.params == {**CAPPED, "max-running-requests": 256}


def test_the_bound_of_a_step_reads_the_cap_the_cache_and_the_marginal_gain() -> None:
    cap_row = next(r for r in relaxers("sglang") if r.verdict == "running_cap")
    mem_row = next(r for r in relaxers("sglang") if r.verdict == "kv_capacity"
                   and r.direction == "up")
    down_row = next(r for r in relaxers("sglang") if r.verdict == "kv_capacity"
                    and r.direction == "down")
    # cap 64 with room in the cache for 117: the batch can grow 64 -> 117 (not to 128)
    room = batch_bound("running_cap", cap_row, 64, 128, {
        "cap": 64, "running_mean": 64, "running_max": 64, "kv_usage_max": 64 / 117,
        "marginal_gain": 0.474})
    assert room is not None and round(room.to) == 117
    assert abs(room.gain - (117 / 64 - 1) * 0.474) < 1e-9  # +39 %: tried first
    # no KV figure: the new cap alone bounds it
    blind = batch_bound("running_cap", cap_row, 64, 128, {"cap": 64, "running_mean": 64,
                                                         "marginal_gain": 0.5})
    assert blind is not None and (blind.to, blind.gain) == (128, 0.5)
    # the cache full at 117 under a cap of 128: more memory grows the batch to 128 at most
    mem = batch_bound("kv_capacity", mem_row, 0.85, 0.88, {
        "cap": 128, "running_mean": 117, "marginal_gain": 0.331})
    assert mem is not None and abs(mem.gain - (128 / 117 - 1) * 0.331) < 1e-9
    assert mem.text() == ("at most +3.1 %: the batch can grow 117 -> 128 (the cap 128) at a "
                          "marginal gain of 0.33")
    # a lower cap does not grow the batch; without a marginal gain nothing is bounded
    assert batch_bound("kv_capacity", down_row, 128, 64, {
        "cap": 128, "running_mean": 117, "marginal_gain": 0.331}) is None
    assert batch_bound("kv_capacity", mem_row, 0.85, 0.88, {"cap": 128,
                                                            "running_mean": 117}) is None


def _raced(number: int, params: dict[str, Any], value: float, against: int, outcome: str,
           diff: float, low: float, high: float, pairs: int, step: GuidedStep,
           figures: dict[str, float]) -> TrialRecord:
    reps = tuple(Replicate(index=i, seed=i, status=TrialStatus.FEASIBLE,
                           value=value * (1 + 0.01 * ((i + number) % 3 - 1)), pair=i,
                           against=against) for i in range(pairs))
    return _bound_trial(number, params, value, "running_cap", figures,
                        step.model_copy(update={"outcome": "reverted", "effect": diff,
                                                "low": low, "high": high, "pairs": pairs,
                                                "note": f"{outcome} after {pairs} pairs"}),
                        replicates=reps, races=(Race(against=against, outcome=outcome,
                                                     diff=diff, low=low, high=high,
                                                     pairs=pairs),))


def test_an_undecided_gain_is_raced_once_more_once_the_noise_is_known() -> None:
    """The quick space's first race: CUDA graphs +12.9 % [-7.3, +37.5] after 3 pairs,
    undecided (the study's first race has only its own pairs for the noise). Once the other
    steps are measured and the races have given the noise 3 degrees of freedom, the same
    change is raced again, once; an undecided step under +5 % is not."""
    spec = _spec(space=GRAPHS_SPACE, baseline=CAPPED, statistics={"tie_margin": 0.05})
    figures = {"cap": 128, "running_mean": 128, "running_max": 128,
               "kv_usage_max": 128 / 129, "marginal_gain": 0.312}
    base_reps = tuple(Replicate(index=i, seed=i, status=TrialStatus.FEASIBLE,
                                value=1745.0 * (1 + 0.01 * (i % 2)), pair=i)
                      for i in range(4))
    baseline = _bound_trial(0, CAPPED, 1745.0, "running_cap", figures,
                            GuidedStep(step=0, outcome="baseline", verdict="running_cap"),
                            replicates=base_reps)
    step = path_state(spec, [baseline]).proposal
    assert step is not None and step.step.flag == "disable-cuda-graph"
    graphs = _raced(1, step.params, 1970.0, 0, "undecided", 0.129, -0.073, 0.375, 3,
                    step.step, figures)
    # the deferred cap comes next: a step is measured before a race is run again
    nxt = path_state(spec, [baseline, graphs]).proposal
    assert nxt is not None and nxt.params == {**CAPPED, "max-running-requests": 256}
    cap = _raced(2, nxt.params, 1750.0, 0, "undecided", 0.003, -0.05, 0.06, 2, nxt.step,
                 figures)
    again = path_state(spec, [baseline, graphs, cap]).proposal
    assert again is not None and again.params == graphs.params
    assert again.step.step == 3 and again.step.against == 0
    assert again.max_pairs == 2 * spec.statistics.max_replicates
    assert "raced again: step 1 (trial 1) measured +12.9 %, undecided after 3 pairs" in \
        again.step.why
    # raced twice: not a third time
    second = _raced(3, graphs.params, 1960.0, 0, "undecided", 0.11, -0.01, 0.24, 3,
                    again.step, figures)
    after = path_state(spec, [baseline, graphs, cap, second])
    assert after.proposal is None or after.proposal.params != graphs.params
