"""Multi-turn conversations against a real vLLM (CPU build): per-turn TTFT and cached tokens.

Issue 27's "must show": ``cleanslate bench --workload conversation:...`` run against a real
engine, with the server's prefix cache on (and, for contrast, off), reporting each turn's TTFT
and the prompt tokens the server says it served from its cache
(``usage.prompt_tokens_details.cached_tokens``, which vLLM sends only with
``--enable-prompt-tokens-details``).

The engine is started the way ``tests/launch/test_real_engines_lifecycle.py`` starts it: the tiny
random-weight Llama of :func:`cleanslate.testing.tiny_model.build_tiny_llama` (head_dim 64, no
download), ``python -m vllm.entrypoints.openai.api_server`` of the vLLM CPU build's virtual
environment (``CLEANSLATE_VLLM_PYTHON``, else ``scratch/vllm-venv/bin/python``), the tests'
flags ``--max-model-len 512 --dtype bfloat16 --enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE=1``,
plus ``--enable-prompt-tokens-details`` and ``--enable-prefix-caching`` (or
``--no-enable-prefix-caching``). The engine runs in its own session and is ended by its process
group only (API server, EngineCore and Worker).

Usage (from the repository root)::

    python3 benchmarks/multiturn_real.py --prefix-cache on  --out scratch/multiturn/on
    python3 benchmarks/multiturn_real.py --prefix-cache off --out scratch/multiturn/off

Each run writes ``bench.json`` (cleanslate's result), ``bench.txt`` (its printed output),
``vllm.log`` and ``command.txt`` into ``--out``; the bench's per-turn table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: The flags and environment of tests/launch/test_real_engines_lifecycle.py (VLLM_FLAGS, VLLM_ENV).
TEST_FLAGS = ["--max-model-len", "512", "--dtype", "bfloat16", "--enforce-eager"]
TEST_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
SERVED_NAME = "tiny-llama"
READY_TIMEOUT_S = 480


def vllm_python() -> str:
    configured = os.environ.get("CLEANSLATE_VLLM_PYTHON")
    if configured:
        return configured
    local = REPO / "scratch" / "vllm-venv" / "bin" / "python"
    if local.exists():
        return str(local)
    sys.exit("vLLM CPU build not found: set CLEANSLATE_VLLM_PYTHON (docs/engines.md)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the engine's process group (its session: only what it started), then SIGKILL."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (proc.poll() is None or group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    proc.wait(timeout=10)


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> float:
    start = time.monotonic()
    url = f"http://127.0.0.1:{port}/health"
    while time.monotonic() - start < READY_TIMEOUT_S:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            sys.exit(f"vLLM exited {proc.returncode} before ready; log tail:\n{tail}")
        with (contextlib.suppress(urllib.error.URLError, OSError),
              urllib.request.urlopen(url, timeout=3) as response):
            if response.status == 200:
                return time.monotonic() - start
        time.sleep(0.5)
    sys.exit(f"vLLM not ready on {url} after {READY_TIMEOUT_S} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix-cache", choices=["on", "off"], default="on")
    parser.add_argument("--out", type=Path, required=True, help="folder for the run's files")
    parser.add_argument("--workload",
                        default="conversation:turns=4,input_len=64,output_len=16")
    parser.add_argument("--endpoint", default="chat", choices=["chat", "completions"])
    parser.add_argument("--concurrency", default="2")
    parser.add_argument("--num-prompts", default="16")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--block-size", type=int, default=None,
                        help="vLLM's --block-size (default: the engine's own)")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO / "src"))
    from cleanslate.testing.tiny_model import build_tiny_llama

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="multiturn-") as tmp:
        model = build_tiny_llama(Path(tmp) / "model")
        port = free_port()
        cache_flag = ("--enable-prefix-caching" if args.prefix_cache == "on"
                      else "--no-enable-prefix-caching")
        server = [vllm_python(), "-m", API_SERVER_MODULE, "--model", str(model),
                  "--served-model-name", SERVED_NAME, "--port", str(port), *TEST_FLAGS,
                  cache_flag, "--enable-prompt-tokens-details"]
        if args.block_size is not None:
            server += ["--block-size", str(args.block_size)]
        bench = [sys.executable, "-m", "cleanslate", "bench", "--url",
                 f"http://127.0.0.1:{port}", "--model", SERVED_NAME, "--endpoint",
                 args.endpoint, "--workload", args.workload, "--concurrency", args.concurrency,
                 "--num-prompts", args.num_prompts, "--seed", args.seed, "--tokenizer",
                 str(model), "--json", str(args.out / "bench.json"), "--no-live"]
        log = args.out / "vllm.log"
        with log.open("wb") as log_file:
            proc = subprocess.Popen(server, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **TEST_ENV},
                                    start_new_session=True)
            try:
                ready_s = wait_ready(proc, port, log)
                print(f"vLLM ready in {ready_s:.0f} s (prefix cache {args.prefix_cache})",
                      flush=True)
                env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "160"}
                done = subprocess.run(bench, env=env, capture_output=True, text=True,
                                      timeout=900, check=False)
            finally:
                stop(proc)
        (args.out / "bench.txt").write_text(done.stdout + done.stderr)
        (args.out / "command.txt").write_text(
            "VLLM_CPU_KVCACHE_SPACE=1 " + shlex.join(server) + "\n" + shlex.join(bench) + "\n"
            f"# vLLM ready in {ready_s:.0f} s; bench exit {done.returncode}\n")
        print(done.stdout + done.stderr, end="")
        if done.returncode != 0:
            sys.exit(done.returncode)
        result = json.loads((args.out / "bench.json").read_text())
        for turn in result["levels"][0].get("turns") or ():
            print(json.dumps(turn))


if __name__ == "__main__":
    main()
