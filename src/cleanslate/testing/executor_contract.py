"""The executor contract as tests, for any :class:`~cleanslate.hosts.base.Executor`.

Shipped with the package (as ``optuna.testing`` ships its storage tests) so that every executor,
ours or a user's, is held to the same written contract (:mod:`cleanslate.hosts.base`). In a test
module, define a fixture ``executor`` that returns the executor under test (a fresh one per
test), and, for an executor of remote hosts, ``unreachable_executor`` (one whose host cannot be
reached); then ``from cleanslate.testing.executor_contract import *``. ``tests/hosts/
test_executor_contract.py`` runs it on ``LocalExecutor`` and on ``SSHExecutor`` against a real
OpenSSH server.

Every check goes through the executor itself (temporary files from ``mktemp -d``, process states
from ``ps``), so the suite runs unchanged against a host that is not this machine; the host
needs ``sh``, ``cat``, ``ps``, ``sleep``, ``stat``, ``mktemp`` and ``rm``. Needs ``pytest``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest

from cleanslate.hosts.base import CommandResult, Executor

__all__ = [
    "test_a_command_still_holding_the_output_is_ended_at_the_timeout",
    "test_bad_commands_are_results_not_exceptions",
    "test_close_is_idempotent_and_the_executor_still_works",
    "test_commands_run_concurrently",
    "test_env_is_passed_verbatim_on_top_of_the_hosts",
    "test_exit_status_and_output_streams",
    "test_forward_port_reaches_the_hosts_loopback",
    "test_identity",
    "test_missing_program_is_a_result",
    "test_read_file_head_tail_and_missing",
    "test_stdin_and_stdout_round_trip_bytes",
    "test_timeout_ends_the_command_and_everything_it_started",
    "test_unreachable_host_is_a_result_and_file_errors_are_oserrors",
    "test_write_file_modes_and_parents",
]

#: Seconds an executor may take beyond a command's timeout to return, and then for what the
#: command started to be gone.
SLACK_S = 6.0

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _sh(
    ex: Executor,
    script: str,
    *args: str,
    timeout: float = 30.0,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    return await ex.run(["sh", "-c", script, "sh", *args], timeout=timeout, stdin=stdin, env=env)


async def _ok(ex: Executor, script: str, *args: str) -> bytes:
    result = await _sh(ex, script, *args)
    assert result.ok, result.describe_failure()
    return result.stdout


@asynccontextmanager
async def _scratch(ex: Executor) -> AsyncIterator[str]:
    """A fresh directory on the host, removed afterwards."""
    path = (await _ok(ex, "mktemp -d")).decode().strip()
    assert path.startswith("/"), path
    try:
        yield path
    finally:
        await _sh(ex, 'rm -rf -- "$1"', path)


async def _alive(ex: Executor, pid: int) -> bool:
    """Whether process ``pid`` exists on the host and is not a zombie."""
    state = (await _sh(ex, 'ps -o stat= -p "$1" || true', str(pid))).stdout.strip()
    return bool(state) and not state.startswith(b"Z")


async def _gone_within(ex: Executor, pids: list[int], seconds: float) -> list[int]:
    """The PIDs still alive after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while True:
        alive = [pid for pid in alive if await _alive(ex, pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        await asyncio.sleep(0.2)


async def _pids(ex: Executor, directory: str, *names: str) -> list[int]:
    out = []
    for name in names:
        out.append(int((await _ok(ex, 'cat -- "$1"', f"{directory}/{name}")).strip()))
    return out


# --- identity ---------------------------------------------------------------------------------


def test_identity(executor: Executor) -> None:
    """``name`` names the host, ``is_local`` says whether it is this machine, ``python`` runs."""
    assert isinstance(executor, Executor)
    assert isinstance(executor.name, str) and executor.name
    assert isinstance(executor.is_local, bool)
    assert executor.is_local == (executor.name == "local")
    result = _run(executor.run([executor.python, "-c", "import sys; print(sys.version_info[0])"],
                               timeout=30))
    assert result.ok and result.stdout == b"3\n", result.describe_failure()


# --- run ----------------------------------------------------------------------------------------


def test_exit_status_and_output_streams(executor: Executor) -> None:
    """The exit status, stdout and stderr come back apart; a signal death is ``-SIGNUM``."""

    async def go() -> None:
        r = await _sh(executor, "printf out; printf err >&2; exit 3")
        assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.error) == (
            3, b"out", b"err", False, None)
        assert not r.ok and "exited 3" in r.describe_failure()
        assert (await executor.run(["true"], timeout=30)).ok
        killed = await _sh(executor, "kill -9 $$")
        assert killed.returncode == -9 and not killed.ok and not killed.timed_out

    _run(go())


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], None),
        ("echo hi", None),
        (["echo", "a\0b"], None),
        (["echo", 1], None),
        (["true"], {"A=B": "1"}),
        (["true"], {"": "1"}),
        (["true"], {"A": "x\0y"}),
    ],
    ids=["empty", "a-string", "nul-byte", "not-a-string", "env-name-with-=", "empty-env-name",
         "env-value-with-nul"],
)
def test_bad_commands_are_results_not_exceptions(
    executor: Executor, argv: Any, env: Mapping[str, str] | None
) -> None:
    """``run`` never raises on its input: a malformed argv or environment is a result with
    ``returncode=None`` and an ``error`` saying what was wrong, and nothing runs."""
    r = _run(executor.run(argv, timeout=10, env=env))
    assert r.returncode is None and not r.ok and not r.timed_out
    assert r.error is not None and "bad command" in r.error, r.error


def test_missing_program_is_a_result(executor: Executor) -> None:
    """A program that does not exist: not ok, and ``error`` names it (``returncode`` is ``None``
    locally; 127 on a remote host, as its shell would say)."""
    r = _run(executor.run(["cleanslate-no-such-program", "x"], timeout=30))
    assert not r.ok and not r.timed_out
    assert r.returncode in (None, 127)
    assert r.error is not None and "cleanslate-no-such-program" in r.error, r
    assert "could not run" in r.describe_failure()


def test_stdin_and_stdout_round_trip_bytes(executor: Executor) -> None:
    """Every byte value, a MiB of it, goes in on stdin and comes back on stdout unchanged;
    without ``stdin`` the command reads end-of-file at once."""
    data = bytes(range(256)) * 4096

    async def go() -> None:
        r = await executor.run(["cat"], timeout=60, stdin=data)
        assert r.ok and r.stdout == data and r.stderr == b""
        empty = await executor.run(["cat"], timeout=10)
        assert empty.ok and empty.stdout == b""

    _run(go())


def test_env_is_passed_verbatim_on_top_of_the_hosts(executor: Executor) -> None:
    """``env`` adds to (or overrides) the host's environment, values byte for byte."""
    env = {
        "CS_A": "x y",
        "CS_B": "it's \"quoted\" $HOME `id` \\n",
        "CS_C": "",
        "CS_D": "line 1\nline 2",
    }

    async def go() -> None:
        r = await _sh(executor, 'printf "%s|" "$CS_A" "$CS_B" "$CS_C" "$CS_D" "${PATH:+path}"',
                      env=env)
        assert r.ok, r.describe_failure()
        assert r.stdout.decode() == "|".join([*env.values(), "path"]) + "|"
        unset = await _sh(executor, 'printf "%s" "${CS_A-unset}"')
        assert unset.stdout == b"unset"

    _run(go())


def test_timeout_ends_the_command_and_everything_it_started(executor: Executor) -> None:
    """At the deadline the command and what it started are ended (a child that ignores SIGTERM
    included): the result says ``timed_out`` with ``returncode=None`` within the bound, and no
    process of the command is left."""
    script = (
        'sleep 300 & echo $! > "$1/bg"; '
        '(trap "" TERM; exec sleep 301) & echo $! > "$1/stubborn"; '
        'echo $$ > "$1/main"; wait'
    )

    async def go() -> None:
        async with _scratch(executor) as tmp:
            started = time.monotonic()
            r = await _sh(executor, script, tmp, timeout=1.5)
            elapsed = time.monotonic() - started
            assert r.timed_out and r.returncode is None and not r.ok, r
            assert 1.4 <= elapsed < 1.5 + SLACK_S, elapsed
            assert "timed out" in r.describe_failure()
            pids = await _pids(executor, tmp, "main", "bg", "stubborn")
            assert await _gone_within(executor, pids, SLACK_S) == []

    _run(go())


def test_a_command_still_holding_the_output_is_ended_at_the_timeout(executor: Executor) -> None:
    """A command that exits while a child it started keeps its output open: ``run`` waits for
    the output up to the deadline, then ends that child too."""
    script = '(exec sleep 302) & echo $! > "$1/child"; echo started'

    async def go() -> None:
        async with _scratch(executor) as tmp:
            started = time.monotonic()
            r = await _sh(executor, script, tmp, timeout=1.5)
            assert time.monotonic() - started < 1.5 + SLACK_S
            assert r.timed_out or r.ok, r
            pids = await _pids(executor, tmp, "child")
            assert await _gone_within(executor, pids, SLACK_S) == []

    _run(go())


def test_commands_run_concurrently(executor: Executor) -> None:
    """Many commands at once each get their own result (and together take about as long as
    one)."""

    async def go() -> None:
        started = time.monotonic()
        results = await asyncio.gather(
            *(_sh(executor, 'sleep 0.5; echo "$1"', str(i)) for i in range(16)))
        assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(16)]
        assert time.monotonic() - started < 0.5 * 16

    _run(go())


def test_close_is_idempotent_and_the_executor_still_works(executor: Executor) -> None:
    """``close`` releases what the executor holds; closing twice is fine, and a later command
    works (a connection is reopened)."""

    async def go() -> None:
        assert (await executor.run(["true"], timeout=30)).ok
        await executor.close()
        await executor.close()
        assert (await executor.run(["true"], timeout=30)).ok
        await executor.close()

    _run(go())


_ONE_REQUEST_SERVER = """
import http.server, os, sys
token, path = sys.argv[1].encode(), sys.argv[2]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(token)))
        self.end_headers()
        self.wfile.write(token)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
with open(path + ".tmp", "w") as fh:
    fh.write(str(server.server_address[1]))
os.rename(path + ".tmp", path)
server.timeout = 20
server.handle_request()
"""


def _tcp_listeners() -> set[tuple[str, str]]:
    """(local address, inode) of this machine's listening TCP sockets (``/proc/net/tcp*``)."""
    found: set[tuple[str, str]] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A":  # LISTEN
                found.add((fields[1], fields[9]))
    return found


def test_forward_port_reaches_the_hosts_loopback(executor: Executor) -> None:
    """``forward_port(port)`` gives a base URL at which this machine reaches ``127.0.0.1:port``
    of the host, through :func:`cleanslate.hosts.forward.connector_for`: a one-request server
    there answers a token only it knows. A remote executor's forward opens no TCP listener on
    this machine (one on the loopback is open to every local user): it is a Unix socket in a
    folder only this user can enter."""
    import os
    import secrets
    import stat

    import aiohttp

    from cleanslate.hosts.forward import connector_for, unix_socket_for

    async def go() -> None:
        token = secrets.token_hex(8)
        async with _scratch(executor) as tmp:
            path = f"{tmp}/port"
            serving = asyncio.ensure_future(executor.run(
                [executor.python, "-c", _ONE_REQUEST_SERVER, token, path], timeout=30))
            port = None
            for _ in range(200):
                try:
                    port = int((await executor.read_file(path)).decode())
                    break
                except (FileNotFoundError, ValueError):
                    await asyncio.sleep(0.05)
            assert port is not None, "the host's server did not start"
            before = _tcp_listeners()
            sock: str | None = None
            async with executor.forward_port(port) as url, \
                    aiohttp.ClientSession(connector=connector_for(url)) as http:
                if executor.is_local:
                    assert url == f"http://127.0.0.1:{port}"
                else:
                    assert _tcp_listeners() <= before, "the forward listens on a TCP port"
                    sock = unix_socket_for(url)
                    assert sock is not None, url
                    folder = os.stat(os.path.dirname(sock))
                    assert folder.st_uid == os.geteuid() and folder.st_mode & 0o777 == 0o700
                    assert stat.S_ISSOCK(os.stat(sock).st_mode)
                async with http.get(url + "/") as response:
                    assert await response.read() == token.encode()
            if sock is not None:
                assert unix_socket_for(url) is None and not os.path.exists(sock), \
                    "the forward's socket outlives its context"
            assert (await serving).ok

    _run(go())


# --- files --------------------------------------------------------------------------------------


def test_write_file_modes_and_parents(executor: Executor) -> None:
    """``write_file`` creates missing parent directories, writes bytes exactly, sets ``mode``
    (default 0644) and replaces an existing file."""
    data = bytes(range(256)) * 16

    async def go() -> None:
        async with _scratch(executor) as tmp:
            path = f"{tmp}/a/b/file.bin"
            for mode in (0o600, 0o755, None):
                if mode is None:
                    await executor.write_file(path, data)
                else:
                    await executor.write_file(path, data, mode=mode)
                shown = (await _ok(executor, 'stat -c %a -- "$1"', path)).decode().strip()
                assert shown == f"{mode or 0o644:o}"
                assert await executor.read_file(path) == data
            await executor.write_file(path, b"new")
            assert await executor.read_file(path) == b"new"
            listing = (await _ok(executor, 'ls -A -- "$1"', f"{tmp}/a/b")).split()
            assert listing == [b"file.bin"]  # no temporary file left beside it

    _run(go())


def test_read_file_head_tail_and_missing(executor: Executor) -> None:
    """``read_file`` returns at most ``max_bytes`` bytes, the last ones with ``tail=True``; a
    missing file is ``FileNotFoundError``, a directory another ``OSError``."""

    async def go() -> None:
        async with _scratch(executor) as tmp:
            path = f"{tmp}/log"
            await executor.write_file(path, b"0123456789")
            assert await executor.read_file(path) == b"0123456789"
            assert await executor.read_file(path, max_bytes=4) == b"0123"
            assert await executor.read_file(path, max_bytes=4, tail=True) == b"6789"
            assert await executor.read_file(path, max_bytes=100, tail=True) == b"0123456789"
            await executor.write_file(f"{tmp}/empty", b"")
            assert await executor.read_file(f"{tmp}/empty", tail=True) == b""
            with pytest.raises(FileNotFoundError):
                await executor.read_file(f"{tmp}/missing")
            with pytest.raises(FileNotFoundError):
                await executor.read_file(f"{tmp}/missing", tail=True)
            with pytest.raises(OSError) as info:
                await executor.read_file(tmp)
            assert not isinstance(info.value, FileNotFoundError)

    _run(go())


# --- an unreachable host ------------------------------------------------------------------------


def test_unreachable_host_is_a_result_and_file_errors_are_oserrors(
    unreachable_executor: Executor,
) -> None:
    """A host that cannot be reached: ``run`` returns (``returncode=None``, ``error`` says
    why) within its connect timeout, and the file methods raise ``OSError`` that is not
    ``FileNotFoundError`` (nothing is known about the file)."""
    ex = unreachable_executor

    async def go() -> None:
        started = time.monotonic()
        r = await ex.run(["true"], timeout=30)
        assert time.monotonic() - started < SLACK_S
        assert r.returncode is None and not r.ok and r.error
        with pytest.raises(OSError) as info:
            await ex.read_file("/etc/hostname")
        assert not isinstance(info.value, FileNotFoundError)
        with pytest.raises(OSError):
            await ex.write_file("/tmp/cleanslate-never-written", b"x")
        await ex.close()

    _run(go())
