"""``check`` over 1, 4 and 16 SSH hosts: N hosts against the slowest single host (issue 18).

Starts 16 test hosts as ``tests/fleet`` does (``tests.fleet.hosts.start_fleet``): one OpenSSH
server per host on 127.0.0.1, each in its own PID namespace with its own ``/dev/shm`` and
simulated GPU ledger, so that each host's collector sees only that host's processes, as on
separate machines; the whole benchmark runs in private namespaces (``benchmarks/_isolate.py``).
The GPU reading is the ``sim`` backend's (``--gpu-backend auto`` picks it through the fleet's
ledger variable): a second command on each host, as ``nvidia-smi`` is on a GPU host. For each N
of ``--hosts``, side by side, alternating:

- ``single``: each of the N hosts alone through ``check_hosts`` (what ``cleanslate check
  --host H`` runs; a fresh event loop and so a fresh SSH connection each time);
- ``together``: the N hosts in one ``check_hosts`` call (concurrent);
- ``cli``: ``cleanslate check --json --host ...`` with the N hosts, as a process.

The figure is ``together`` p50 over the slowest host's ``single`` p50 (target: about 1, written
here as at most 1.25x). The hosts share this machine's cores, unlike separate machines: each
host's work (sshd's session, its ``python3`` collector and GPU reading) runs on the same CPUs as
every other host's and the client's. So the CPU time of a ``together`` run is reported for the
client (the checker's share, which separate hosts would still serialise in its one event loop)
and for the hosts (every process of their namespaces): where the ratio misses, they say whether
the checker or the shared cores are the bottleneck. ``benchmarks/check_latency.py`` runs this
too, after its local part.

    sudo python benchmarks/remote_check.py [--hosts 1,4,16] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _isolate import reexec_isolated  # noqa: E402
from check_latency import check_env, machine, print_table, row  # noqa: E402

TARGET = 1.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,4,16", help="host counts, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per measurement")
    parser.add_argument("--gpu-backend", default="auto",
                        help="GPU backend of every check (auto: the hosts' simulated GPUs)")
    parser.add_argument("--json", default=None, help="write the rows and the machine here")
    args = parser.parse_args()
    reexec_isolated("CLEANSLATE_REMOTE_CHECK_ISOLATED", "remote_check")
    reason = fleet_unavailable_reason()
    if reason is not None:
        print(f"remote_check: {reason}", file=sys.stderr)
        return 2
    info = machine()
    rows = ssh_rows([int(n) for n in args.hosts.split(",")], args.runs, args.gpu_backend)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "remote_check", "machine": info,
                                               "rows": rows}, indent=1) + "\n")
    return 0


def fleet_unavailable_reason() -> str | None:
    """Why the namespaced sshd hosts cannot run here (``None``: they can)."""
    from tests.fleet.hosts import fleet_unavailable

    return fleet_unavailable()


def ssh_rows(counts: list[int], runs: int, gpu_backend: str) -> list[dict[str, Any]]:
    """Start max(counts) namespaced sshd hosts and, for each N of ``counts``, time the N
    hosts alone and together (in process) and the command line over them; the result rows."""
    from tests.fleet.hosts import start_fleet

    from cleanslate.hosts import Executor
    from cleanslate.hosts.ssh import SSHExecutor
    from cleanslate.verdict.check import CheckOptions, check_hosts
    from cleanslate.verdict.rules import Scope

    aliases = [f"host-{i:02d}" for i in range(1, max(counts) + 1)]
    options = CheckOptions(scope=Scope(), ports=(8000, 8080, 30000), gpu_backend=gpu_backend,
                           timeout=30.0)
    ticks = os.sysconf("SC_CLK_TCK")

    def timed(hosts: list[str]) -> tuple[float, float, list[str]]:
        """Wall seconds, this process's CPU seconds and the verdicts of one check_hosts."""
        async def go() -> tuple[float, float, list[str]]:
            executors: list[Executor] = [SSHExecutor(h) for h in hosts]
            cpu, wall = time.process_time(), time.perf_counter()
            report = await check_hosts(executors, options)
            took = time.perf_counter() - wall, time.process_time() - cpu
            # Not timed: the command line exits instead; left open, each run's connections
            # would stay on the hosts.
            await asyncio.gather(*(e.close() for e in executors))
            return *took, [h.verdict.value for h in report.hosts]

        return asyncio.run(go())

    def hosts_cpu() -> float:
        """CPU seconds the hosts' processes have used so far: every process of each host's
        namespace, with the children it has reaped (sshd reaps its sessions, the init the
        rest)."""
        total = 0
        for host in fleet.hosts.values():
            procfs = f"/proc/{host.init_pid}/root/proc"
            for name in os.listdir(procfs):
                if name.isdigit():
                    try:
                        with open(f"{procfs}/{name}/stat", "rb") as fh:
                            stat = fh.read().decode(errors="replace")
                    except OSError:
                        continue
                    fields = stat[stat.rfind(")") + 2:].split()
                    total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        return total / ticks

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cs-remote-check-") as tmp:
        started = time.monotonic()
        fleet = start_fleet(Path(tmp) / "fleet", aliases, gpus=8)
        print(f"{len(aliases)} namespaced sshd hosts started in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        saved = dict(os.environ)
        client = fleet.client_env()
        os.environ.clear()
        os.environ.update(client)
        try:
            timed(aliases[:1])  # warm the page cache once
            for n in counts:
                hosts = aliases[:n]
                single: dict[str, list[float]] = {h: [] for h in hosts}
                together: list[float] = []
                client_cpu: list[float] = []
                host_cpu: list[float] = []
                cli: list[float] = []
                verdicts: set[str] = set()
                for i in range(runs):
                    steps = ["single", "together", "cli"]
                    for step in steps[i % 3:] + steps[:i % 3]:
                        if step == "single":
                            for h in hosts:
                                wall, _, v = timed([h])
                                single[h].append(wall)
                                verdicts.update(v)
                        elif step == "together":
                            before = hosts_cpu()
                            wall, cpu, v = timed(hosts)
                            host_cpu.append(hosts_cpu() - before)
                            together.append(wall)
                            client_cpu.append(cpu)
                            verdicts.update(v)
                        else:
                            t0 = time.perf_counter()
                            done = subprocess.run(
                                [sys.executable, "-m", "cleanslate", "check", "--json",
                                 "--gpu-backend", gpu_backend,
                                 *(x for h in hosts for x in ("--host", h))],
                                capture_output=True, text=True, check=False, cwd=tmp,
                                env=check_env())
                            cli.append(time.perf_counter() - t0)
                            try:
                                doc = json.loads(done.stdout)
                            except ValueError as exc:
                                raise RuntimeError(f"check exited {done.returncode}: "
                                                   f"{done.stderr[-2000:]}") from exc
                            verdicts.update(h["verdict"] for h in doc["hosts"])
                slowest = max(hosts, key=lambda h: statistics.median(single[h]))
                load = {"hosts": n}
                rows += [
                    row("slowest single host", load, single[slowest], host=slowest),
                    row("N hosts together", load, together, "slowest single host",
                        statistics.median(single[slowest]), TARGET,
                        client_cpu_ms=round(statistics.median(client_cpu) * 1000, 1),
                        hosts_cpu_ms=round(statistics.median(host_cpu) * 1000, 1),
                        verdicts=sorted(verdicts)),
                    row("check CLI process", load, cli),
                ]
                print_table(rows[-3:])
                print(f"CPU of a run with the {n} hosts together: client "
                      f"{rows[-2]['client_cpu_ms']:.0f} ms, hosts {rows[-2]['hosts_cpu_ms']:.0f}"
                      f" ms; verdicts {sorted(verdicts)}\n", flush=True)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            fleet.stop()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
