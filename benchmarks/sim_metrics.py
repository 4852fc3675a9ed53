"""The sim's /metrics: what a scrape costs the server, and what it shows under a capped batch.

1. **Overhead**: one ``cleanslate sim serve --enable-metrics`` (noise off: no drift, no cold
   start, a fixed noise seed), closed-loop levels at concurrency 64 with the benchmark client,
   alternating "no scraper" and "a scraper process GETting /metrics every 250 ms" (``--runs``
   pairs, "off" first in each pair, after one warm-up level). Prints each level's output
   tokens/s, the per-pair ratio on/off and its mean, min and max, and the scrapes' round trip.
2. **Issue 36's case**: a server with ``--max-running-requests 64`` at concurrency 256,
   scraped every 250 ms during the level: the most running requests seen, the waiting queue's
   mean and max, the KV usage's max, and the cap ``/server_info`` reports in effect.

    python benchmarks/sim_metrics.py [--runs 3] [--requests 256] [--time-scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_capacity import closed_level, free_port, wait_ready

MODEL = "cleanslate/sim-70b"
QUIET = ["--drift", "0", "--cold-start", "1", "--cold-start-decode", "1", "--noise-seed", "1",
         "--decode-log-interval", "40"]

# The scraper: a separate process, as a real one would be; prints its round trips (s) when
# it is sent SIGTERM.
SCRAPER = r"""
import signal, sys, time, urllib.request
url, period = sys.argv[1], float(sys.argv[2])
trips = []
def done(*_):
    print(" ".join(f"{t:.6f}" for t in trips)); sys.stdout.flush(); sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    t0 = time.monotonic()
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        r.read()
    trips.append(time.monotonic() - t0)
    time.sleep(max(0.0, period - (time.monotonic() - t0)))
"""


class Server:
    """One sim server in its own ledger, ended by its PID."""

    def __init__(self, *flags: str) -> None:
        self.ledger = tempfile.mkdtemp(prefix="cleanslate-sim-metrics-")
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "cleanslate.sim", "serve", "--port",
                self.url.rsplit(":", 1)[1], "--enable-metrics", *flags]
        self.log = open(os.path.join(self.ledger, "server.log"), "wb")  # noqa: SIM115
        env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": self.ledger}
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.url, self.proc)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.ledger, ignore_errors=True)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if not s.name.endswith("_bucket")}


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    server = Server("--time-scale", str(args.time_scale), *QUIET)
    try:
        def level() -> float:
            return closed_level(server.url, MODEL, 64, args.requests, 128, 64).output_throughput

        level()  # warm-up
        off: list[float] = []
        on: list[float] = []
        trips: list[float] = []
        for _ in range(args.runs):
            off.append(level())
            scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, server.url, "0.25"],
                                       stdout=subprocess.PIPE, text=True)
            time.sleep(0.3)  # its first scrape is in before the level starts
            on.append(level())
            scraper.send_signal(signal.SIGTERM)
            out, _ = scraper.communicate(timeout=10)
            trips += [float(t) for t in out.split()]
        ratios = [b / a for a, b in zip(off, on, strict=True)]
        return {
            "concurrency": 64, "requests_per_level": args.requests,
            "off_tok_s": [round(x, 1) for x in off], "on_tok_s": [round(x, 1) for x in on],
            "ratio_on_off": [round(r, 4) for r in ratios],
            "ratio_mean": round(statistics.fmean(ratios), 4),
            "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4),
            "scrapes": len(trips),
            "scrape_ms_p50": round(1000 * statistics.median(trips), 2) if trips else None,
            "scrape_ms_max": round(1000 * max(trips), 2) if trips else None,
        }
    finally:
        server.stop()


def capped(args: argparse.Namespace) -> dict[str, Any]:
    server = Server("--max-running-requests", "64", "--time-scale", str(args.time_scale / 2),
                    *QUIET)
    try:
        samples: list[dict[str, float]] = []
        result: list[Any] = []
        load = threading.Thread(
            target=lambda: result.append(closed_level(server.url, MODEL, 256, 512, 128, 64)))
        load.start()
        while load.is_alive():
            samples.append(scrape(server.url))
            time.sleep(0.25)
        load.join()
        with urllib.request.urlopen(server.url + "/server_info", timeout=5) as resp:
            info = json.loads(resp.read())
        busy = [s for s in samples if s["sglang:num_running_reqs"] > 0]
        return {
            "concurrency": 256, "max_running_requests": 64, "samples": len(samples),
            "output_tok_s": round(result[0].output_throughput, 1),
            "running_max": max(s["sglang:num_running_reqs"] for s in samples),
            "waiting_mean_busy": round(statistics.fmean(
                s["sglang:num_queue_reqs"] for s in busy), 1) if busy else None,
            "waiting_max": max(s["sglang:num_queue_reqs"] for s in samples),
            "kv_usage_max": round(max(s["sglang:token_usage"] for s in samples), 4),
            "server_info_cap": info["internal_states"][0]["effective_max_running_requests_per_dp"],
        }
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--time-scale", type=float, default=1.0)
    args = ap.parse_args()
    out = {"overhead": overhead(args), "capped": capped(args), "cpus": os.cpu_count()}
    print(json.dumps(out, indent=2))
    o, c = out["overhead"], out["capped"]
    print(f"throughput with a 250 ms scraper / without, c=64, {args.runs} pairs: "
          f"{o['ratio_mean']:.3f} (min {o['ratio_min']:.3f}, max {o['ratio_max']:.3f}); "
          f"scrape p50 {o['scrape_ms_p50']} ms")
    print(f"cap 64 at c=256: running max {c['running_max']:.0f}, waiting mean "
          f"{c['waiting_mean_busy']} (max {c['waiting_max']:.0f}), KV max {c['kv_usage_max']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
