"""The report on a terminal: rich tables of the trials, the best configuration and its launch
command, and the studies side by side.

Everything that comes from the store (study and flag names, values, causes, model names, the
launch command) is a :class:`rich.text.Text`, never markup: a flag value ``[/x]`` is shown as
it is and cannot break the output.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cleanslate.report._bounds import bound_cell, moved_text, trial_bound_lines
from cleanslate.report._capacity import bracket_text, findings_text, probes_text
from cleanslate.report._data import (
    LEVEL_COLUMNS,
    StudyReport,
    TrialView,
    comparable,
    format_value,
    params_text,
    shared_configs,
    show,
)
from cleanslate.report._guided import guided_lines
from cleanslate.report._stats import Difference, pm_text
from cleanslate.stats import Outcome

_STYLE = {"feasible": "green", "infeasible": "red", "infra_failed": "yellow",
          "running": "yellow"}


def _t(value: object, style: str = "") -> Text:
    """External text as a rich ``Text`` (never parsed as markup)."""
    return Text("" if value is None else str(value), style=style)


def metric_text(report: StudyReport, trial: TrialView, key: str) -> str:
    """A metric of a trial's best level: ``mean ± half-width`` over its measurements when it
    has several, its one value otherwise."""
    found = trial.metric_interval(key, report.confidence)
    if found is not None and found.n > 1:
        return pm_text(found, lambda v: format_value(v, key))
    return format_value(trial.metric(key), key)


def value_text(report: StudyReport, trial: TrialView) -> str:
    """The trial's objective value: ``mean 6,778 ± 841 (4 runs)`` with several measurements
    (each a run on a new server), the value alone with one."""
    found = trial.interval(report.confidence)
    if found is None:
        return "-"
    text = pm_text(found, lambda v: format_value(v, report.metric))
    return f"mean {text} ({runs_text(found.n)})" if found.n > 1 else text


def runs_text(n: int) -> str:
    """``3 runs``, ``1 run``: how many measurements a mean is over."""
    return f"{n} run" + ("" if n == 1 else "s")


def standing_text(report: StudyReport, trial: TrialView) -> str:
    """``best``, else the outcome against it (``tie``, ``undecided``, ``loss``), or empty."""
    return report.mark(trial)


def capacity_cells(trial: TrialView) -> list[str]:
    """A capacity trial's cells: the bracket (``c=96 [96, 104)``), the probes and what stopped
    the search (``8 (tolerance)``), and what it found besides (the crash, unresolved probes,
    cliffs); ``-`` for a trial without a search."""
    result = trial.capacity
    if result is None:
        return ["-", "-", ""]
    return [bracket_text(result), probes_text(result), findings_text(result)]


#: The capacity columns' headers (:func:`capacity_cells`).
CAPACITY_HEADERS = ("capacity [bracket)", "probes (stopped)", "search found")


def trials_table(report: StudyReport) -> Table:
    """Every trial, sorted by the objective: parameters, status and cause, best feasible level,
    what bound the trial (:func:`~cleanslate.report._bounds.bound_cell`, when some trial has a
    verdict), and that level's
    throughputs and latencies (``mean ± half-width`` over a trial's
    measurements when it has several); with statistics, the objective's value with its
    interval and whether the trial is tied with the best or undecided against it; for a
    capacity study, each trial's bracket, probes and findings (:func:`capacity_cells`)."""
    title = _t(f"study {report.name}: {report.direction} {report.metric} ({report.strategy}, "
               f"engine {report.engine}{', simulated' if report.simulated else ''})")
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("#", justify="right")
    for factor in report.factors:
        table.add_column(_t(factor), overflow="fold")
    table.add_column("status", overflow="fold")
    marks = report.replicated or bool(report.standing.tied or report.standing.undecided)
    if marks:
        table.add_column("vs best")
        table.add_column(_t(f"{report.metric} ({report.confidence * 100:g} %)"),
                         justify="right")
    if report.capacity:
        for header in CAPACITY_HEADERS:
            table.add_column(header, overflow="fold")
    table.add_column("best level")
    bounds = {t.number: bound_cell(t.record) for t in report.trials}
    diagnosed = any(cell != "-" for cell in bounds.values())
    if diagnosed:  # a study recorded before verdicts has none: no empty column
        table.add_column("bound by", overflow="fold")
    for _, header, _ in LEVEL_COLUMNS:
        table.add_column(header, justify="right")
    best = report.best
    for t in report.sorted_trials():
        r = t.record
        status = _t(r.status, _STYLE.get(r.status, ""))
        if t.crash_text is not None:  # the crash first, whatever the status
            status = _t(t.crash_text, "red")
        elif r.cause:
            status.append(f" ({r.cause})")
        params = (_t(show(r.params.get(f)) if f in r.params else "") for f in report.factors)
        mark = standing_text(report, t)
        extra = ([_t(mark, {"best": "green", Outcome.TIE: "cyan", Outcome.UNDECIDED: "yellow"}.get(
            mark, "dim")), _t(value_text(report, t))] if marks else [])
        if report.capacity:
            extra += [_t(c) for c in capacity_cells(t)]
        table.add_row(
            str(t.number), *params, status, *extra,
            _t(r.best_level or "-"),
            *([_t(bounds[t.number])] if diagnosed else []),
            *(metric_text(report, t, k) for k, _, _ in LEVEL_COLUMNS),
            style="bold" if t is best else None)
    return table


#: The widest a table is printed when the output is not a terminal (columns).
MAX_WIDTH = 180


def print_table(console: Console, table: Table) -> None:
    """Print a table at its natural width when the output is not a terminal (a file or a
    pipe, where folding cells to 80 columns helps nobody), else at the terminal's width."""
    if console.is_terminal:
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update_width(MAX_WIDTH)).maximum
    wide = Console(file=console.file, width=max(console.width, natural), highlight=False,
                   no_color=console.no_color, force_terminal=False)
    wide.print(table)


def slots_table(report: StudyReport) -> Table:
    """Per slot: the trials it ran, its infrastructure failures, and its state with why."""
    table = Table(title=_t(f"slots of {report.name}"), title_justify="left",
                  header_style="bold")
    for column in ("slot", "trials", "infra failures", "state"):
        table.add_column(column, overflow="fold",
                         justify="right" if column in ("trials", "infra failures") else "left")
    for slot in report.slots:
        state = _t(slot.state, "red" if slot.state == "quarantined" else
                   "yellow" if slot.state == "suspect" else "")
        if slot.reason:
            state.append(f": {slot.reason}")
        for finding in slot.findings[:3]:
            state.append(f"\n  {finding.severity}: {finding.message}")
        table.add_row(_t(slot.slot), str(slot.trials), str(slot.infra_failures), state)
    return table


_SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "dim"}


def _size(count: int | None) -> str:
    if count is None:
        return "?"
    return f"{count / 2**30:,.1f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def hosts_table(report: StudyReport) -> Table:
    """Per host of the study, its doctor snapshot: driver, GPUs with their PCIe links, where
    it runs, kernel, ``/dev/shm``, and the findings (error and warning with their consequence),
    or why the snapshot failed."""
    table = Table(title=_t(f"hosts of {report.name} (doctor snapshots)"), title_justify="left",
                  header_style="bold")
    for column in ("host", "driver", "GPUs", "runs in", "kernel", "/dev/shm", "findings"):
        table.add_column(column, overflow="fold")
    for record in report.hosts:
        snap = record.snapshot
        if snap.error is not None:
            table.add_row(_t(record.label), "", "", "", "", "",
                          _t(f"snapshot failed: {snap.error}", "red"))
            continue
        gpus = _t(snap.gpu_summary())
        for gpu in snap.gpus:
            gpus.append(f"\n  {gpu.index}: PCIe {gpu.pcie_text()}")
        findings = Text()
        for finding in snap.findings:
            if findings:
                findings.append("\n")
            findings.append(str(finding.severity), _SEVERITY_STYLE.get(finding.severity, ""))
            findings.append(f": {finding.message}")
            if finding.severity != "info":
                findings.append(f" ({finding.consequence})", "dim")
        table.add_row(
            _t(record.label),
            _t(f"{snap.driver} (CUDA {snap.cuda or '?'})" if snap.driver else "-"), gpus,
            _t(" in ".join(w for w in (snap.container, snap.virtualization) if w) or
               "bare metal or not seen"),
            _t(snap.kernel or "?"), _t(_size(snap.shm_bytes)), findings or _t("none"))
    return table


def failure_lines(report: StudyReport) -> list[str]:
    """The failures section as lines of text: every trial that was not feasible or whose
    server crashed at any level (:attr:`StudyReport.failures`), the crash first
    (``#4 crashed at c=256 (python_exception): c=256: AttributeError: ...``), then its log
    excerpt indented (:func:`~cleanslate.report._data.log_excerpt`); empty when there is
    none."""
    failures = report.failures
    if not failures:
        return []
    lines = [f"failures of {report.name} ({len(failures)}):"]
    for t in failures:
        r = t.record
        head = t.crash_text or (f"{r.status}: {r.cause}" if r.cause else str(r.status))
        lines.append(f"  #{t.number} {head}" + (f": {r.detail}" if r.detail else ""))
        lines += [f"      {row}" for row in t.log_excerpt.splitlines()]
    return lines


def print_report(console: Console, report: StudyReport) -> None:
    """The trials table, the failures (crashes first said as such, with a log excerpt), the
    slots (when the study ran on several, or one was not ok), the hosts' doctor snapshots, then
    the best configuration and its launch command."""
    print_table(console, trials_table(report))
    for text in failure_lines(report):
        console.print(_t(text, "red" if text.startswith("  #") else ""), soft_wrap=True)
    if len(report.slots) > 1 or any(s.state != "ok" for s in report.slots):
        print_table(console, slots_table(report))
    if report.hosts:
        print_table(console, hosts_table(report))
    if report.simulated:
        console.print("[yellow]simulated engine:[/] numbers from cleanslate's sim performance "
                      "model, not from a GPU")
    for text in guided_lines(report):
        console.print(_t(text), soft_wrap=True)
    best = report.best
    if best is None:
        console.print("[bold red]no feasible configuration[/]")
        return
    line = Text("best configuration", style="bold green")
    line.append(f" (trial {best.number}): {params_text(best.record.params)}")
    console.print(line)
    for text in best_lines(report):
        console.print(_t("  " + text))
    console.print(_t("  launch: " + (best.launch_command or "(not recorded)")), soft_wrap=True)
    for text in ablation_lines(report):
        console.print(_t(text), soft_wrap=True)


def ablation_lines(report: StudyReport) -> list[str]:
    """An ablation study's changes against its baseline, each with what bound the baseline
    and the change and the objective's change with its interval (:func:`~cleanslate.report.
    _bounds.moved_text`); empty for another strategy."""
    base = report.baseline_trial()
    effects = report.ablation_effects()
    if base is None or not effects:
        return []
    lines = [f"what each change moved (against the baseline, trial {base.number}):"]
    lines += [f"  baseline {line}" for line in trial_bound_lines(base.record)]
    lines += [f"  {moved_text(e)} (trial {e.trial.number})" for e in effects]
    return lines


def _versus(report: StudyReport, number: int) -> str:
    found: Difference | None = report.standing.comparisons.get(number)
    return f"#{number}" + (f" ({found.text()})" if found is not None else "")


def best_lines(report: StudyReport) -> list[str]:
    """What the report says of its best beside its parameters: the value with its interval,
    the trials tied with it and undecided against it, and the statistics' cost."""
    best = report.best
    if best is None:
        return []
    found = best.interval(report.confidence)
    value = pm_text(found, lambda v: format_value(v, report.metric))
    head = f"{report.metric} = {value} at {best.record.best_level}"
    if found is not None and found.low is not None and found.high is not None:
        head = f"{report.metric} = mean {value} at {best.record.best_level}"
        head += (f" ({runs_text(found.n)}, {report.confidence * 100:g} % interval "
                 f"{format_value(found.low, report.metric)} to "
                 f"{format_value(found.high, report.metric)})")
    elif report.statistics.fixed_count() == 1 and not report.statistics.racing:
        head += " (one run: no interval)"
    lines = [head, *trial_bound_lines(best.record)]
    standing = report.standing
    if standing.note:
        lines.append(standing.note)
    if standing.tied:
        lines.append("tie with the best: " + ", ".join(_versus(report, n)
                                                        for n in standing.tied))
    if standing.undecided:
        lines.append("undecided against the best: " + ", ".join(_versus(report, n)
                                                                 for n in standing.undecided))
    if report.replicated or report.statistics.racing or report.statistics.fixed_count() > 1:
        lines.append(standing.cost_text())
    if report.host_effects:
        lines.append(host_effects_text(report))
    if best.capacity is not None:
        lines.append("capacity: " + best.capacity.summary())
        others = [r.capacity for r in best.record.replicates if r.index > 0 and r.capacity]
        if others:
            lines.append("capacity of its other measurements: "
                         + ", ".join(bracket_text(c) for c in others))
    return lines


def host_effects_text(report: StudyReport) -> str:
    """``host effects: slot-a +4.1 % [+2.0, +6.2] (n=3), ...``: each slot's effect on the
    objective from the configurations it measured that another slot measured too."""
    parts = []
    for slot, found in sorted(report.host_effects.items()):
        text = f"{slot} {found.mean * 100:+.1f} %"
        if found.low is not None and found.high is not None:
            text += f" [{found.low * 100:+.1f}, {found.high * 100:+.1f}]"
        parts.append(f"{text} (n={found.n})")
    return "host effects (each slot against the configurations' mean over slots): " + ", ".join(
        parts)


def best_capacity_text(best: TrialView | None) -> str:
    """``c=44 [44, 48), 7 probes (tolerance)`` for a best with a capacity search, else ``-``."""
    if best is None or best.capacity is None:
        return "-"
    return f"{bracket_text(best.capacity)}, {probes_text(best.capacity)}"


def comparison_table(reports: list[StudyReport]) -> Table:
    """The studies side by side: their best trial and its figures, one column per study."""
    table = Table(title="comparison", title_justify="left", header_style="bold")
    table.add_column("")
    for report in reports:
        table.add_column(_t(report.name), overflow="fold")

    def row(label: str, values: list[str]) -> None:
        table.add_row(label, *(_t(v) for v in values))

    bests = [r.best for r in reports]
    row("engine", [r.engine + (" (simulated)" if r.simulated else "") for r in reports])
    row("objective", [f"{r.direction} {r.metric}" for r in reports])
    row("trials", [f"{len(r.results)} results, {sum(1 for t in r.trials if t.feasible)} "
                   "feasible" for r in reports])
    row("best trial", [f"#{b.number}" if b else "none" for b in bests])
    row("best configuration", [params_text(b.record.params) if b else "-" for b in bests])
    row("best level", [b.record.best_level or "-" if b else "-" for b in bests])
    row("best value", [value_text(r, b) if b else "-" for r, b in zip(reports, bests,
                                                                      strict=True)])
    row("tied with best", [", ".join(f"#{n}" for n in r.standing.tied) or "-"
                           for r in reports])
    if any(r.capacity for r in reports):
        row("best's capacity [bracket)", [best_capacity_text(b) for b in bests])
    for key, header, _ in LEVEL_COLUMNS:
        row(header, [metric_text(r, b, key) if b else "-" for r, b in zip(reports, bests,
                                                                          strict=True)])
    row("launch command", [b.launch_command if b else "-" for b in bests])
    return table


def differences_table(a: StudyReport, b: StudyReport) -> Table:
    """Each configuration both studies ran: its value in each (``mean ± half-width (n)``) and
    ``b`` against ``a`` with the interval and what it means (the outcome's word: ``win``,
    ``loss``, ``tie``, ``undecided``, each with ``: too few measurements`` where the interval
    of two says nothing; ``one run each: no interval``)."""
    table = Table(title=_t(f"{b.name} against {a.name}: the configurations both ran "
                           f"({a.direction} {a.metric}, {a.confidence * 100:g} % intervals)"),
                  title_justify="left", header_style="bold")
    for column in ("configuration", a.name, b.name, "difference", "interval", "verdict",
                   "test"):
        table.add_column(_t(column), overflow="fold",
                         justify="right" if column in (a.name, b.name, "difference") else
                         "left")
    for shared in shared_configs(a, b):
        d = shared.difference
        interval = (f"[{d.low * 100:+.1f}, {d.high * 100:+.1f}] %"
                    if d.low is not None and d.high is not None else "none")
        test = {"paired": f"paired by seed, {d.pairs} pairs",
                "welch": f"unpaired (Welch), n={d.n_a} and {d.n_b}",
                "single": "one run" + (" each" if d.n_a == d.n_b == 1 else " on a side")
                }.get(d.method, "")
        style = {Outcome.WIN.value: "green", Outcome.LOSS.value: "red",
                 Outcome.TIE.value: "cyan"}.get(d.verdict, "")
        table.add_row(
            _t(params_text(shared.params)),
            _t(f"#{shared.a.number} {value_text(a, shared.a)}"),
            _t(f"#{shared.b.number} {value_text(b, shared.b)}"),
            _t(f"{d.diff * 100:+.1f} %" if d.diff is not None else "-"), _t(interval),
            _t(d.verdict_text, style), _t(test))
    return table


def print_differences(console: Console, a: StudyReport, b: StudyReport) -> None:
    """:func:`differences_table`, or why there is none."""
    why = comparable(a, b)
    if why is not None:
        console.print(_t(f"{b.name} against {a.name}: {why}"))
        return
    if not shared_configs(a, b):
        console.print(_t(f"{b.name} against {a.name}: no configuration ran in both"))
        return
    print_table(console, differences_table(a, b))
