"""What an operator waits for: ``cleanslate check`` against the seeds' one-liner (issue 18).

Runs in private PID, network and mount namespaces (``benchmarks/_isolate.py``), so the census is
this benchmark's own processes and other work on the machine adds only CPU noise. At each load
(``--levels``: 0, 1,000 and 5,000 extra idle ``sleep`` processes, started and ended by PID),
times side by side, round-robin, the order rotated every round:

- ``one-liner``: the seeds' check as a shell process, ``sh -c 'pgrep -af sglang || echo Clean;
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader'`` (where ``nvidia-smi`` is not
  installed, as on a CPU machine, that is ``pgrep`` plus a failing command lookup);
- ``check (process)``: ``cleanslate check --json --gpu-backend B`` as a process (the console
  script, interpreter start and imports included, every engine's default port), and its own
  ``elapsed_s`` (the checking without the start-up). With bytecode caches, as a pip install
  has them: ``PYTHONDONTWRITEBYTECODE`` is dropped and the warm-up run writes them;
- ``ps+gpu``: ``ps -eo pid,ppid,comm,args`` then, where ``nvidia-smi`` is installed, the GPU
  query above, each a process, timed together: what the probe reads, by hand;
- ``probe``: the probe alone, in this process (``probe_host`` with the backend ``B`` resolves
  to: the stdlib collector in a child ``python3 -I -S`` plus the GPU reading).

Then, unless ``--hosts ''``, the SSH part of ``benchmarks/remote_check.py`` (1, 4 and 16
namespaced sshd hosts on 127.0.0.1, N hosts together against the slowest alone), in the same
run and the same rows.

Targets (issue 18): ``check`` p50 at most 3x the one-liner's; the probe p50 at most 2x
``ps+gpu``'s; N hosts at most 1.25x the slowest single host. Prints Markdown tables (p50, p95,
the ratio to the anchor, met or not); ``--json FILE`` writes the rows (``what``, ``procs`` or
``hosts``, ``p50_ms``, ``p95_ms``, ``anchor``, ``anchor_p50_ms``, ``ratio``, ``target``,
``met``; without an anchor those keys are left out) for ``benchmarks/results.py``. Not a
test: read the ratios, taken side by side.

    sudo python benchmarks/check_latency.py [--levels 0,1000,5000] [--runs 20] [--hosts 1,4,16]
        [--gpu-backend auto] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _isolate import reexec_isolated

ONE_LINER = ("pgrep -af sglang || echo Clean; "
             "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader")
GPU_QUERY = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"]
PS = ["ps", "-eo", "pid,ppid,comm,args"]
CHECK_RATIO, PROBE_RATIO = 3.0, 2.0


def check_env() -> dict[str, str]:
    """The environment of a timed ``cleanslate`` process: this one's, with bytecode caches as
    a pip install has them (without, every start compiles typer's and cleanslate's modules)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(what: str, load: dict[str, int], values: list[float], anchor: str | None = None,
        anchor_p50: float | None = None, target: float | None = None,
        **extra: Any) -> dict[str, Any]:
    """One result row from timings in seconds: p50 and p95 in ms, and against its anchor (a p50
    in seconds) the ratio and whether ``target`` (the highest ratio allowed) is met. ``load``
    is ``{"procs": N}`` or ``{"hosts": N}``."""
    p50 = statistics.median(values)
    out = {"what": what, **load, "n": len(values), "p50_ms": round(p50 * 1000, 1),
           "p95_ms": round(percentile(values, 0.95) * 1000, 1)}
    if anchor is not None and anchor_p50:
        ratio = p50 / anchor_p50
        out.update(anchor=anchor, anchor_p50_ms=round(anchor_p50 * 1000, 1),
                   ratio=round(ratio, 2))
        if target:
            out.update(target=f"<= {target:g}x", met=ratio <= target)
    return {**out, **extra}


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows as a Markdown table."""
    print("| what | load | p50 ms | p95 ms | anchor | ratio | target | met |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        load = (f"{r['procs']} extra procs" if "procs" in r
                else f"{r['hosts']} host{'s' if r['hosts'] > 1 else ''}")
        met = {True: "yes", False: "**no**", None: ""}[r.get("met")]
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
        print(f"| {r['what']} | {load} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} "
              f"| {r.get('anchor', '')} | {ratio} | {r.get('target', '')} | {met} |")


def machine() -> dict[str, Any]:
    """What the figures were taken on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": platform.node(),
            "kernel": platform.release(), "cpu": model, "cores": os.cpu_count(),
            "python": platform.python_version(),
            "nvidia_smi": shutil.which("nvidia-smi"),
            "load_avg": os.getloadavg()}


class Idle:
    """Extra idle processes (``sleep``), started and ended by PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def grow(self, total: int) -> None:
        while len(self.procs) < total:
            self.procs.append(subprocess.Popen(
                ["sleep", "86400"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, close_fds=False))

    def end(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        self.procs.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0,1000,5000",
                        help="extra idle processes at each load, comma-separated")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per method and load")
    parser.add_argument("--gpu-backend", default="auto",
                        help="GPU backend of check and of the probe: auto, nvml, nvidia-smi ...")
    parser.add_argument("--hosts", default="1,4,16",
                        help="SSH host counts (benchmarks/remote_check.py), comma-separated; "
                        "empty: no SSH part")
    parser.add_argument("--ssh-runs", type=int, default=5, help="timed runs per host count")
    parser.add_argument("--quick", action="store_true",
                        help="0 and 1,000 extra processes, 5 runs; 1 and 4 hosts, 3 runs")
    parser.add_argument("--json", default=None, help="write the rows and the machine here")
    args = parser.parse_args()
    if args.quick:
        args.levels, args.runs, args.hosts, args.ssh_runs = "0,1000", 5, "1,4", 3
    reexec_isolated("CLEANSLATE_CHECK_LATENCY_ISOLATED", "check_latency")

    info = machine()
    rows, backend = local_rows([int(x) for x in args.levels.split(",") if x], args.runs,
                               args.gpu_backend, info)
    notes = [f"GPU backend of check and probe: {backend}",
             "nvidia-smi: " + (info["nvidia_smi"] or "not installed: the one-liner's GPU query "
                               "fails at the command lookup and ps+gpu is ps alone")]
    if args.hosts:
        from remote_check import fleet_unavailable_reason, ssh_rows

        reason = fleet_unavailable_reason()
        if reason is None:
            rows += ssh_rows([int(n) for n in args.hosts.split(",")], args.ssh_runs, "auto")
        else:
            notes.append(f"SSH part not run: {reason}")
            print(f"SSH part not run: {reason}", file=sys.stderr)
    print()
    print_table(rows)
    for note in notes:
        print(f"- {note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "check_latency", "machine": info,
                                               "notes": notes, "rows": rows},
                                              indent=1) + "\n")
    return 0


def local_rows(levels: list[int], runs: int, gpu_backend: str,
               info: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The local part: at each level of extra idle processes, the one-liner, check as a
    process, ps+gpu and the probe, side by side; the rows and the backend's name."""
    from cleanslate.hosts import LocalExecutor
    from cleanslate.probe.gpu.base import resolve_backend
    from cleanslate.probe.host import probe_host

    script = Path(sys.executable).with_name("cleanslate")
    check_argv = ([str(script)] if script.exists() else [sys.executable, "-m", "cleanslate"]) \
        + ["check", "--json", "--gpu-backend", gpu_backend]
    has_smi = shutil.which("nvidia-smi") is not None
    executor = LocalExecutor()
    backend = asyncio.run(resolve_backend(gpu_backend, executor))
    ports = [8000, 8080, 30000]  # what check requires free by default (engines' ports)
    work = tempfile.mkdtemp(prefix="cs-check-latency-")  # no ./cleanslate.db: no store read
    elapsed: list[float] = []

    def one_liner() -> None:
        subprocess.run(["sh", "-c", ONE_LINER], capture_output=True, check=False)

    def check() -> None:
        done = subprocess.run(check_argv, capture_output=True, check=False, cwd=work,
                              env=check_env())
        try:
            elapsed.append(float(json.loads(done.stdout)["elapsed_s"]))
        except ValueError as exc:
            raise RuntimeError(f"check exited {done.returncode}: "
                               f"{done.stderr.decode(errors='replace')[-2000:]}") from exc

    def ps_gpu() -> None:
        subprocess.run(PS, capture_output=True, check=False)
        if has_smi:
            subprocess.run(GPU_QUERY, capture_output=True, check=False)

    async def probe_ok() -> str | None:
        # Returns no snapshot: Python 3.11's asyncio.run formats the repr of its main task's
        # result (signal.getsignal on the runner's SIGINT handler), a whole snapshot's.
        snap = await probe_host(executor, backend, ports=ports)
        bad = [s.name for s in snap.sources if s.critical and not s.ok]
        return f"the probe failed: {bad}" if bad else None

    def probe() -> None:
        error = asyncio.run(probe_ok())
        if error:
            raise RuntimeError(error)

    methods: dict[str, Callable[[], None]] = {"one-liner": one_liner, "check": check,
                                              "ps+gpu": ps_gpu, "probe": probe}
    print(f"{info['date']} on {info['host']}: {info['cores']} cores ({info['cpu']}), kernel "
          f"{info['kernel']}, Python {info['python']}, load average {info['load_avg']}; "
          f"nvidia-smi: {info['nvidia_smi'] or 'not installed (the GPU query is absent)'}; "
          f"GPU backend of check and probe: {backend.name}")
    anchor_ps = "ps -eo" + (" + nvidia-smi" if has_smi else " (no GPU query here)")
    rows: list[dict[str, Any]] = []
    idle = Idle()
    try:
        for level in levels:
            started = time.monotonic()
            idle.grow(level)
            census = sum(1 for n in os.listdir("/proc") if n.isdigit())
            print(f"{level} extra idle processes ({census} in the namespace) started in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
            times: dict[str, list[float]] = {name: [] for name in methods}
            for fn in methods.values():
                fn()  # warm the page cache (and write the bytecode caches) once
            elapsed.clear()
            names = list(methods)
            for i in range(runs):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    t0 = time.perf_counter()
                    methods[name]()
                    times[name].append(time.perf_counter() - t0)
            one = statistics.median(times["one-liner"])
            psg = statistics.median(times["ps+gpu"])
            load = {"procs": level}
            rows += [
                row("one-liner", load, times["one-liner"]),
                row("check (process)", load, times["check"], "one-liner", one, CHECK_RATIO),
                row("check elapsed_s", load, elapsed, "one-liner", one),
                row("ps+gpu", load, times["ps+gpu"]),
                row("probe", load, times["probe"], anchor_ps, psg, PROBE_RATIO),
            ]
            print_table(rows[-5:])
            print(flush=True)
    finally:
        idle.end()
        shutil.rmtree(work, ignore_errors=True)
    return rows, backend.name


if __name__ == "__main__":
    sys.exit(main())
