"""``cleanslate doctor``: why is this host slow, before the first benchmark (``docs/doctor.md``)."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from cleanslate.cli._common import console, parse_gpus
from cleanslate.cli._options import JsonOption, known_backend, named_host
from cleanslate.errors import InputError
from cleanslate.hosts import executor_for

if TYPE_CHECKING:
    from cleanslate.doctor.report import DoctorReport, HostDoctor

_STYLE = {"error": "red", "warning": "magenta", "info": "dim"}


def doctor(
    host: Annotated[list[str] | None, typer.Option(
        "--host", callback=named_host,
        help="Host to examine (repeatable); default: this machine.")] = None,
    gpus: Annotated[str | None, typer.Option(
        help="GPU indices in scope, e.g. 0,1 (default: all).")] = None,
    bandwidth: Annotated[bool, typer.Option(
        "--bandwidth", help="Also measure copy bandwidth and latency with torch on the host "
        "(per GPU and per pair); skipped, saying why, where torch does not import.")] = False,
    timeout: Annotated[float, typer.Option(
        help="Seconds each nvidia-smi command on the host may take.")] = 20.0,
    accept_new_host_key: Annotated[bool, typer.Option(
        "--accept-new-host-key", help="Trust and record unknown SSH host keys (changed keys are "
        "always refused).")] = False,
    gpu_backend: Annotated[str, typer.Option(
        "--gpu-backend", callback=known_backend,
        help="none (or sim): the host serves without NVIDIA GPUs, so no driver is not a "
        "problem; auto (the default) or another backend: no NVIDIA driver is a problem "
        "(exit 1).")] = "auto",
    json_out: JsonOption = False,
) -> None:
    """Examine GPU host(s): driver, devices, topology and P2P, environment, and what each
    finding means for serving (exit 0 no problem, 1 problems, 3 could not tell)."""
    accept_new = True if accept_new_host_key else None  # else the URL's or the environment's
    if not math.isfinite(timeout) or timeout <= 0:
        raise InputError(f"must be a positive number of seconds, got {timeout:g}",
                         where="--timeout")
    gpu_list = parse_gpus(gpus)
    executors = ([executor_for(h, accept_new_host_keys=accept_new) for h in host] if host
                 else [executor_for(None)])
    from cleanslate.doctor.run import doctor_hosts

    report = asyncio.run(doctor_hosts(executors, gpus=gpu_list, bandwidth=bandwidth,
                                      timeout=timeout,
                                      gpus_expected=gpu_backend not in ("none", "sim")))
    if json_out:
        typer.echo(report.model_dump_json())
    else:
        render(report)
    raise typer.Exit(report.exit_code)


def render(report: DoctorReport) -> None:
    """Print each host's sections and findings as text (never markup), ending with one line."""
    for host in report.hosts:
        _render_host(host)
    words = {0: ("no problem found", "bold green"), 1: ("problems found", "bold red"),
             3: ("could not tell", "bold yellow")}
    word, style = words.get(report.exit_code, ("?", "bold"))
    console.print(Text(word.upper(), style=style))


def _render_host(h: HostDoctor) -> None:
    console.print(Text(f"{h.host} ({h.elapsed_s:.2f} s)", style="bold"))
    if h.error is not None:
        console.print(Text(f"  could not examine the host: {h.error}", style="yellow"))
        return
    if h.driver is not None:
        d = h.driver
        console.print(Text(
            f"  driver {d.version or '-'}, CUDA {d.cuda or '-'}; NVML: {d.nvml}; "
            f"nvidia-smi: {d.nvidia_smi}" if d.present else "  no NVIDIA driver"))
    if h.devices:
        table = Table(title="GPUs", title_justify="left")
        for column in ("GPU", "name", "bus id", "PCIe", "replays", "persist", "ECC", "power W",
                       "temp C", "NVLink up", "clock events"):
            table.add_column(column)
        for g in h.devices:
            pcie = (f"gen {g.pcie_gen} of {g.pcie_gen_max}, x{g.pcie_width} of "
                    f"x{g.pcie_width_max}")
            table.add_row(*(Text(str(v)) for v in (
                g.index, g.name or "?", g.pci_bus_id or "?", pcie, _opt(g.pcie_replays),
                _opt(g.persistence), _opt(g.ecc),
                f"{_opt(g.power_limit_w)} of {_opt(g.power_default_w)}", _opt(g.temperature_c),
                _opt(g.nvlink_up),
                (", ".join(g.clock_event_reasons) or "none")
                if g.clock_event_reasons is not None else "?")))
        console.print(table)
    if h.pairs:
        table = Table(title="Pairs", title_justify="left")
        for column in ("GPUs", "link", "P2P read", "write", "NVLink", "atomics"):
            table.add_column(column)
        for p in h.pairs:
            table.add_row(*(Text(str(v)) for v in (
                f"{p.a}-{p.b}", _opt(p.link), _opt(p.p2p_read), _opt(p.p2p_write),
                _opt(p.p2p_nvlink), _opt(p.p2p_atomics))))
        console.print(table)
    if h.environment is not None:
        e = h.environment
        shm = f"{e.shm_bytes / 2**30:.1f} GiB" if e.shm_bytes is not None else "?"
        console.print(Text(
            f"  environment: VM {e.virtualization or 'none seen'}; container "
            f"{e.container or 'none seen'}; kernel {e.kernel or '?'}; /dev/shm {shm}; "
            f"memlock {_bytes(e.memlock)}; hugepages {_opt(e.hugepages_total)}; "
            f"nvidia-persistenced {'running' if e.persistenced_pids else 'not running'}"
            + (f"; logind RemoveIPC {_yes_no(e.logind.remove_ipc)} (UID {_opt(e.logind.uid)}, "
               f"logind {_yes_no(e.logind.logind, 'present', 'absent')})"
               if e.logind is not None else "")))
    if h.bandwidth is not None:
        b = h.bandwidth
        if b.skipped:
            console.print(Text(f"  bandwidth: skipped: {b.skipped}"))
        else:
            table = Table(title=f"Measured ({b.elapsed_s} s)", title_justify="left")
            for column in ("GPUs", "what", "value", "link allows"):
                table.add_column(column)
            for m in b.measurements:
                table.add_row(*(Text(str(v)) for v in (
                    "-".join(map(str, m.gpus)), m.what, f"{m.value:g} {m.unit}",
                    f"{m.expected:g} {m.unit}" + (f" ({m.note})" if m.note else "")
                    if m.expected else "")))
            console.print(table)
        for note in b.notes:
            console.print(Text(f"  bandwidth: {note}"))
    for f in h.findings:
        console.print(Text(f"  {f.severity.value}: {f.message}", style=_STYLE[f.severity]))
        console.print(Text(f"    means: {f.consequence}"))
        for line in f.evidence:
            console.print(Text(f"    evidence: {line}", style="dim"))


def _yes_no(value: bool | None, yes: str = "yes", no: str = "no") -> str:
    return "unknown" if value is None else yes if value else no


def _bytes(value: str | None) -> str:
    """``"unlimited"``, ``"8388608"`` -> ``"8 MiB"``, ``None`` -> ``"?"``."""
    if value is None or not value.isdigit():
        return value or "?"
    return f"{int(value) / 2**20:g} MiB"


def _opt(value: object) -> str:
    if value is None:
        return "?"
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


__all__ = ["doctor", "render"]
