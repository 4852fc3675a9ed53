"""Run commands on this machine with asyncio subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from cleanslate.hosts.base import CommandResult, bad_command, refused
from cleanslate.hosts.files import read_under


class LocalExecutor:
    """The :class:`~cleanslate.hosts.base.Executor` of this machine.

    Each command runs in a new session, so a timeout can end the command and everything it
    started (its own process group) without touching anything else.
    """

    name = "local"
    is_local = True

    def __init__(self, python: str | None = None) -> None:
        self.python = python or sys.executable

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        problem = bad_command(argv, env)
        if problem is not None:
            return refused(argv, problem)
        start = time.monotonic()
        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=full_env,
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:
            return CommandResult(
                tuple(argv), None, b"", b"", time.monotonic() - start, error=str(exc)
            )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except TimeoutError:
            # The command runs in its own session: its process group is exactly what it started.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 2.0)
            return CommandResult(
                tuple(argv), None, b"", b"", time.monotonic() - start, timed_out=True
            )
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        return CommandResult(tuple(argv), proc.returncode, out, err, time.monotonic() - start)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # A temporary file of this writer only, readable by no one else until it has ``mode``.
        tmp = target.with_name(f"{target.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with open(fd, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), mode)
            tmp.replace(target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20, tail: bool = False,
                        under: str | None = None) -> bytes:
        if under is not None:
            return read_under(under, path, max_bytes=max_bytes, tail=tail)
        with open(path, "rb") as fh:
            if tail:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - max_bytes))
            return fh.read(max_bytes)

    @contextlib.asynccontextmanager
    async def forward_port(self, port: int) -> AsyncIterator[str]:
        """This machine reaches its own port directly."""
        yield f"http://127.0.0.1:{int(port)}"

    async def close(self) -> None:
        return None
