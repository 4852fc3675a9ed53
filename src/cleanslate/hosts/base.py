"""The executor protocol: how the rest of the package runs commands on a host.

Contract:
- ``run`` executes an argv (never through a shell unless the argv says so), feeds ``stdin``, and
  returns within ``timeout`` seconds plus a small grace. On timeout the command *and everything
  it started* are ended (locally: its own process group; remotely: a remote-side ``timeout``),
  and the result has ``timed_out=True`` and ``returncode=None``. It never raises: a command that
  fails, times out, or cannot run because the host is unreachable gives a result (the last with
  ``returncode=None`` and ``error`` saying why).
- ``python`` names the interpreter used to run the stdlib-only probe scripts on that host.
- ``name`` is what reports call the host (``local`` or ``user@host:port``).
- ``write_file`` / ``read_file`` move small files (scripts, specs, log tails) to and from the
  host; ``read_file`` with ``tail=True`` returns the last ``max_bytes`` bytes. A missing file is
  ``FileNotFoundError``.
- Long-lived processes are started with ``run`` on a script that daemonizes itself (the run
  supervisor, :mod:`cleanslate.launch._supervise`), so no executor needs a "start in the
  background" primitive of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class CommandResult:
    """What one command did. ``returncode`` is ``None`` when it timed out or could not start."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: bytes
    stderr: bytes
    elapsed_s: float
    timed_out: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe_failure(self) -> str:
        """One line saying why the command did not succeed, for findings and errors."""
        cmd = " ".join(self.argv[:3]) + (" ..." if len(self.argv) > 3 else "")
        if self.timed_out:
            return f"`{cmd}` timed out after {self.elapsed_s:.1f} s"
        if self.error:
            return f"`{cmd}` could not run: {self.error}"
        text = (self.stderr or self.stdout).decode(errors="replace").strip()
        tail = text.splitlines()[-1] if text else "no output"
        return f"`{cmd}` exited {self.returncode}: {tail}"


@runtime_checkable
class Executor(Protocol):
    """Runs commands on one host. See the module docstring for the contract."""

    name: str
    python: str
    is_local: bool

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult: ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20, tail: bool = False
                        ) -> bytes: ...

    async def close(self) -> None: ...
