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

from cleanslate.report._data import (
    LEVEL_COLUMNS,
    StudyReport,
    format_value,
    params_text,
    show,
)

_STYLE = {"feasible": "green", "infeasible": "red", "infra_failed": "yellow",
          "running": "yellow"}


def _t(value: object, style: str = "") -> Text:
    """External text as a rich ``Text`` (never parsed as markup)."""
    return Text("" if value is None else str(value), style=style)


def trials_table(report: StudyReport) -> Table:
    """Every trial, sorted by the objective: parameters, status and cause, best feasible level,
    and that level's throughputs and latencies."""
    title = _t(f"study {report.name}: {report.direction} {report.metric} ({report.strategy}, "
               f"engine {report.engine}{', simulated' if report.simulated else ''})")
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("#", justify="right")
    for factor in report.factors:
        table.add_column(_t(factor), overflow="fold")
    table.add_column("status", overflow="fold")
    table.add_column("best level")
    for _, header, _ in LEVEL_COLUMNS:
        table.add_column(header, justify="right")
    best = report.best
    for t in report.sorted_trials():
        r = t.record
        status = _t(r.status, _STYLE.get(r.status, ""))
        if r.cause:
            status.append(f" ({r.cause})")
        params = (_t(show(r.params.get(f)) if f in r.params else "") for f in report.factors)
        table.add_row(
            str(t.number), *params, status,
            _t(r.best_level or "-"),
            *(format_value(t.metric(k), k) for k, _, _ in LEVEL_COLUMNS),
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


def print_report(console: Console, report: StudyReport) -> None:
    """The trials table, the slots (when the study ran on several, or one was not ok), the
    hosts' doctor snapshots, then the best configuration and its launch command."""
    print_table(console, trials_table(report))
    if len(report.slots) > 1 or any(s.state != "ok" for s in report.slots):
        print_table(console, slots_table(report))
    if report.hosts:
        print_table(console, hosts_table(report))
    if report.simulated:
        console.print("[yellow]simulated engine:[/] numbers from cleanslate's sim performance "
                      "model, not from a GPU")
    best = report.best
    if best is None:
        console.print("[bold red]no feasible configuration[/]")
        return
    line = Text("best configuration", style="bold green")
    line.append(f" (trial {best.number}): {params_text(best.record.params)}")
    console.print(line)
    console.print(_t(f"  {report.metric} = {format_value(best.record.value, report.metric)} "
                     f"at {best.record.best_level}"))
    console.print(_t("  launch: " + (best.launch_command or "(not recorded)")), soft_wrap=True)


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
    for key, header, _ in LEVEL_COLUMNS:
        row(header, [format_value(b.metric(key), key) if b else "-" for b in bests])
    row("launch command", [b.launch_command if b else "-" for b in bests])
    return table
