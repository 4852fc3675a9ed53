"""What several commands print for people: a check's verdict, teardown targets, a teardown.

Text from outside (process names, command lines, findings' messages, reasons) is printed as
text, never as rich markup. A human report always ends with an explicit line (``CLEAN``, not
silence). The ``--json`` documents are in :mod:`cleanslate.cli._documents`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cleanslate.cli._common import console

if TYPE_CHECKING:
    from cleanslate.teardown import Target, TargetRecord, TeardownReport
    from cleanslate.verdict.check import CheckReport
    from cleanslate.verdict.findings import HostVerdict

#: Findings shown per (kind, severity) before "... and N more" (all of them are in ``--json``).
MAX_ROWS_PER_KIND = 5

# Keyed by the values of Verdict and Severity (StrEnum members hash as their values).
_VERDICT_STYLE = {"clean": "bold green", "dirty": "bold red", "unknown": "bold yellow"}
_SEVERITY_STYLE = {"error": "red", "unknown": "yellow", "warning": "magenta", "info": "dim"}


def render_report(report: CheckReport) -> None:
    """Print GPU and finding tables per host, ending with one explicit verdict line."""
    for host in report.hosts:
        _render_host(host, show_name=len(report.hosts) > 1)
    line = report.verdict.value.upper()
    if report.until_clean is not None:
        uc = report.until_clean
        if uc.respawned:
            line += (f": an engine process reappeared after the host had read clean "
                     f"({uc.attempts} probes)")
        elif uc.clean_after_s is not None:
            line += (f" after {uc.clean_after_s:.2f} s ({uc.attempts} probes; held "
                     f"{uc.clean_for_s:.2f} s over {uc.clean_readings} readings)")
        else:
            line += f" at the {uc.deadline_s:g} s deadline ({uc.attempts} probes)"
    console.print(Text(line, style=_VERDICT_STYLE[report.verdict]))


def _render_host(host: HostVerdict, *, show_name: bool) -> None:
    title = f"{escape(host.host)}: " if show_name else ""
    if host.gpus:
        table = Table(title=f"{title}GPUs ({escape(host.gpu_backend)})", title_justify="left")
        for column in ("GPU", "name", "used MiB", "total MiB", "processes (PID: MiB)"):
            table.add_column(column)
        for gpu in host.gpus:
            procs = ", ".join(
                f"{p.pid}: {p.used_mib if p.used_mib is not None else '?'}"
                for p in gpu.processes
            )
            table.add_row(str(gpu.index), Text(gpu.name or "?"),
                          _num(gpu.memory_used_mib), _num(gpu.memory_total_mib), procs or "-")
        console.print(table)
    elif show_name or host.gpu_backend != "none":
        console.print(Text(f"{host.host + ': ' if show_name else ''}no GPUs read "
                           f"(backend {host.gpu_backend})"))
    problems = host.problems
    if problems:
        table = Table(title=f"{title}findings", title_justify="left")
        table.add_column("severity")
        table.add_column("kind")
        table.add_column("detail", overflow="fold")
        shown: dict[tuple[str, str], int] = {}
        for finding in problems:
            key = (finding.kind.value, finding.severity.value)
            shown[key] = shown.get(key, 0) + 1
            if shown[key] > MAX_ROWS_PER_KIND:
                continue
            table.add_row(f"[{_SEVERITY_STYLE[finding.severity]}]{finding.severity.value}[/]",
                          finding.kind.value, Text(finding.message))
        for (kind, severity), count in shown.items():
            if count > MAX_ROWS_PER_KIND:
                table.add_row(f"[{_SEVERITY_STYLE[severity]}]{severity}[/]", kind,
                              f"... and {count - MAX_ROWS_PER_KIND} more (all in --json)")
        console.print(table)
    if show_name:
        console.print(Text(f"{host.host}: {host.verdict.value.upper()}",
                           style=_VERDICT_STYLE[host.verdict]))


def _num(value: int | None) -> Text:
    return Text("[N/A]" if value is None else str(value))


def targets_table(title: str, targets: Iterable[Target | TargetRecord]) -> Table:
    """A table of teardown targets (live or as a report keeps them), every cell printed as
    text."""
    table = Table(title=title, title_justify="left")
    for column in ("PID", "user", "why", "comm", "command"):
        table.add_column(column, overflow="fold")
    for target in targets:
        why = target.why
        if target.protected:
            why = f"{why}; left alone: {target.protected}"
        user = target.user or (str(target.uid) if target.uid is not None else "?")
        table.add_row(Text(str(target.pid)), Text(user), Text(why), Text(target.comm),
                      Text(target.command[:200]))
    return table


def print_teardown(report: TeardownReport) -> None:
    """What a teardown did (targets, signals, cgroup, ``/dev/shm``), then its verification."""
    if report.refused:
        console.print(Text.assemble(("nothing signalled: ", "bold yellow"), report.refused))
    if report.targets:
        console.print(targets_table("teardown", report.targets))
    if report.left_alone:
        console.print(targets_table("left alone (protected, or not proven the run's)",
                                    report.left_alone))
    if report.cgroup_refused:
        console.print(Text(f"  recorded cgroup not used: {report.cgroup_refused}"))
    if report.cgroup:
        state = "removed" if report.cgroup_removed else (
            f"still holds {', '.join(map(str, report.cgroup_left))}" if report.cgroup_left
            else "not removed")
        console.print(Text(f"  cgroup {report.cgroup}: "
                           f"{'cgroup.kill used, ' if report.cgroup_killed else ''}{state}"))
    for rnd in report.rounds:
        console.print(f"  {rnd.at_s:6.2f} s  {rnd.signal} -> {', '.join(map(str, rnd.sent))}")
    if report.root_exit_s is not None:
        console.print(f"  root process exited {report.root_exit_s:.2f} s after SIGTERM")
    if report.killed:
        console.print(f"  escalated to SIGKILL for {', '.join(map(str, report.killed))}")
    if report.d_state:
        console.print(f"[red]  stuck in uninterruptible sleep: {report.d_state}[/]")
    if report.shm_removed:
        console.print(Text(f"  removed /dev/shm/{{{', '.join(report.shm_removed)}}}"))
    if report.verify is not None:
        render_report(report.verify)
    else:
        console.print("not verified")


def duration_text(seconds: float) -> str:
    """A duration as a person reads it, rounded to what matters: ``under 1 s``, ``25 s``,
    ``1 min 10 s`` (to 10 s under 10 min), ``12 min``, ``2 h 5 min``."""
    if seconds < 0.5:
        return "under 1 s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        minutes, rest = divmod(round(whole / 10) * 10, 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, minutes = divmod(round(whole / 60), 60)
    if not hours:
        return f"{minutes} min"
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


__all__ = ["MAX_ROWS_PER_KIND", "duration_text", "print_teardown", "render_report",
           "targets_table"]
