"""The executor protocol: how the rest of the package runs commands on a host.

Contract (checked on every executor by :mod:`cleanslate.testing.executor_contract`):

- ``run`` executes an argv (never through a shell unless the argv says so) with ``env`` added to
  the host's environment, feeds ``stdin`` (none: the command reads end-of-file), and returns
  stdout and stderr apart, as bytes. It waits for the command to exit and for its output to
  close, within ``timeout`` seconds plus a small grace. At the deadline the command *and
  everything it started* are killed (SIGKILL to its process group: locally its own session;
  remotely a remote-side ``timeout``), a child still holding the output included, and the
  result has ``timed_out=True`` and ``returncode=None``. A command killed by signal N has
  ``returncode=-N``.
- ``run`` never raises (except ``CancelledError``): a malformed argv or environment
  (:func:`bad_command`), a program that does not exist, or a host that cannot be reached give a
  result that is not ``ok``, with ``error`` saying why (``returncode`` is ``None``, except for a
  missing program on a remote host: 127, as its shell would say).
- ``python`` names the interpreter used to run the stdlib-only probe scripts on that host.
- ``name`` is what reports call the host (``local`` or ``user@host:port``); ``is_local`` is
  true only for this machine.
- ``write_file`` / ``read_file`` move small files (scripts, specs, log tails) to and from the
  host: ``write_file`` creates missing parent directories and replaces the file whole with
  ``mode``; ``read_file`` returns at most ``max_bytes`` bytes, the last ones with ``tail=True``.
  A missing file is ``FileNotFoundError``; any other failure (a directory, an unreachable host)
  another ``OSError``. With ``under=ROOT`` (a file a record names: a run's log or state), the
  file must lie under ``ROOT`` (resolved with ``realpath``), no component below ``ROOT`` may be
  a symbolic link (each is opened with ``O_NOFOLLOW`` from the one above), and it must be a
  regular file with one link owned by the reading user or root; anything else is a
  ``PermissionError`` saying why (:func:`cleanslate.hosts.files.open_under`).
- ``close`` releases what the executor holds (connections); it may be called more than once,
  and a later command opens what it needs again.
- ``forward_port(port)`` is an async context manager giving the base URL at which *this*
  machine reaches ``127.0.0.1:port`` on the host: the port itself locally
  (``http://127.0.0.1:N``); remotely an SSH forward over the executor's connection to a Unix
  socket in a folder only this user can enter (0700), named by a base URL of its own
  (``http://fwd-<random>.cleanslate.invalid``, :mod:`cleanslate.hosts.forward`). No other local
  user can reach a remote run through it (a forward on a loopback TCP port let them inject
  requests into a trial). Every HTTP request cleanslate makes to a server it launched
  (readiness, smoke test, a study's benchmark and its liveness probe) goes through it and makes
  its connection with :func:`cleanslate.hosts.forward.connector_for` (or
  :func:`~cleanslate.hosts.forward.open_connection`), so a remote run is never polled on the
  client's own loopback, where another server may listen.
- Long-lived processes are started with ``run`` on a script that daemonizes itself (the run
  supervisor, :mod:`cleanslate.launch._supervise_script`), so no executor needs a "start in the
  background" primitive of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


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


def bad_command(argv: Any, env: Any = None) -> str | None:
    """Why ``argv`` / ``env`` cannot be run, or ``None`` when they can.

    ``argv``: a non-empty list or tuple of strings without NUL characters (a bare string is
    refused: it is not an argv). ``env``: a mapping of names (non-empty, without ``=`` or NUL) to
    values (strings without NUL), or ``None``.
    """
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence):
        return f"bad command: argv must be a list of strings, not {type(argv).__name__}"
    if not argv:
        return "bad command: argv is empty"
    for word in argv:
        if not isinstance(word, str):
            return f"bad command: argv holds a {type(word).__name__}, not a string: {word!r}"
        if "\0" in word:
            return f"bad command: argv word {word[:40]!r} contains a NUL character"
    if env is None:
        return None
    if not isinstance(env, Mapping):
        return f"bad command: env must be a mapping, not {type(env).__name__}"
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            return f"bad command: {name!r} is not an environment variable name"
        if not isinstance(value, str) or "\0" in value:
            return f"bad command: the value of {name} is not a string without NUL characters"
    return None


def refused(argv: Any, error: str) -> CommandResult:
    """The result of a command that was not run because of ``error`` (see :func:`bad_command`)."""
    words = tuple(str(w) for w in argv) if isinstance(argv, list | tuple) else (repr(argv),)
    return CommandResult(words, None, b"", b"", 0.0, error=error)


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

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20, tail: bool = False,
                        under: str | None = None) -> bytes: ...

    def forward_port(self, port: int) -> AbstractAsyncContextManager[str]: ...

    async def close(self) -> None: ...
