"""Streamed tokens per second the simulated engine sustains at concurrency 256.

Starts ``cleanslate sim serve`` (tp-size 1) with a performance model fast enough never to be
the limit (``--time-scale``), runs a closed-loop level of the benchmark client
(``cleanslate.bench``, ``ignore_eos``) in this process beside it (so on this machine server and
client share its cores), and prints the output tokens/s the client received plus the CPU
seconds each side used. Target: >= 5,000 tokens/s.

    python benchmarks/sim_capacity.py [--concurrency 256] [--requests 1024] [--output-len 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from cleanslate.bench import BenchConfig, ClosedLoop, LevelResult, RandomWorkload, run_level


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_level(
    url: str,
    model: str,
    concurrency: int,
    requests: int,
    input_len: int,
    output_len: int,
    *,
    chat: bool = False,
    timeout_s: float | None = None,
) -> LevelResult:
    """One closed-loop level: ``requests`` streamed requests, ``concurrency`` in flight, prompts
    of ``input_len`` sim tokens asking for ``output_len`` tokens (``ignore_eos``); each request
    must end within ``timeout_s`` seconds (``None``: the client's default)."""
    config = BenchConfig(
        url=url,
        model=model,
        endpoint="chat" if chat else "completions",
        workload=RandomWorkload(input_len=input_len, output_len=output_len),
        num_prompts=requests,
        request_timeout_s=timeout_s,
    )
    return asyncio.run(run_level(config, ClosedLoop(concurrency=concurrency)))


def summary(level: LevelResult) -> dict[str, Any]:
    """The figures this script and ``sim_model_table.py`` print; times in seconds."""

    def seconds(ms: float | None) -> float:
        return round(ms / 1000, 4) if ms is not None else float("nan")

    return {
        "concurrency": level.max_concurrency,
        "requests": level.completed + level.failed,
        "errors": level.failed,
        "output_tokens": level.total_output_tokens,
        "duration_s": round(level.duration, 3),
        "output_throughput": round(level.output_throughput, 1),
        "ttft_mean_s": seconds(level.ttft_ms.mean),
        "ttft_p50_s": seconds(level.ttft_ms.median),
        "ttft_p99_s": seconds(level.ttft_ms.p99),
    }


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 30.0) -> None:
    import urllib.request

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the sim server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the sim server did not become ready")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--time-scale", type=float, default=0.05)
    ap.add_argument("--chat", action="store_true")
    args = ap.parse_args()

    ledger = tempfile.mkdtemp(prefix="cleanslate-sim-capacity-")
    port = free_port()
    env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": ledger}
    argv = [
        sys.executable,
        "-m",
        "cleanslate.sim",
        "serve",
        "--port",
        str(port),
        "--tp-size",
        "1",
        "--max-running-requests",
        str(max(args.concurrency, 1)),
        "--disable-cuda-graph",
        "--mem-fraction-static",
        "0.9",
        "--time-scale",
        str(args.time_scale),
        "--decode-log-interval",
        "100000",
    ]
    log = open(os.path.join(ledger, "server.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        server = psutil.Process(proc.pid)
        me = psutil.Process()
        s0, c0 = server.cpu_times(), me.cpu_times()
        level = closed_level(
            url,
            "cleanslate/sim-70b",
            args.concurrency,
            args.requests,
            args.input_len,
            args.output_len,
            chat=args.chat,
        )
        s1, c1 = server.cpu_times(), me.cpu_times()
        server_cpu = (s1.user + s1.system) - (s0.user + s0.system)
        client_cpu = (c1.user + c1.system) - (c0.user + c0.system)
        tokens = level.total_output_tokens
        result = {
            **summary(level),
            "streamed_tokens_per_s": round(level.output_throughput, 1),
            "server_cpu_s": round(server_cpu, 2),
            "client_cpu_s": round(client_cpu, 2),
            "server_cpu_s_per_1k_tokens": round(1000 * server_cpu / max(1, tokens), 4),
            "cpus": os.cpu_count(),
            "endpoint": "chat/completions" if args.chat else "completions",
        }
        print(json.dumps(result, indent=2))
        verdict = "meets" if level.output_throughput >= 5000 else "misses"
        print(
            f"sim capacity: {level.output_throughput:,.0f} streamed tokens/s at concurrency "
            f"{args.concurrency} with the client beside it ({verdict} the 5,000 target)"
        )
        return 0 if level.failed == 0 else 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(ledger, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
