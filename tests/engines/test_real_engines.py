"""A real engine on this CPU machine, through the adapter's parts alone: ``transformers serve``.

Each test builds the tiny random-weight Llama in ``tmp_path`` (no download), launches the engine
with the argv its adapter builds, validates the flags against the engine's real ``--help``,
waits for ``/health``, runs the smoke test, and ends what it started by process group (the
engine runs in its own session, so its group is exactly what it started: vLLM's EngineCore and
Worker included).

vLLM's CPU build is tested through the whole lifecycle instead
(``tests/launch/test_real_engines_lifecycle.py``: ready, smoke test, stop, and the head_dim 16
model whose first request is an HTTP 500), which covers what a test of the parts here did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
import pytest

from cleanslate.engines import EngineAdapter, classify_log, get_engine, smoke_test, validate_flags
from cleanslate.hosts.local import LocalExecutor
from tests._kit import free_port

pytestmark = pytest.mark.slow



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
