"""``cleanslate tune``: run a study over a search space, with every state verified.

Options -> the study file (:func:`~cleanslate.tune.study.load_study`) -> one library call,
:func:`~cleanslate.tune.controller.run_study` (or, with ``--check``, the plan) -> rendering.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cleanslate.cli._common import console, console_err
from cleanslate.cli._options import GpuBackendOption, JsonOption, StoreOption, named_host
from cleanslate.cli._render import render_report
from cleanslate.errors import ExitCode, InputError
from cleanslate.hosts import executor_for
from cleanslate.tune.view import TuneView

if TYPE_CHECKING:  # Optuna and SQLAlchemy are imported when the command runs
    from cleanslate.cli._documents import TunePlan
    from cleanslate.store import Store, TrialRecord
    from cleanslate.tune.controller import StudyOutcome
    from cleanslate.tune.estimate import StudyEstimate
    from cleanslate.tune.study import StudySpec
    from cleanslate.verdict.baseline import Baseline


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


class ConsoleView(TuneView):
    """Progress as lines on the console: trial i of N, phase, level, best so far."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.prefix = ""

    def study_started(self, spec: StudySpec, total: int, done: int) -> None:
        if self.quiet:
            return
        console.print(f"[bold]study {escape(spec.name)}[/]: {spec.strategy} over "
                      f"{escape(', '.join(spec.space))}; {total} trials"
                      + (f", {done} already done (resuming)" if done else ""))

    def trial_started(self, index: int, total: int, number: int,
                      params: dict[str, Any]) -> None:
        self.prefix = f"trial {index}/{total}"
        if not self.quiet:
            console.print(f"[bold cyan]{self.prefix}[/] (#{number}) {escape(_params(params))}")

    def phase(self, message: str) -> None:
        if not self.quiet:
            console.print(f"  [dim]{escape(message)}[/]")

    def trial_finished(self, record: TrialRecord, best: TrialRecord | None) -> None:
        from cleanslate.store import TrialStatus

        if self.quiet:
            return
        crash = record.crash_text
        if crash is not None and record.status is TrialStatus.FEASIBLE:
            # a capacity search's answer below its crash stands: the crash first, then it
            from cleanslate.report import bracket_text

            line = f"  [red]{escape(crash)}[/]; [green]feasible[/]"
            if record.capacity is not None:
                line += f" {escape(bracket_text(record.capacity))}"
                if record.value != record.capacity.capacity:  # max_goodput
                    line += f": {record.value:,.1f}"
        elif crash is not None:  # the crash first; a value kept from the levels below it after
            line = f"  [red]{escape(crash)}[/]: {escape((record.detail or '')[:160])}"
            if record.value is not None:
                from cleanslate.cli._stats import value_text

                line += (f"  [dim]| {value_text(record)} at {record.best_level} before "
                         "the crash[/]")
        elif record.status is TrialStatus.FEASIBLE and record.capacity is not None:
            from cleanslate.report import bracket_text

            line = f"  [green]feasible[/] {escape(bracket_text(record.capacity))}"
            if record.value != record.capacity.capacity:  # max_goodput
                line += f": {record.value:,.1f}"
        elif record.status is TrialStatus.FEASIBLE:
            from cleanslate.cli._stats import value_text

            line = f"  [green]feasible[/] {value_text(record)} at {record.best_level}"
        else:
            line = (f"  [red]{escape(record.status)}[/] ({escape(str(record.cause))}): "
                    f"{escape((record.detail or '')[:160])}")
        from cleanslate.report import bound_cell

        bound = bound_cell(record)
        if bound != "-":  # the verdicts quote the server's configuration: escaped
            line += f"  [dim]| bound by {escape(bound)}[/]"
        if best is not None:
            from cleanslate.cli._stats import value_text

            line += f"  [dim]| best so far {value_text(best)} (trial {best.number})[/]"
        console.print(line, highlight=False)


def tune(
    study_file: Annotated[Path, typer.Argument(help="The study file (YAML).")],
    store_url: StoreOption = None,
    resume: Annotated[bool, typer.Option(
        "--resume/--no-resume", help="Resume a study of the same name (the default).")] = True,
    host: Annotated[str | None, typer.Option(
        callback=named_host, help="Host, overriding the study's host: and hosts:.")] = None,
    gpu_backend: GpuBackendOption = "auto",
    json_out: JsonOption = False,
    check: Annotated[bool, typer.Option(
        "--check", help="Validate the study (file and flags) and print its plan; launch "
        "nothing and leave the store alone.")] = False,
    register: Annotated[bool, typer.Option(
        "--register", help="Validate the study and record it in the store for workers "
        "started elsewhere (cleanslate worker, a Kubernetes Job); run no trial here.")
    ] = False,
    baseline: Annotated[Path | None, typer.Option(
        "--baseline", help="Compare every check before and after a trial with an idle-state "
        "baseline saved by `cleanslate check --save-baseline FILE` on the study's host (a "
        "shared host): what was there then (GPU memory in use, device-file holders, /dev/shm "
        "entries) is accepted; a listener new since then, a process on the study's port and "
        "an engine's process are not.")] = None,
) -> None:
    """Run a study: every trial is verify -> launch -> ready -> smoke -> levels -> teardown ->
    verify, recorded in the store. Rerunning the same study resumes it."""
    if check and register:
        raise InputError("--check and --register cannot be given together: --check leaves the "
                         "store alone, --register writes the study to it", where="--register",
                         hint="run --check first, then --register")
    from cleanslate.tune import load_study, run_study, validate_study_flags
    from cleanslate.tune.controller import check_slot_hosts

    spec, root = load_study(study_file)
    if host is not None:  # one host instead of the study's host or hosts
        spec = spec.model_copy(update={"host": host, "hosts": None})
    check_slot_hosts(spec)  # before the store is opened: bad input writes nothing
    if register and baseline is not None:
        raise InputError("--baseline applies to the trials this command runs, and --register "
                         "runs none", where="--baseline",
                         hint="give each worker its host's: cleanslate worker --baseline FILE")
    host_baseline = _load_baseline(baseline, spec)
    if not register:  # a model path that is not on the host: before any launch (workers
        # started elsewhere check theirs)
        from cleanslate.tune.controller import check_model_paths, model_where

        asyncio.run(check_model_paths(spec, model_where(root, study_file)))
    if check:
        from cleanslate.cli._documents import TunePlan, emit

        note = asyncio.run(validate_study_flags(spec, root, study_file, executor_for(spec.host)))
        plan = TunePlan.of(spec, note, estimate=_estimate(spec, store_url))
        if json_out:
            emit(plan)
        else:
            _print_plan(spec, plan)
        raise typer.Exit(ExitCode.OK)
    from cleanslate.store import Store, StudyStatus

    store = Store(store_url)
    if register:
        from cleanslate.tune.controller import register_study

        note = asyncio.run(validate_study_flags(spec, root, study_file, executor_for(spec.host)))
        if note:
            console_err.print(f"[yellow]note:[/] {escape(note)}")
        from cleanslate.store import study_digest

        new = store.study(spec.name) is None
        register_study(store, spec)
        stored = store.study(spec.name)
        digest = f" (definition {study_digest(stored.spec)})" if stored is not None else ""
        console.print(f"study {escape(spec.name)} {'recorded' if new else 'already'} in "
                      f"{escape(store.display_url)}{digest}: start workers with `cleanslate "
                      f"worker --study {escape(spec.name)}`", highlight=False)
        raise typer.Exit(ExitCode.OK)
    if not resume and store.study(spec.name) is not None:
        raise InputError(f"study {spec.name!r} already exists in {store.display_url}",
                         where="--no-resume", hint="rename the study to start a new one")
    executor = executor_for(spec.host)
    note = asyncio.run(validate_study_flags(spec, root, study_file, executor))
    if note and not json_out:
        console_err.print(f"[yellow]note:[/] {escape(note)}")
    from cleanslate.launch.lifecycle import using_baseline

    with using_baseline(host_baseline):
        outcome = asyncio.run(run_study(executor, store, spec,
                                        view=ConsoleView(quiet=json_out),
                                        gpu_backend=gpu_backend))
    if json_out:
        from cleanslate.cli._documents import TuneDone, emit

        emit(TuneDone.of(spec, outcome))
    else:
        _summary(spec, outcome, store)
    stopped = outcome.stopped_by in (StudyStatus.QUARANTINE, StudyStatus.INTERRUPTED, "systemic")
    if outcome.stopped_by == "systemic" and json_out:  # the reason on stderr too
        console_err.print(Text(f"stopped: {outcome.message}"), highlight=False)
    if no_trial_ran(outcome) and json_out:
        console_err.print(Text(no_trial_ran(outcome) or ""), highlight=False, soft_wrap=True)
    raise typer.Exit(ExitCode.FAILED if outcome.best is None or stopped else ExitCode.OK)


def _load_baseline(path: Path | None, spec: StudySpec) -> Baseline | None:
    """``--baseline``'s file, read and checked (an input error naming it, exit 2); refused for
    a study on several hosts: a baseline describes one host."""
    if path is None:
        return None
    if spec.hosts is not None and len(spec.hosts) > 1:
        raise InputError(f"the study runs on {len(spec.hosts)} hosts and a baseline describes "
                         "one", where="--baseline",
                         hint="run the study on one host (--host), or leave --baseline out")
    from cleanslate.verdict.baseline import Baseline

    return Baseline.load(path)


def no_trial_ran(outcome: StudyOutcome) -> str | None:
    """The last line of a study whose slots were all quarantined before any trial of this run
    gave a result (``no trial ran: the host is not clean (<first finding>)``), else ``None``:
    such a study measured nothing, and "no feasible configuration" would blame the flags."""
    from cleanslate.store import StudyStatus
    from cleanslate.tune.trial import not_clean_findings

    if outcome.stopped_by != StudyStatus.QUARANTINE or outcome.new_trials or \
            outcome.report is None:
        return None
    return f"no trial ran: the host is not clean ({not_clean_findings(outcome.report, 1)})"


def _estimate(spec: StudySpec, store_url: str | None) -> StudyEstimate:
    """The study's launches and wall time (:func:`~cleanslate.tune.estimate.estimate_study`),
    from the launch times of its earlier trials when the store holds some: read with nothing
    written (a store that does not exist or cannot be read gives none)."""
    from cleanslate.tune.estimate import estimate_study, launch_seconds

    measured: list[float] = []
    try:
        from cleanslate.store import Store

        reader = Store(store_url, create=False)
        try:
            measured = launch_seconds(reader.trials(spec.name))
        finally:
            reader.close()
    except InputError:
        pass  # no store yet, or one this user may not read: the study's settings alone
    return estimate_study(spec, measured)


def estimate_line(estimate: StudyEstimate) -> str:
    """``7 configurations; 7-31 launches (races included; about 11-17 typically); about 3-9
    min (at 17 s a launch, the mean of 16 earlier launches of this study); an estimate``."""
    from cleanslate.cli._render import duration_text

    e = estimate
    many = "s" if e.configurations != 1 else ""
    launches = (f"{e.launches_min} launch{'es' if e.launches_min != 1 else ''}"
                if e.launches_min == e.launches_max else
                f"{e.launches_min}-{e.launches_max} launches (races included"
                + (f"; about {e.launches_typical[0]}-{e.launches_typical[1]} typically"
                   if e.launches_typical else "") + ")")
    if e.launch_s is not None and e.wall_s_low is not None and e.wall_s_high is not None:
        span = duration_text(e.wall_s_low) if e.wall_s_low == e.wall_s_high else \
            f"{duration_text(e.wall_s_low)} to {duration_text(e.wall_s_high)}"
        when = (f"about {span} (at {duration_text(e.launch_s)} a launch, the mean of "
                f"{e.measured_launches} earlier launches of this study)")
    elif e.wall_s_low is not None and e.wall_s_high is not None and e.launch_s_low is not None:
        when = (f"{duration_text(e.wall_s_low)} to {duration_text(e.wall_s_high)} (the "
                f"levels take {duration_text(e.launch_s_low)} a launch; its start, smoke test "
                "and teardown up to the study's timeouts)")
    else:
        when = ("time unknown until a trial has run (levels of a number of requests): --check "
                "again after the first trial")
    return f"{e.configurations} configuration{many}; {launches}; {when}; an estimate"


def _print_plan(spec: StudySpec, plan: TunePlan) -> None:
    console.print(Text(f"study {spec.name}: valid; {spec.strategy}, {plan.trials} trials, "
                       f"engine {spec.engine}, model {spec.model}, host {plan.host}"))
    if plan.flags_note:
        console_err.print(f"[yellow]note:[/] {escape(plan.flags_note)}")
    if spec.strategy == "guided":
        from cleanslate.tune.notebook import not_guided_line

        console.print(Text(f"the baseline first, then one flag at a time; {not_guided_line(spec)}"),
                      highlight=False, soft_wrap=True)
    if plan.configurations is not None:
        table = Table(title="planned configurations", title_justify="left")
        table.add_column("#", justify="right")
        for name in spec.space:
            table.add_column(Text(name), overflow="fold")
        for i, config in enumerate(plan.configurations):
            table.add_row(str(i), *(Text(str(config.get(n))) for n in spec.space))
        console.print(table)
    else:
        for name, dist in (plan.distributions or {}).items():
            console.print(Text(f"  {name}: {dist}"), soft_wrap=True)
    per_level = (f"{spec.requests_per_level} requests" if spec.requests_per_level else
                 f"{spec.duration_s_per_level:g} s" if spec.duration_s_per_level else
                 "5 requests per slot (at least 50)")
    c = spec.capacity
    what = (f"capacity search from c={c.start} up to c={c.max_load} (tolerance "
            f"{c.tolerance:.0%}, at most {c.max_probes} probes), each probe {per_level} and at "
            "least its concurrency"
            if spec.objective.capacity else f"levels {', '.join(plan.levels)}, {per_level} each")
    workload = json.dumps(plan.workload.model_dump(mode="json"))
    console.print(Text(f"{what}; workload {workload}; {spec.objective.direction} "
                       f"{spec.objective.metric}"
                       + (f"; SLOs {json.dumps(spec.slo)}" if spec.slo else "")), soft_wrap=True)
    if plan.estimate is not None:
        console.print(Text(estimate_line(plan.estimate)), highlight=False, soft_wrap=True)
    console.print("nothing was launched (--check)")


def launch_command(record: TrialRecord) -> str:
    """The exact engine command of a trial, shell-quoted."""
    return shlex.join(record.argv) if record.argv else "(not launched)"


def _summary(spec: StudySpec, outcome: StudyOutcome, store: Store | None = None) -> None:
    """The study's table (each trial's status, best level, value and what bound it: the
    bottleneck verdict at its best level and at its first miss), why it stopped, the best
    configuration with its statistics and what bound it, and for an ablation which flag moved
    which bottleneck (``docs/study.md``, "What bound each trial")."""
    from cleanslate.cli._stats import (
        capacity_cell,
        capacity_lines,
        marks,
        statistics_lines,
        value_text,
    )
    from cleanslate.report import bound_cell, trial_bound_lines
    from cleanslate.store import StudyStatus, TrialStatus
    from cleanslate.tune.race import tie_set

    results = [t for t in outcome.trials if t.status.finished]
    table = Table(title=escape(f"study {spec.name}: {len(results)} trials "
                               f"({outcome.new_trials} new)"), title_justify="left")
    factors = list(spec.space)
    searched = any(t.capacity is not None for t in results)  # a capacity objective
    bounds = {t.number: bound_cell(t) for t in results}
    diagnosed = any(cell != "-" for cell in bounds.values())
    for column in ("#", *factors, "status", "best level", spec.objective.metric,
                   *(("capacity [bracket)",) if searched else ()),
                   *(("bound by",) if diagnosed else ())):
        table.add_column(Text(column), overflow="fold")
    maximize = spec.objective.direction == "maximize"
    ordered = sorted(results, key=lambda t: (t.status is not TrialStatus.FEASIBLE,
                                             -(t.value or 0) if maximize else (t.value or 0)))
    found = tie_set(outcome.trials, spec)
    words = marks(found) if found.interval is not None and found.interval.low is not None \
        else {}
    for t in ordered:
        feasible = t.status is TrialStatus.FEASIBLE
        status = t.crash_text or ("feasible" if feasible else f"{t.status}: {t.cause}")
        if t.number in words:
            status += f" ({words[t.number]})"
        table.add_row(str(t.number), *(Text(str(t.params.get(f))) for f in factors),
                      Text(status, style="red" if t.crash_text else ""), t.best_level or "-",
                      value_text(t) if (feasible or t.crash_text) and t.value else "-",
                      *((Text(capacity_cell(t)),) if searched else ()),
                      *((Text(bounds[t.number]),) if diagnosed else ()))
    console.print(table)
    if spec.strategy == "guided":
        from cleanslate.tune.notebook import notebook_lines

        console.print("[bold]the lab notebook[/] (strategy: guided)")
        for line in notebook_lines(spec, outcome.trials):
            console.print(Text(f"  {line}"), highlight=False, soft_wrap=True)
    if outcome.stopped_by == "systemic":
        console.print("[bold red]stopped: a failure that is not the configuration's[/] "
                      f"{escape(outcome.message)}", highlight=False)
        console.print("  its configurations were re-queued, none recorded infeasible: fix "
                      "the cause and run the study again to resume it", highlight=False)
        return
    if outcome.stopped_by in (StudyStatus.QUARANTINE, StudyStatus.INTERRUPTED):
        console.print(f"[bold red]stopped: {outcome.stopped_by}[/] {escape(outcome.message)}")
        if outcome.report is not None:
            render_report(outcome.report)
    if no_trial_ran(outcome):
        from cleanslate.tune.trial import how_to_proceed

        console.print(Text(how_to_proceed(outcome.report)), highlight=False, soft_wrap=True)
        console.print(Text(no_trial_ran(outcome) or "", style="bold red"), highlight=False,
                      soft_wrap=True)
        return
    best = outcome.best
    if best is None:
        console.print("[bold red]no feasible configuration[/]")
        return
    console.print(f"[bold green]best configuration[/] (trial {best.number}): "
                  f"{escape(_params(best.params))}")
    for line in [*capacity_lines(best), *statistics_lines(spec, outcome.trials, _params)]:
        console.print(Text(line), highlight=False, soft_wrap=True)
    level = best.level(best.best_level)
    if level is not None:
        # The trial's levels are its first run's; beside a mean they are labelled so.
        first = "first run: " if best.n_replicates > 1 else ""
        console.print(f"  {first}output {level.output_throughput:,.0f} tok/s, total "
                      f"{level.total_token_throughput:,.0f} tok/s, p99 TTFT "
                      f"{level.ttft_ms.p99 or 0:,.0f} ms, p99 TPOT "
                      f"{level.tpot_ms.p99 or 0:,.1f} ms")
    for line in trial_bound_lines(best):
        console.print(Text(f"  {line}"), highlight=False, soft_wrap=True)
    console.print(Text(f"  launch: {launch_command(best)}"), highlight=False,
                  soft_wrap=True)
    _ablation_moves(spec, store)


def _ablation_moves(spec: StudySpec, store: Store | None) -> None:
    """An ablation's lines: what bound the baseline, then per one-flag change what bound it
    and the objective's change with its interval (a tie said so)."""
    if spec.strategy != "ablation" or store is None:
        return
    from cleanslate.report import ablation_lines, load_report

    for line in ablation_lines(load_report(store, spec.name)):
        console.print(Text(line), highlight=False, soft_wrap=True)


__all__ = ["ConsoleView", "launch_command", "tune"]
