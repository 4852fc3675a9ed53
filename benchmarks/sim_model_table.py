"""Measure the sim's performance model from the running server: the table of docs/sim-model.md.

For each configuration (the quick-start best and its neighbours along each flag) it starts
``cleanslate sim serve`` with the quick-start fixed flags, runs closed-loop streaming levels at
the quick-start concurrencies (32, 128, 256; three times as many requests, at most 512) with
the quick-start workload (1024 prompt tokens, 128 output tokens, ``ignore_eos``) with the
benchmark client (``cleanslate.bench``), stops the server, and prints a Markdown table: output
tokens/s and mean TTFT per level, each beside the model's steady-state estimate
(``SimModel.estimate``), or how the configuration failed (OOM at start, crash). Takes about
10 minutes at ``--time-scale 1``.

    python benchmarks/sim_model_table.py [--time-scale 1.0] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cleanslate.sim.model import (
    QUICKSTART_CONCURRENCY,
    QUICKSTART_FIXED,
    QUICKSTART_WORKLOAD,
    SimModel,
    settings_from_flags,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_capacity import closed_level, free_port, summary

MODEL = "cleanslate/sim-70b"
BEST = {
    "mem-fraction-static": 0.88,
    "disable-cuda-graph": False,
    "max-running-requests": 128,
    "chunked-prefill-size": 16384,
}
CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("best", {}),
    ("mem 0.85", {"mem-fraction-static": 0.85}),
    ("mem 0.92", {"mem-fraction-static": 0.92}),
    ("mem 0.92, chunk 4096", {"mem-fraction-static": 0.92, "chunked-prefill-size": 4096}),
    ("no CUDA graph", {"disable-cuda-graph": True}),
    ("max-running 64", {"max-running-requests": 64}),
    ("max-running 256", {"max-running-requests": 256}),
    ("chunk 4096", {"chunked-prefill-size": 4096}),
    ("chunk 1024", {"chunked-prefill-size": 1024}),
    (
        "corner: 0.80, eager, 64, 1024",
        {
            "mem-fraction-static": 0.80,
            "disable-cuda-graph": True,
            "max-running-requests": 64,
            "chunked-prefill-size": 1024,
        },
    ),
]
LEVELS = [(c, min(512, 3 * c)) for c in QUICKSTART_CONCURRENCY]


def flags_argv(flags: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in flags.items():
        if value is True:
            out.append(f"--{key}")
        elif value is not False:
            out += [f"--{key}", str(value)]
    return out


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def run_config(flags: dict[str, Any], time_scale: float, tmp: str) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(tmp, f"server-{port}.log")
    argv = [
        sys.executable,
        "-m",
        "cleanslate.sim",
        "serve",
        "--port",
        str(port),
        "--time-scale",
        str(time_scale),
        *flags_argv(flags),
    ]
    env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": os.path.join(tmp, "gpus")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"flags": flags, "levels": {}}
    try:
        while not healthy(url):
            if proc.poll() is not None:
                text = Path(log_path).read_text(errors="replace")
                result["failed"] = (
                    "OOM at start"
                    if "OutOfMemoryError" in text
                    else (f"exit {proc.returncode} at start")
                )
                return result
            time.sleep(0.05)
        for concurrency, n in LEVELS:
            level = closed_level(
                url,
                MODEL,
                concurrency,
                n,
                QUICKSTART_WORKLOAD["input_len"],
                QUICKSTART_WORKLOAD["output_len"],
                timeout_s=600,
            )
            figures = summary(level)
            if level.failed or proc.poll() is not None:
                text = Path(log_path).read_text(errors="replace")
                figures["failed"] = "crash" if "Traceback" in text else f"{level.failed} errors"
                result["levels"][concurrency] = figures
                break
            result["levels"][concurrency] = figures
        return result
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def estimate(flags: dict[str, Any], concurrency: int) -> dict[str, float] | None:
    """The model's steady-state estimate of a level (``None`` where the server cannot start)."""
    model = SimModel(settings_from_flags(flags))
    plan = model.memory_plan()
    if plan.oom_at_start or plan.not_enough_for_kv:
        return None
    return model.estimate(concurrency, QUICKSTART_WORKLOAD["input_len"],
                          QUICKSTART_WORKLOAD["output_len"])


def cell(result: dict[str, Any], concurrency: int) -> tuple[str, str]:
    """(tok/s measured (model), mean TTFT s measured (model)) of one level."""
    if "failed" in result:
        return result["failed"], "-"
    level = result["levels"].get(concurrency)
    if level is None:
        return "-", "-"
    if "failed" in level:
        return level["failed"], "-"
    est = estimate(result["flags"], concurrency)
    model_tps = f" ({est['output_throughput']:,.0f})" if est else ""
    model_ttft = f" ({est['ttft_s']:.1f})" if est else ""
    return (
        f"{level['output_throughput']:,.0f}{model_tps}",
        f"{level['ttft_mean_s']:.2f}{model_ttft}",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cleanslate-sim-table-")
    os.makedirs(os.path.join(tmp, "gpus"))
    rows = []
    try:
        for name, change in CONFIGS:
            flags = {**QUICKSTART_FIXED, **BEST, **change}
            t0 = time.monotonic()
            result = run_config(flags, args.time_scale, tmp)
            result["name"] = name
            rows.append(result)
            print(
                f"{name}: {json.dumps(result['levels']) or result.get('failed')} "
                f"({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    head = " | ".join(f"tok/s c={c} | TTFT mean s c={c}" for c, _ in LEVELS)
    print(f"| configuration | mem | graph | max-run | chunk | {head} |")
    print("|---|---|---|---|---|" + "---|---|" * len(LEVELS))
    for r in rows:
        f = r["flags"]
        cells = " | ".join(" | ".join(cell(r, c)) for c, _ in LEVELS)
        graph = "off" if f["disable-cuda-graph"] else "on"
        print(
            f"| {r['name']} | {f['mem-fraction-static']} | {graph} | "
            f"{f['max-running-requests']} | {f['chunked-prefill-size']} | {cells} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
