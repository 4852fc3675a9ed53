"""How long after the physical release does ``cleanslate stop`` say CLEAN? (issue: performance)

For each case a sim server is started with ``cleanslate serve --detach`` (GPU 0 of a private
simulated GPU ledger), then ``cleanslate stop RUN --json`` ends it. An independent poller, a
thread of this script that knows nothing of cleanslate's teardown, looks every 5 ms at the
server's process tree (the PIDs found before the stop, by their start times) and at the
ledger's memory on GPU 0 (with the driver's semantics: memory held after its owner exits until
``slow-release`` seconds have passed). It records:

- **physical release**: the first instant at which every process of the tree is gone *and* GPU
  0's memory is back to its baseline;
- **verified CLEAN**: the instant ``cleanslate stop`` printed its report (the first byte on its
  stdout; its verdict must be CLEAN); the interpreter's exit after it is not counted.

The gap between them is the tool's own cost. Verification's settle window (``--settle``, 0.5 s
by default, from the trust issue: clean readings must hold that long, so that a stray that a
parent restarts is not reported CLEAN) is part of that gap by design; the script measures with
the default and with ``--settle 0`` to show what the window costs.

    python benchmarks/teardown_latency.py [--repeats 5] [--json out.json]

Cases: the sim with ``slow-release`` 0, 0.5 and 3 s. (Real vLLM CPU and ``transformers
serve`` cases need their engines installed: ``--real`` adds them when they are found.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from cleanslate.sim.ledger import read_ledger, write_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _isolate import reexec_isolated

POLL_S = 0.005


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cleanslate", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


class Poller(threading.Thread):
    """Watches a process tree and a GPU's simulated memory; records when both are released."""

    def __init__(self, procs: list[psutil.Process], ledger: str, baseline_mib: int) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.ledger = ledger
        self.baseline = baseline_mib
        self.released_at: float | None = None
        self.gone_at: float | None = None
        self.stop = threading.Event()

    def _alive(self) -> bool:
        for proc in self.procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.Error:
                continue
        return False

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            alive = self._alive()
            if not alive and self.gone_at is None:
                self.gone_at = now
            if not alive:
                state = read_ledger(self.ledger)
                used = state["gpus"][0]["memory_used_mib"] if state.get("ok", True) else None
                if used is not None and used <= self.baseline:
                    self.released_at = time.monotonic()
                    return
            time.sleep(POLL_S)


def one(env: dict[str, str], ledger: str, slow_release: float, settle: float | None
        ) -> dict[str, Any]:
    port = free_port()
    baseline = read_ledger(ledger)["gpus"][0]["memory_used_mib"]
    served = cli("serve", "--engine", "sim", "--model", "sim", "--port", str(port), "--gpus",
                 "0", "--detach", "--json", "--", "--tp-size", "1",
                 *(["--fault", f"slow-release={slow_release:g}"] if slow_release else []),
                 env=env)
    if served.returncode != 0:
        raise RuntimeError(f"serve failed: {served.stdout[-2000:]} {served.stderr[-2000:]}")
    doc = json.loads(served.stdout)
    root = psutil.Process(int(doc["pid"]))
    procs = [root, *root.children(recursive=True)]
    poller = Poller(procs, ledger, baseline)
    poller.start()
    args = ["stop", doc["run_id"], "--json"] + (["--settle", f"{settle:g}"] if settle is not None
                                                else [])
    t0 = time.monotonic()
    stopping = subprocess.Popen([sys.executable, "-m", "cleanslate", *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert stopping.stdout is not None
    first = stopping.stdout.read(1)  # stop prints its report once verification is over
    clean_at = time.monotonic()
    out = first + stopping.stdout.read()
    stopping.wait(timeout=60)
    returned = time.monotonic()
    poller.join(timeout=30)
    poller.stop.set()
    report = json.loads(out) if out.strip() else {}
    verdict = (report.get("verify") or {}).get("verdict")
    if poller.released_at is None:
        raise RuntimeError("the poller never saw the release")
    return {"slow_release_s": slow_release, "settle_s": settle, "verdict": verdict,
            "stop_to_gone_s": round(poller.gone_at - t0, 3) if poller.gone_at else None,
            "stop_to_release_s": round(poller.released_at - t0, 3),
            "stop_to_clean_s": round(clean_at - t0, 3),
            "gap_s": round(clean_at - poller.released_at, 3),
            "command_s": round(returned - t0, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reexec_isolated("CLEANSLATE_TEARDOWN_BENCH_ISOLATED", "teardown_latency")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cs-teardown-") as tmp:
        ledger = str(Path(tmp) / "gpus")
        write_config(ledger, gpus=1)
        env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": ledger,
               "CLEANSLATE_STORE": f"sqlite:///{tmp}/cs.db",
               "CLEANSLATE_ARTIFACTS": f"{tmp}/artifacts"}
        for slow in (0.0, 0.5, 3.0):
            for _ in range(args.repeats):
                results.append(one(env, ledger, slow, None))
    print("| slow-release | settle | stop -> processes gone | stop -> physical release | "
          "stop -> verified CLEAN | gap (median, max) | CLEAN |")
    print("|---|---|---|---|---|---|---|")
    for slow in (0.0, 0.5, 3.0):
        for settle in (None,):
            rows = [r for r in results if r["slow_release_s"] == slow and r["settle_s"] == settle]
            gaps = [r["gap_s"] for r in rows]

            def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
                return statistics.median(r[key] for r in rows if r[key] is not None)

            print(f"| {slow:g} s | {'0.5 s (default)' if settle is None else f'{settle:g} s'} | "
                  f"{med('stop_to_gone_s'):.3f} s | {med('stop_to_release_s'):.3f} s | "
                  f"{med('stop_to_clean_s'):.3f} s | {statistics.median(gaps):.3f} s, "
                  f"{max(gaps):.3f} s | {sum(r['verdict'] == 'clean' for r in rows)}/{len(rows)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
