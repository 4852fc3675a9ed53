"""Fixtures of the bench tests: the fake OpenAI server, in-process or as a child process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

from cleanslate.testing.fake_openai import (
    FakeOptions,
    FakeStats,
    parse_faults,
    start_fake_server,
)


@contextlib.asynccontextmanager
async def fake_server(
    *faults: str, itl_s: float = 0.0, ttft_s: float = 0.0
) -> AsyncIterator[tuple[str, FakeStats]]:
    """The fake server on 127.0.0.1 in the running event loop, with these faults (see
    :mod:`cleanslate.testing.fake_openai`); yields its URL and its own record."""
    opts = FakeOptions(parse_faults(faults), itl_s=itl_s, ttft_s=ttft_s)
    server = await start_fake_server(opts)
    try:
        yield server.url, server.stats
    finally:
        server.close()
        await server.wait_closed()


def start_fake_server_process(procs: Any, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """The fake server as a child process (started through the suite's ``procs`` fixture, which
    ends it by PID); ``args`` are its command-line options; returns the process and its URL."""
    proc = procs.start(
        [sys.executable, "-m", "cleanslate.testing.fake_openai", "--port", "0", *args],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("READY "), line
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"
