"""Fixtures of the bench tests: the fake streaming server, in-process or as a child process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

from cleanslate.bench._fakeserver import FakeOptions, FakeStats, serve


@contextlib.asynccontextmanager
async def fake_server(**opts: Any) -> AsyncIterator[tuple[str, FakeStats]]:
    """A fake OpenAI streaming server on 127.0.0.1 in the running event loop."""
    server, stats = await serve(0, FakeOptions(**opts))
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", stats
    finally:
        server.close()


def start_fake_server_process(procs: Any, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """The fake server as a child process (started through the suite's ``procs`` fixture, which
    ends it by PID); returns the process and its base URL."""
    proc = procs.start(
        [sys.executable, "-m", "cleanslate.bench._fakeserver", "--port", "0", *args],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("READY "), line
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"
