"""``strategy: guided``: the path from the baseline, one flag at a time, and its lab notebook.

The study starts at its baseline. After each trial the *incumbent* (the baseline, then the
last step that was kept) is read for its verdict at the level that decides the objective
(:func:`deciding`: the least load that missed an SLO, failed or crashed, else the best level
that met them; a server that crashed or did not start: its cause), and the engine's relaxers
(:func:`cleanslate.tune.guided.next_steps`) name the flags of the space that relax it, nearest
value first. The first step whose configuration has not been measured is the next trial; the
fleet races it against the incumbent with the study's statistics, and :func:`judge` keeps it
(a win; a tie with fewer flags changed from the baseline; one run better) or reverts it. A kept
step makes it the incumbent, whose verdict is read anew; a reverted one leaves the next step of
the same verdict. The path ends when the binding verdict has no step left (or the budget
does); ``guided: {then: tpe}`` hands the rest of the budget to TPE over the flags no rule maps,
the others held at the incumbent's values. A verdict ``unknown`` at the deciding level gets one
trial from the sampler, said so.

Every trial of the path carries its notebook entry (:class:`~cleanslate.store.GuidedStep` in
``TrialRecord.guided``): the verdict and its evidence, the change and why, the measured effect
with its interval (or one run), kept or reverted. The functions here are pure: they read trial
records and return decisions and lines; :class:`~cleanslate.tune.fleet.Fleet` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cleanslate.bench import Bottleneck
from cleanslate.stats import Outcome
from cleanslate.store import GuidedStep, TrialRecord, TrialStatus
from cleanslate.tune.guided import (
    Step,
    next_steps,
    not_guided,
    same_value,
    space_values,
)
from cleanslate.tune.race import MIN_POOLED_DF, pooled_noise
from cleanslate.tune.study import StudySpec

#: The outcomes of a notebook entry.
BASELINE, KEPT, REVERTED, RUNNING = "baseline", "kept", "reverted", "running"


@dataclass(frozen=True)
class Proposal:
    """The next trial of a guided study: ``params`` (the whole configuration) and its notebook
    entry (outcome ``running``). ``sample``: the flags the sampler picks (the entry says so);
    the others are held at ``params``' values. ``max_pairs``: how many pairs its race may run
    (``None``: the study's ``max_replicates``; a step raced again gets twice that)."""

    params: dict[str, Any]
    step: GuidedStep
    sample: tuple[str, ...] = ()
    max_pairs: int | None = None


@dataclass(frozen=True)
class PathState:
    """Where a guided study stands: its baseline trial (``None`` before it has a result), the
    incumbent, the notebook so far (finished trials in order), and the next proposal, or
    ``None`` with ``ended`` saying why the path ends; ``not_guided``: the flags of the space no
    relax row names; ``next_step``: the number of the next notebook entry."""

    baseline: TrialRecord | None
    incumbent: TrialRecord | None
    entries: tuple[TrialRecord, ...] = ()
    proposal: Proposal | None = None
    ended: str = ""
    not_guided: tuple[str, ...] = field(default_factory=tuple)
    next_step: int = 0


def _last_records(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Each trial number's last record, finished ones only, in number order."""
    last: dict[int, TrialRecord] = {}
    for record in trials:
        last[record.number] = record
    return [last[n] for n in sorted(last) if last[n].status.finished]


def deciding(trial: TrialRecord) -> tuple[str | None, str, str | None, Bottleneck | None]:
    """The level that decides ``trial``'s objective and its verdict: ``(level, verdict,
    cause, bottleneck)``. The least load that missed an SLO, failed or crashed
    (``limit_bottleneck``) when there is one, else the best level's (``best_bottleneck``); a
    server that crashed or did not start without a verdict there: ``crashed`` with the
    trial's cause; nothing known: ``unknown``."""
    crash_cause = trial.cause if trial.status == TrialStatus.INFEASIBLE else None
    if trial.limit_bottleneck is not None:
        found = trial.limit_bottleneck
        cause = crash_cause if found.verdict == "crashed" else None
        return trial.limit_level, found.verdict, cause, found
    if trial.best_bottleneck is not None:
        return trial.best_level, trial.best_bottleneck.verdict, None, trial.best_bottleneck
    if trial.status == TrialStatus.INFEASIBLE and trial.cause and (
            trial.crashed_at is not None or not trial.levels):
        return trial.crashed_at, "crashed", trial.cause, None
    return trial.best_level, "unknown", None, None


def overrides(params: Mapping[str, Any], baseline: Mapping[str, Any]) -> int:
    """How many flags of ``params`` differ from the baseline's values."""
    return sum(1 for name, value in params.items() if baseline.get(name) != value)


def _key(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, repr(value)) for name, value in params.items()))


def _entry_for(trial: TrialRecord, number: int, verdict: tuple[str | None, str, str | None,
               Bottleneck | None]) -> GuidedStep:
    level, kind, cause, found = verdict
    evidence = found.evidence[0] if found is not None and found.evidence else ""
    if kind == "crashed" and trial.detail:
        # the crash's own line from the log ("AttributeError: ..."), not what the client saw
        # of it ("server unreachable")
        evidence = trial.detail[:200]
    if not evidence and cause:
        evidence = cause
    return GuidedStep(step=number, against=trial.number, level=level, verdict=kind,
                      evidence=evidence, cause=cause)


def path_state(spec: StudySpec, trials: Sequence[TrialRecord]) -> PathState:
    """Replay the notebook of ``trials`` (a guided study's records, any order) and say what
    comes next (:class:`PathState`). Pure: the same records give the same answer, so a study
    that resumes goes on where it stopped."""
    space = space_values(spec)
    unguided = tuple(not_guided(space, spec.engine))
    base_params = {name: spec.baseline[name] for name in spec.space}
    done = _last_records(trials)
    baseline = next((t for t in done if t.params == base_params), None)
    if baseline is None:
        return PathState(baseline=None, incumbent=None,
                         proposal=Proposal(dict(base_params), GuidedStep(
                             step=0, outcome=RUNNING, why="the baseline")),
                         not_guided=unguided)
    incumbent = baseline
    entries = tuple(t for t in done if t.guided is not None)
    for t in entries:
        if t.guided is not None and t.guided.outcome == KEPT:
            incumbent = t
    measured = {_key(t.params) for t in done}
    number = 1 + max((t.guided.step for t in entries if t.guided is not None), default=0)
    verdict = deciding(incumbent)
    head = _entry_for(incumbent, number, verdict)
    current = {name: incumbent.params.get(name, base_params[name]) for name in spec.space}
    state = PathState(baseline=baseline, incumbent=incumbent, entries=entries,
                      not_guided=unguided, next_step=number)
    if verdict[1] == "unknown":
        tried_here = [t for t in entries if t.guided is not None and t.guided.sampler
                      and t.guided.against == incumbent.number and t.guided.verdict == "unknown"]
        if tried_here:
            return _fallback(spec, state, head, current, unguided,
                             f"the verdict at {verdict[0] or 'the deciding level'} is unknown "
                             "and its sampler trial was reverted")
        return replace(state, proposal=Proposal(current, head.model_copy(update={
            "sampler": True, "outcome": RUNNING,
            "why": "verdict unknown at the deciding level: one trial from the sampler"}),
            sample=tuple(spec.space)))
    # Tried: the steps taken from this incumbent, and those reverted under the same verdict
    # from an earlier one (the operator's "raising the cap did not help": a later incumbent
    # bound by the same thing does not try it again; what its own verdict asked for is
    # followed with it instead, below); not those whose race said nothing (undecided).
    tried = [(t.guided.flag, t.guided.new) for t in entries
             if t.guided is not None and t.guided.flag is not None and t.guided.base is None
             and (t.guided.against == incumbent.number
                  or (t.guided.outcome == REVERTED and t.guided.verdict == verdict[1]
                      and not t.guided.note.startswith("undecided")))]
    reverted = _reverted_bases(entries, incumbent, current)
    # A step that crashed is followed first: its crash names what the change needs (CUDA
    # graphs that crash at a batch beyond the captured ones need the captures raised).
    found = _follow([r for r in reverted if deciding(r)[1] == "crashed"], spec, space,
                    current, entries, measured, number)
    if found is None:
        figures = verdict[3].figures if verdict[3] is not None else None
        own = next_steps(verdict[1], verdict[2], space, current, spec.engine, tried=tried,
                         figures=figures)
        # a step whose batch can grow too little to matter (the cache full at the cap, a cap
        # just above the batch) is tried after the others: the operator's "raising the cap
        # cannot help, the cache is full at it"
        margin = spec.statistics.tie_margin
        small = [s for s in own if s.bound is not None and s.bound.gain < margin]
        steps = [s for s in own if s not in small]
        then = THEN.get(verdict[1])
        if then is not None:  # the batch can grow no further here: faster steps are left
            why = (f"{verdict[1]} has no step left in the space, so the batch cannot grow"
                   if not small else
                   f"{verdict[1]}'s steps let the batch grow too little to matter "
                   f"({_bounds_text(small)}, inside the tie margin of {margin:.0%})")
            steps += [replace(step, why=f"{why}: {then} is what is left; {step.why}")
                      for step in next_steps(then, None, space, current, spec.engine,
                                             tried=tried, figures=figures)]
        lost = _lost_directions(entries, incumbent.number, verdict[1],
                                1.0 if spec.objective.direction == "maximize" else -1.0)
        steps = [s for s in steps if _key({**current, s.flag: s.new}) not in measured
                 and not _beyond_a_loss(s.flag, s.old, s.new, lost)]
        small = [s for s in small if _key({**current, s.flag: s.new}) not in measured
                 and not _beyond_a_loss(s.flag, s.old, s.new, lost)]
        if not steps:  # the steps that can matter are measured: one undecided gain again
            again = _race_again(spec, done, entries, incumbent, number)
            if again is not None:
                return replace(state, proposal=again)
        candidates = [*steps, *(replace(s, why=f"{s.why}; tried last: {s.bound.text()}")
                                for s in small if s.bound is not None)]
        if candidates:
            first = candidates[0]
            return replace(state, proposal=Proposal(
                {**current, first.flag: first.new}, head.model_copy(update={
                    "flag": first.flag, "old": first.old, "new": first.new,
                    "why": first.why, "outcome": RUNNING})))
        # the most promising first: the reverted step that measured best (undecided +10 %
        # before a tie at +0.1 %), the newest first among equals
        rest = sorted((r for r in reverted if deciding(r)[1] != "crashed"),
                      key=lambda r: -_gain(r, spec))
        found = _follow(rest, spec, space, current, entries, measured, number)
    if found is not None:
        return replace(state, proposal=found)
    where = f" at {verdict[0]}" if verdict[0] else ""
    return _fallback(spec, state, head, current, unguided,
                     f"{verdict[1]}{where} has no step left in the space")


def _race_again(spec: StudySpec, done: Sequence[TrialRecord], entries: Sequence[TrialRecord],
                incumbent: TrialRecord, number: int) -> Proposal | None:
    """A step from ``incumbent`` whose race ended undecided with a measured gain of at least
    the tie margin, raced once more as a new trial now that the study's own noise is known
    (:data:`~cleanslate.tune.race.MIN_POOLED_DF` degrees of freedom from its races): a
    study's first race has only its own pairs to judge the noise by, and three pairs of +13 %
    left an interval of [-7 %, +38 %] on the sim. The second race may run twice the study's
    ``max_replicates`` pairs (:attr:`Proposal.max_pairs`). Each change races at most twice (the
    chance of a false win at most doubles); ``None`` when no step is owed one."""
    margin = math.log1p(spec.statistics.tie_margin)
    counts: dict[tuple[tuple[str, str], ...], int] = {}
    for t in done:
        counts[_key(t.params)] = counts.get(_key(t.params), 0) + 1
    best: tuple[float, TrialRecord] | None = None
    for t in entries:
        g = t.guided
        if (g is None or g.sampler or g.outcome != REVERTED or g.against != incumbent.number
                or not g.note.startswith("undecided") or g.effect is None
                or counts.get(_key(t.params), 0) > 1):
            continue
        gain = _gain(t, spec)
        if gain <= -1 or math.log1p(gain) < margin:
            continue
        if best is None or gain > best[0]:
            best = (gain, t)
    if best is None or pooled_noise(done)[1] < MIN_POOLED_DF:
        return None
    gain, t = best
    g = t.guided
    assert g is not None
    pairs = 2 * spec.statistics.max_replicates
    why = (f"{g.why}; raced again: step {g.step} (trial {t.number}) measured {gain * 100:+.1f} "
           f"%, undecided after {g.pairs} pairs; now with up to {pairs} pairs")
    entry = GuidedStep(step=number, against=incumbent.number, level=g.level, verdict=g.verdict,
                       evidence=g.evidence, cause=g.cause, flag=g.flag, old=g.old, new=g.new,
                       why=why, outcome=RUNNING, base=g.base, carried=dict(g.carried))
    return Proposal(dict(t.params), entry, max_pairs=pairs)


def _bounds_text(steps: Sequence[Step]) -> str:
    """``max-running-requests 256: at most +0.2 %: ...`` for each step with a bound."""
    return "; ".join(f"{s.flag} {_value(s.new)}: {s.bound.text()}" for s in steps
                     if s.bound is not None)


#: The verdict whose rows come next once a verdict's own have no step left in the space: a
#: batch held by the cap or the cache that can grow no further still gains from faster steps.
THEN = {"running_cap": "compute", "kv_capacity": "compute"}

#: A step built on reverted ones changes at most this many flags from the incumbent: the path
#: stays one variable at a time, plus what the variable needs to show its effect.
MAX_CHANGED = 3


def _changed(params: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The flags of ``params`` whose values differ from ``current``'s."""
    return {name: value for name, value in params.items()
            if not same_value(value, current.get(name))}


def _direction(old: Any, new: Any) -> int:
    """+1 up, -1 down, 0 for values that are not both numbers (booleans are not)."""
    if isinstance(old, bool) or isinstance(new, bool) or not isinstance(
            old, int | float) or not isinstance(new, int | float):
        return 0
    return (new > old) - (new < old)


def _lost_directions(entries: Sequence[TrialRecord], against: int, verdict: str,
                     sign: float) -> set[tuple[str, int]]:
    """``(flag, direction)`` of the steps from incumbent ``against`` (or from an earlier one
    bound by the same ``verdict``, as for what is tried) that lost beyond the noise (a race's
    loss, a loss on the first pair, or single-shot a value worse by more than the tie
    margin): the values further that way are not tried (lowering the cap to 64 lost
    18 %: 32 is not measured). ``sign``: 1 for a maximized objective, -1 for a minimized one
    (where a positive effect is the loss)."""
    lost = set()
    for t in entries:
        g = t.guided
        if (g is not None and g.flag is not None and g.base is None
                and (g.against == against or g.verdict == verdict)
                and g.outcome == REVERTED and g.effect is not None and g.effect * sign < 0
                and (g.note.startswith("loss")  # beyond the tie margin, single-shot too:
                     or (g.note.startswith(("one run", "means of"))
                         and "inside the tie margin" not in g.note))):
            direction = _direction(g.old, g.new)
            if direction:
                lost.add((g.flag, direction))
    return lost


def _beyond_a_loss(flag: str, old: Any, new: Any, lost: set[tuple[str, int]]) -> bool:
    direction = _direction(old, new)
    return bool(direction) and (flag, direction) in lost


def _gain(trial: TrialRecord, spec: StudySpec) -> float:
    """A reverted step's measured effect in the objective's direction (``-inf`` without
    one)."""
    effect = trial.guided.effect if trial.guided is not None else None
    if effect is None:
        return float("-inf")
    return effect if spec.objective.direction == "maximize" else -effect


def _reverted_bases(entries: Sequence[TrialRecord], incumbent: TrialRecord,
                    current: Mapping[str, Any]) -> list[TrialRecord]:
    """The steps tried against ``incumbent`` and reverted (not the sampler's), newest first,
    that changed fewer than :data:`MAX_CHANGED` flags from it: the ones whose own verdict a
    next step may follow."""
    found = [t for t in entries if t.guided is not None and t.guided.outcome == REVERTED
             and not t.guided.sampler and t.guided.against == incumbent.number
             and 0 < len(_changed(t.params, current)) < MAX_CHANGED]
    return found[::-1]


def _follow(bases: Sequence[TrialRecord], spec: StudySpec,
            space: Mapping[str, Sequence[Any]], current: Mapping[str, Any],
            entries: Sequence[TrialRecord], measured: set[tuple[tuple[str, str], ...]],
            number: int) -> Proposal | None:
    """The first step that relaxes a reverted step's own verdict on top of its change (the
    operator's "the cap did not help because the cache then bound: give the cache memory with
    the larger cap"), raced against the incumbent; ``None`` when no base has one left. The
    entry says the base trial and the changes it carries."""
    for base in bases:
        verdict = deciding(base)
        kind, cause = verdict[1], verdict[2]
        if kind == "unknown" or base.guided is None:
            continue
        here = {name: base.params.get(name, current[name]) for name in current}
        tried = [(t.guided.flag, t.guided.new) for t in entries
                 if t.guided is not None and t.guided.flag is not None
                 and t.guided.base == base.number]
        found = verdict[3]
        for candidate in next_steps(kind, cause, space, here, spec.engine, tried=tried,
                                    figures=found.figures if found is not None else None):
            params = {**here, candidate.flag: candidate.new}
            carried = {k: v for k, v in _changed(params, current).items()
                       if k != candidate.flag}
            undoes = candidate.flag in _changed(base.params, current) and same_value(
                candidate.new, current.get(candidate.flag))
            if (_key(params) in measured or not carried or undoes
                    or len(_changed(params, current)) > MAX_CHANGED):
                continue
            with_ = ", ".join(f"{k}={_value(v)}" for k, v in carried.items())
            why = (f"{candidate.why}; with {with_} from step {base.guided.step} (trial "
                   f"{base.number}, reverted), whose own verdict this is")
            entry = _entry_for(base, number, verdict).model_copy(update={
                "against": base.guided.against, "flag": candidate.flag,
                "old": candidate.old, "new": candidate.new, "why": why, "outcome": RUNNING,
                "base": base.number, "carried": carried})
            return Proposal(params, entry)
    return None


def _fallback(spec: StudySpec, state: PathState, head: GuidedStep, current: dict[str, Any],
              unguided: tuple[str, ...], why: str) -> PathState:
    """The path's end, or with ``guided: {then: tpe}`` and flags no rule maps, one TPE trial
    over those (the guided flags at the incumbent's values)."""
    sample = tuple(name for name in spec.space if name in unguided)
    if spec.guided.then == "tpe" and sample:
        return replace(state, proposal=Proposal(current, head.model_copy(update={
            "sampler": True, "outcome": RUNNING,
            "why": f"{why}: TPE over the flags not guided ({', '.join(sample)})"}),
            sample=sample))
    return replace(state, ended=why)


def judge(step: GuidedStep, challenger: TrialRecord, incumbent: TrialRecord | None,
          spec: StudySpec) -> GuidedStep:
    """The notebook entry of ``challenger`` once measured (and raced): the effect against the
    incumbent with its interval, and ``kept`` or ``reverted`` with why. Kept: a race won, a
    tie with fewer flags changed from the baseline than the incumbent's, or (no paired race
    against the incumbent) a value better by more than the tie margin (within it: kept only
    when simpler, as a tie), said "one run" (or the number of runs of each); feasible where
    the incumbent was not. Everything else is reverted."""
    if step.outcome == BASELINE or incumbent is None:
        return step.model_copy(update={"outcome": BASELINE, "note": "the starting point"})
    base = {name: spec.baseline[name] for name in spec.space}
    feasible = challenger.status == TrialStatus.FEASIBLE
    if not feasible:
        what = challenger.crash_text or f"{challenger.status} ({challenger.cause})"
        return step.model_copy(update={"outcome": REVERTED, "note": what})
    if incumbent.status != TrialStatus.FEASIBLE or incumbent.value is None:
        return step.model_copy(update={"outcome": KEPT,
                                       "note": "feasible where the incumbent was not"})
    race = next((r for r in reversed(challenger.races) if r.against == incumbent.number), None)
    simpler = overrides(challenger.params, base) < overrides(incumbent.params, base)
    if race is not None and race.pairs >= 2:
        update: dict[str, Any] = {"effect": race.diff, "low": race.low, "high": race.high,
                                  "pairs": race.pairs}
        if race.outcome == Outcome.WIN:
            return step.model_copy(update={**update, "outcome": KEPT, "note": "won the race"})
        if race.outcome == Outcome.TIE:
            return step.model_copy(update={
                **update, "outcome": KEPT if simpler else REVERTED,
                "note": "a tie, with fewer flags changed" if simpler else
                "a tie, and not simpler than the incumbent"})
        return step.model_copy(update={**update, "outcome": REVERTED,
                                       "note": f"{race.outcome} after {race.pairs} pairs"})
    if challenger.value is None:
        return step.model_copy(update={"outcome": REVERTED, "note": "no value"})
    effect = challenger.value / incumbent.value - 1 if incumbent.value else 0.0
    gain = effect if spec.objective.direction == "maximize" else -effect
    runs = (challenger.n_replicates, incumbent.n_replicates)
    said = "one run" if runs == (1, 1) else f"means of {runs[0]} and {runs[1]} runs, unpaired"
    if race is not None:  # a loss beyond the noise, decided on its first pair
        said = f"{race.outcome} on its first pair, beyond the noise"
        kept = False
    elif abs(gain) <= spec.statistics.tie_margin:
        # inside the tie margin the simpler configuration stays, as a race's tie would
        kept = simpler
        said += (", inside the tie margin: fewer flags changed" if simpler else
                 ", inside the tie margin: not simpler than the incumbent")
    else:
        kept = gain > 0
    return step.model_copy(update={"effect": effect, "pairs": 1 if race else 0,
                                   "outcome": KEPT if kept else REVERTED, "note": said})


def noted(spec: StudySpec, record: TrialRecord, others: Sequence[TrialRecord],
          step: GuidedStep | None) -> tuple[TrialRecord, str]:
    """``record`` (a guided study's trial, measured and raced) with its notebook entry, and
    the entry's line. ``others``: the study's other records (the path as it stood before this
    trial); ``step``: the entry it was proposed with (``None`` for a configuration re-queued
    by an earlier run: matched against the path's proposal, else written as a re-run)."""
    state = path_state(spec, others)
    if step is None:
        if state.proposal is not None and state.proposal.params == record.params:
            step = state.proposal.step
        else:
            step = GuidedStep(step=state.next_step, outcome=RUNNING,
                              against=state.incumbent.number if state.incumbent else None,
                              why="a configuration re-queued by an earlier run")
    if step.step == 0 or state.incumbent is None:
        entry = _entry_for(record, 0, deciding(record)).model_copy(update={
            "against": None, "outcome": BASELINE, "note": "the starting point"})
    else:
        entry = judge(step, record, state.incumbent, spec)
    record = record.model_copy(update={"guided": entry})
    return record, step_line(entry, record.params if entry.sampler else None)


def not_guided_line(spec: StudySpec) -> str:
    """``not guided: FLAG, ...`` (the flags of the space no rule of the engine maps, and what
    covers them), said before the first trial."""
    names = not_guided(space_values(spec), spec.engine)
    if not names:
        return "not guided: none (a rule maps every flag of the space)"
    cover = ("TPE once the rules have no step left" if spec.guided.then == "tpe" else
             "untried unless a verdict is unknown (guided: {then: tpe} hands them to TPE)")
    return f"not guided: {', '.join(names)} ({cover})"


def _value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def change_text(step: GuidedStep) -> str:
    """``raise max-running-requests 64 -> 128`` (``lower``, ``set``; a boolean: ``turn
    disable-cuda-graph off (true -> false)``); a step built on a reverted one adds what it
    carries: ``raise mem-fraction-static 0.88 -> 0.92 with max-running-requests=256``."""
    text = _one_change(step)
    if step.carried:
        text += " with " + ", ".join(f"{k}={_value(v)}" for k, v in step.carried.items())
    return text


def _one_change(step: GuidedStep) -> str:
    old, new = step.old, step.new
    if isinstance(new, bool):
        # the flag's value as written, not the feature it names (disable-cuda-graph off)
        return f"turn {step.flag} {'on' if new else 'off'} ({_value(old)} -> {_value(new)})"
    if isinstance(old, int | float) and isinstance(new, int | float):
        word = "raise" if new > old else "lower"
    else:
        word = "set"
    return f"{word} {step.flag} {_value(old)} -> {_value(new)}"


def effect_text(step: GuidedStep) -> str:
    """``+38.2 % [+31.0, +45.4]``, or ``+3.1 % (one run)``; empty without an effect."""
    if step.effect is None:
        return ""
    text = f"{step.effect * 100:+.1f} %"
    if step.low is not None and step.high is not None:
        return f"{text} [{step.low * 100:+.1f}, {step.high * 100:+.1f}]"
    return f"{text} ({step.note})" if step.note else text


def step_line(step: GuidedStep, params: Mapping[str, Any] | None = None) -> str:
    """One notebook line: ``step 2: running_cap at c=256 (running 64 of cap 64, 190
    waiting) -> raise max-running-requests 64 -> 128: kept, +38.2 % [+31.0, +45.4]``."""
    where = f" at {step.level}" if step.level else ""
    cause = f" ({step.cause})" if step.cause and not step.evidence else ""
    evidence = f" ({step.evidence})" if step.evidence else cause
    if step.outcome == BASELINE or step.step == 0:
        head = f"step 0: the baseline: {step.verdict or 'measured'}{where}{evidence}"
        return head
    if step.sampler:
        sampled = ", ".join(f"{k}={_value(v)}" for k, v in (params or {}).items())
        change = f"the sampler's {sampled}" if sampled else "the sampler"
        change += f" ({step.why})" if step.why else ""
    else:
        change = change_text(step)
    of = f" of trial {step.base}" if step.base is not None else ""
    line = f"step {step.step}: {step.verdict}{where}{of}{evidence} -> {change}"
    if step.outcome == RUNNING:
        return line
    effect = effect_text(step)
    tail = f"{step.outcome}, {effect}" if effect else f"{step.outcome} ({step.note})"
    if effect and step.low is not None:
        tail += f" ({step.note})" if step.note else ""
    return f"{line}: {tail}"


def notebook_lines(spec: StudySpec, trials: Sequence[TrialRecord]) -> list[str]:
    """The whole notebook of a guided study: the flags not guided, each step's line with its
    trial, and where the path stands (ended, and why; or the next step)."""
    state = path_state(spec, trials)
    lines = [not_guided_line(spec)]
    for t in state.entries:
        if t.guided is not None:
            lines.append(f"{step_line(t.guided, t.params if t.guided.sampler else None)} "
                         f"(trial {t.number})")
            if t.guided.why and t.guided.flag is not None:
                why = t.guided.why.removeprefix(f"{_one_change(t.guided)}: ")
                lines.append(f"  why: {why}")
    if state.ended:
        lines.append(f"the path ended: {state.ended}")
    if state.incumbent is not None:
        changed = {k: v for k, v in state.incumbent.params.items()
                   if spec.baseline.get(k) != v}
        what = ", ".join(f"{k}={_value(v)}" for k, v in changed.items()) or "the baseline"
        lines.append(f"incumbent: trial {state.incumbent.number} ({what})")
    return lines


__all__ = ["BASELINE", "KEPT", "REVERTED", "RUNNING", "PathState", "Proposal", "change_text",
           "deciding", "effect_text", "judge", "not_guided_line", "notebook_lines", "noted",
           "overrides", "path_state", "step_line"]
