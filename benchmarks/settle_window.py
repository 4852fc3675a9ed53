"""What the ``--until-clean`` settle window costs and what it catches (issue 12).

Two measurements per settle window (seconds, ``--settle``):

- **cost**: wall time of ``check_until_clean`` on a host that is already clean (nothing in
  scope), p50 over ``--runs`` runs: what every teardown verification pays on top of one reading;
- **catch rate**: a parent process with an innocent name restarts a child that carries a run
  marker (a stray, under a scope that counts only that marker) in a loop: the child lives
  ``LIFE`` seconds, the parent waits ``GAP`` seconds before the next one. Each trial runs
  ``check_until_clean`` (deadline 5 s, interval 0.25 s); a CLEAN verdict is a false CLEAN.

Prints one row per (settle, life/gap) with the false CLEAN count. Not a test: the machine is
shared and noisy; the test suite asserts the behaviour on one respawner
(``tests/verdict/test_until_clean.py``).

    python benchmarks/settle_window.py [--settle 0,0.25,0.5,1] [--trials 20] [--runs 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

from cleanslate.hosts.local import LocalExecutor
from cleanslate.verdict.check import CheckOptions, check_until_clean
from cleanslate.verdict.findings import Verdict
from cleanslate.verdict.rules import Scope

#: The parent: ``python -c RESPAWNER LIFE GAP``; only the child carries the marker
#: (``CHILD_MARKER`` in the parent's environment).
RESPAWNER = (
    "import os, subprocess, sys, time\n"
    "life, gap = float(sys.argv[1]), float(sys.argv[2])\n"
    "env = {**os.environ, 'CLEANSLATE_RUN': os.environ.pop('CHILD_MARKER')}\n"
    "while True:\n"
    "    subprocess.run([sys.executable, '-c', 'import sys, time; time.sleep(float(sys.argv[1]))',"
    " str(life)], env=env)\n"
    "    time.sleep(gap)\n"
)


def _options(marker: str) -> CheckOptions:
    return CheckOptions(scope=Scope(engines=(), markers=frozenset({marker}),
                                    exclude_roots=frozenset({os.getpid()})),
                        gpu_backend="none")


def _run(marker: str, settle: float) -> tuple[Verdict, float]:
    start = time.perf_counter()
    report = asyncio.run(check_until_clean([LocalExecutor()], _options(marker), deadline_s=5.0,
                                           interval_s=0.25, settle_s=settle))
    return report.verdict, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", default="0,0.25,0.5,1", help="settle windows, seconds")
    parser.add_argument("--cycles", default="0.2/0.1,0.1/0.2,0.3/0.3,0.05/0.25",
                        help="child LIFE/GAP pairs, seconds")
    parser.add_argument("--trials", type=int, default=20, help="trials per respawner")
    parser.add_argument("--runs", type=int, default=10, help="timed runs on a clean host")
    args = parser.parse_args()
    settles = [float(s) for s in args.settle.split(",")]
    cycles = [tuple(float(x) for x in c.split("/")) for c in args.cycles.split(",")]

    print(f"{'settle s':>8}  {'clean host p50 s':>16}  " + "  ".join(
        f"{f'false CLEAN {life:g}/{gap:g}':>20}" for life, gap in cycles))
    for settle in settles:
        costs = [_run(f"quiet-{uuid.uuid4().hex}", settle)[1] for _ in range(args.runs)]
        cells = []
        for life, gap in cycles:
            marker = f"respawn-{uuid.uuid4().hex[:8]}"
            parent = subprocess.Popen(
                [sys.executable, "-c", RESPAWNER, str(life), str(gap)],
                env={**os.environ, "CHILD_MARKER": marker})
            try:
                time.sleep(0.5)
                false_clean = sum(_run(marker, settle)[0] == Verdict.CLEAN
                                  for _ in range(args.trials))
            finally:
                parent.kill()
                parent.wait()
            cells.append(f"{false_clean:>3} of {args.trials:<3}")
        print(f"{settle:>8g}  {statistics.median(costs):>16.2f}  "
              + "  ".join(f"{c:>20}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
