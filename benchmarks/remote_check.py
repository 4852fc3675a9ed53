"""``check`` over three SSH hosts: concurrent wall time vs the sum of single-host checks (issue 5).

Starts one OpenSSH server on 127.0.0.1 (``tests/hosts/sshd.py``: its own host key, key login,
free non-default ports) with three ports, each a ``Host`` alias of a client config in a
temporary home. Each port adds a fixed latency to every command through a ``ForceCommand``
wrapper that sleeps first (``slow-0.3``, ``slow-0.6``, ``slow-1.2`` seconds), so a sequential
check would cost about the sum and a concurrent one about the slowest.

Measured side by side, each run on a fresh event loop (a fresh connection, connect time
included), through the same code ``cleanslate check`` runs (``check_hosts``):

- each host alone, and the sum of the three;
- the three hosts in one ``check_hosts`` call (concurrent);
- once, the command line: ``cleanslate check --host A --host B --host C --json`` (its
  ``elapsed_s``, interpreter start excluded).

Prints medians over ``--runs`` and the ratio concurrent / sum. Needs ``/usr/sbin/sshd``
(``apt-get install -y openssh-server``). Not a test: machines here are noisy.

    python benchmarks/remote_check.py [--runs 5] [--delays 0.3,0.6,1.2]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hosts.sshd import Profile, sshd_available, start_sshd

from cleanslate.hosts.ssh import SSHExecutor
from cleanslate.verdict.check import CheckOptions, check_hosts
from cleanslate.verdict.rules import Scope

OPTIONS = CheckOptions(scope=Scope(engines=("llamacpp",)), gpu_backend="none", timeout=10.0)


def _timed(hosts: list[str]) -> tuple[float, list[str]]:
    async def go() -> tuple[float, list[str]]:
        started = time.monotonic()
        report = await check_hosts([SSHExecutor(h) for h in hosts], OPTIONS)
        return time.monotonic() - started, [h.verdict.value for h in report.hosts]

    return asyncio.run(go())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--delays", default="0.3,0.6,1.2",
                        help="seconds of latency per command on each of the three hosts")
    args = parser.parse_args()
    if not sshd_available():
        print("needs /usr/sbin/sshd: apt-get install -y openssh-server", file=sys.stderr)
        return 2
    delays = [float(d) for d in args.delays.split(",")]
    aliases = [f"slow-{d:g}" for d in delays]
    with tempfile.TemporaryDirectory(prefix="cleanslate-bench-ssh-") as tmp:
        server = start_sshd(Path(tmp), {a: Profile(delay_s=d) for a, d in zip(aliases, delays,
                                                                              strict=True)})
        os.environ["HOME"] = str(server.home)
        os.environ.pop("SSH_AUTH_SOCK", None)
        try:
            single: dict[str, list[float]] = {a: [] for a in aliases}
            sums: list[float] = []
            together: list[float] = []
            verdicts: set[str] = set()
            for _ in range(args.runs):
                run_sum = 0.0
                for alias in aliases:
                    elapsed, v = _timed([alias])
                    single[alias].append(elapsed)
                    verdicts.update(v)
                    run_sum += elapsed
                sums.append(run_sum)
                elapsed, v = _timed(aliases)
                together.append(elapsed)
                verdicts.update(v)
            cli = subprocess.run(
                [sys.executable, "-m", "cleanslate", "check", "--json", "--gpu-backend", "none",
                 "--engine", "llamacpp", *(x for a in aliases for x in ("--host", a))],
                capture_output=True, text=True, env=server.client_env(), check=False)
            cli_doc = json.loads(cli.stdout)
        finally:
            server.stop()
    med = statistics.median
    print(f"check over 3 SSH hosts on 127.0.0.1 (latency per command {args.delays} s), "
          f"median of {args.runs} runs, fresh connection each run")
    for alias in aliases:
        print(f"  {alias:<10} alone         {med(single[alias]):6.2f} s")
    print(f"  sum of the three alone     {med(sums):6.2f} s")
    print(f"  slowest alone              {max(med(v) for v in single.values()):6.2f} s")
    print(f"  concurrent (check_hosts)   {med(together):6.2f} s   "
          f"= {med(together) / med(sums):.2f} x the sum, "
          f"{med(together) / max(med(v) for v in single.values()):.2f} x the slowest")
    print(f"  CLI --host x3 elapsed_s    {cli_doc['elapsed_s']:6.2f} s   "
          f"(verdicts {[h['verdict'] for h in cli_doc['hosts']]})")
    print(f"  verdicts seen: {sorted(verdicts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
