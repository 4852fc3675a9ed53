"""Run commands on a remote host over SSH (asyncssh), behind the same protocol as the local one.

``--host`` forms (see ``docs/remote.md``):

- ``ssh://[user@]host[:port][?accept-new=1&connect-timeout=S]``: a URL; ``host`` is still looked
  up in ``~/.ssh/config`` as OpenSSH would (``Host`` patterns match it);
- ``NAME`` or ``user@NAME``: a name resolved through ``~/.ssh/config`` (``HostName``, ``User``,
  ``Port``, ``IdentityFile``, ``ProxyJump``, ``UserKnownHostsFile`` ...), as ``ssh NAME`` does.

Contract, in addition to :mod:`cleanslate.hosts.base`:

- host keys are checked strictly against ``known_hosts`` (``UserKnownHostsFile`` of the config,
  else ``~/.ssh/known_hosts``). An unknown key is refused with a message that says how to trust
  it; it is recorded on first use only when the user opted in (``CLEANSLATE_SSH_ACCEPT_NEW=1``,
  ``?accept-new=1``, or ``accept_new=True``, which ``--accept-new-host-key`` passes). A
  *changed* key is always refused.
- one connection per resolved target (user, host, port) and event loop, opened on first use and
  shared by every command of that loop; a lost connection is reopened by the next command.
- connecting has a deadline (``connect_timeout``, default :data:`DEFAULT_CONNECT_TIMEOUT_S`).
  When the host cannot be reached, ``run`` does not raise: it returns a result with
  ``returncode=None`` and ``error`` saying why (``host unreachable: ...``, or ``host refused:
  ...`` for a host key), so a probe turns it into an UNKNOWN source like any command that could
  not run.
- every command runs on the host as ``timeout -s KILL SECS sh -c RELAY sh env -- [K=V ...] ARGV``
  (:meth:`SSHExecutor.command_line`; GNU coreutils ``timeout`` and ``env``, ``cat``): the host
  itself kills the command's process group at the deadline even when the connection is gone,
  as the local executor does. :data:`RELAY` passes the command's stdout and stderr through a
  ``cat`` each, so the command counts as running until its output is closed: a child that
  keeps it open after the command exits is killed at the deadline too, instead of holding the
  session (and surviving) as it would with ``timeout ARGV`` alone. Locally the wait is bounded
  by ``SECS`` plus :data:`LOCAL_GRACE_S`. A command killed at the deadline has
  ``timed_out=True``; one killed by signal N (status 128+N, as the shell reports it) has
  ``returncode=-N``; a program ``env`` cannot run has its message as ``error``.
- ``env`` is passed as ``K=V`` words of ``env`` on the remote command line (sshd's ``AcceptEnv``
  usually refuses environment requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import socket
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncssh

from cleanslate.errors import CleanslateError, InputError
from cleanslate.hosts.base import CommandResult, bad_command, refused

#: Seconds to open a connection (TCP, handshake, authentication) before the host is unreachable.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Seconds the local side waits beyond a command's timeout (the remote kill and the round trip).
LOCAL_GRACE_S = 5.0
#: The ``sh -c`` script every remote command runs under (its arguments: the command's argv).
#: The command's stdout and stderr go through a ``cat`` each and its exit status through fd 4,
#: so the script ends only once the command has exited and every copy of its output is closed.
#: The command runs in a subshell that ``exec``s it, so the shell that waits for it (and would
#: print "Killed") keeps its own stderr on /dev/null; the command gets none of the other fds.
RELAY = (
    "exec 3>&1 5>&2; "
    'rc=$( { { { (exec "$@" 2>&1 1>&6 3>&- 4>&- 5>&- 6>&-); echo "$?" >&4; } 2>/dev/null '
    "| cat >&5 6>&-; } 6>&1 | cat >&3; } 4>&1 ); "
    'exit "$rc"'
)
#: Sessions open at once on one connection (sshd's ``MaxSessions`` defaults to 10).
MAX_SESSIONS = 8

ACCEPT_NEW_ENV = "CLEANSLATE_SSH_ACCEPT_NEW"
CONNECT_TIMEOUT_ENV = "CLEANSLATE_SSH_CONNECT_TIMEOUT"
#: An OpenSSH client config to read instead of ``~/.ssh/config``.
CONFIG_ENV = "CLEANSLATE_SSH_CONFIG"

_TRUE = {"1", "true", "yes", "on"}


def _accept_new_from_env() -> bool:
    return os.environ.get(ACCEPT_NEW_ENV, "").strip().lower() in _TRUE


@dataclass(frozen=True)
class SSHTarget:
    """A ``--host`` value taken apart. ``host`` is what ``~/.ssh/config`` is matched against;
    ``user`` and ``port`` are ``None`` when the config (or the defaults) decide them."""

    spec: str
    host: str
    user: str | None = None
    port: int | None = None
    accept_new: bool | None = None
    connect_timeout: float | None = None

    @property
    def display(self) -> str:
        """The name reports use: the ``--host`` value without its query string."""
        return self.spec.split("?", 1)[0]


def parse_target(spec: str) -> SSHTarget:
    """Parse ``ssh://[user@]host[:port][?accept-new=1&connect-timeout=S]`` or ``[user@]NAME``.

    Raises :class:`~cleanslate.errors.InputError` for anything else.
    """
    where = "--host"
    if "://" in spec:
        parts = urlsplit(spec)
        if parts.scheme != "ssh":
            raise InputError(f"unsupported host URL scheme {parts.scheme!r} in {spec!r}",
                             where=where, hint="use ssh://user@host:port or a ~/.ssh/config name")
        try:
            port = parts.port
        except ValueError:
            raise InputError(f"bad port in {spec!r}", where=where) from None
        if not parts.hostname:
            raise InputError(f"no host name in {spec!r}", where=where,
                             hint="use ssh://user@host:port")
        if parts.path not in ("", "/"):
            raise InputError(f"unexpected path {parts.path!r} in {spec!r}", where=where)
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = set(query) - {"accept-new", "connect-timeout"}
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(sorted(unknown))} in {spec!r}",
                             where=where, hint="known: accept-new=1, connect-timeout=SECONDS")
        accept_new: bool | None = None
        if "accept-new" in query:
            accept_new = (query["accept-new"][-1].strip().lower() or "1") in _TRUE
        timeout: float | None = None
        if "connect-timeout" in query:
            try:
                timeout = float(query["connect-timeout"][-1])
            except ValueError:
                raise InputError(f"connect-timeout must be seconds in {spec!r}",
                                 where=where) from None
            if timeout <= 0:
                raise InputError(f"connect-timeout must be positive in {spec!r}", where=where)
        return SSHTarget(spec=spec, host=parts.hostname, user=parts.username, port=port,
                         accept_new=accept_new, connect_timeout=timeout)
    user, at, name = spec.rpartition("@")
    if not name or any(c.isspace() for c in spec) or "/" in name or (at and not user):
        raise InputError(f"cannot read host {spec!r}", where=where,
                         hint="use ssh://user@host:port or a Host name from ~/.ssh/config")
    return SSHTarget(spec=spec, host=name, user=user or None)


def _config_paths() -> list[str]:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return [explicit]
    default = Path("~", ".ssh", "config").expanduser()
    return [str(default)] if os.access(default, os.R_OK) else []


@dataclass(frozen=True)
class _Resolved:
    """A target after ``~/.ssh/config``: where asyncssh will connect, and the known_hosts files."""

    host: str
    port: int
    user: str
    known_hosts: tuple[str, ...]
    connect_timeout: float | None = None
    #: The options these were read from: the base of the connection's options, so that the
    #: config files are parsed once per host, not twice (with many hosts, parsing every
    #: host's config twice was a tenth of the checker's CPU time).
    options: asyncssh.SSHClientConnectionOptions | None = field(default=None, compare=False,
                                                                  repr=False)


def _resolve(target: SSHTarget, config: list[str]) -> _Resolved:
    """Apply the SSH config as ``asyncssh.connect`` will (``Host`` matching, ``HostName``,
    ``Port``, ``User``, ``UserKnownHostsFile``, ``ConnectTimeout``). Raises ``OSError`` or
    ``ValueError`` for an unreadable config or key file."""
    options = asyncssh.SSHClientConnectionOptions(
        config=config, host=target.host,
        port=target.port if target.port is not None else (),
        username=target.user if target.user is not None else (),
    )
    files = options.known_hosts
    if isinstance(files, (list, tuple)) and files and all(isinstance(f, str) for f in files):
        known = tuple(str(Path(f).expanduser()) for f in files)
    else:
        known = (str(Path("~", ".ssh", "known_hosts").expanduser()),)
    timeout = options.connect_timeout
    return _Resolved(host=str(options.host), port=int(options.port),
                     user=str(options.username or getpass.getuser()), known_hosts=known,
                     connect_timeout=float(timeout) if timeout else None, options=options)


def resolve_address(spec: str, *, where: str = "--host") -> tuple[str, int]:
    """Where ``spec`` connects after ``~/.ssh/config`` (``HostName``, ``Port``), checked to
    resolve to an address; an :class:`InputError` naming ``where`` when it does not (a typo in
    a host name, a config name that is not there). Connects to nothing."""
    target = parse_target(spec)
    try:
        resolved = _resolve(target, _config_paths())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the SSH config for {target.display}: {exc}",
                         where=where) from None
    try:
        socket.getaddrinfo(resolved.host, resolved.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise InputError(f"host {target.display} does not resolve ({resolved.host}: {reason})",
                         where=where, hint="use a Host of ~/.ssh/config, an ssh:// URL whose "
                         "name resolves, or local") from None
    return resolved.host, resolved.port


class HostKeyError(CleanslateError, OSError):
    """The host's key is not trusted (unknown, or changed since it was recorded)."""


def _known_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class _Client(asyncssh.SSHClient):
    """Host-key policy: strict, with the opt-in to record a key never seen before."""

    def __init__(self, target: SSHTarget, resolved: _Resolved, accept_new: bool) -> None:
        self._target = target
        self._resolved = resolved
        self._accept_new = accept_new
        self.refusal: str | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        fingerprint = f"{key.get_algorithm()} {key.get_fingerprint()}"
        files = self._resolved.known_hosts
        known_here = _known_keys(files, host, addr, port)
        where = " or ".join(files) or "known_hosts"
        if known_here:
            self.refusal = (
                f"the host key of {_known_name(host, port)} has CHANGED: it is now "
                f"{fingerprint}, but {where} holds another key for it. This may be an attack or "
                f"a reinstalled host; after verifying, remove the old entry with "
                f"`ssh-keygen -R '{_known_name(host, port)}'"
                + (f" -f {files[0]}" if files else "") + "` and connect again"
            )
            return False
        if not self._accept_new:
            port_opt = "" if port == 22 else f"-p {port} "
            kh_file = files[0] if files else "~/.ssh/known_hosts"
            self.refusal = (
                f"the host key of {_known_name(host, port)} ({fingerprint}) is not in {where}: "
                f"refused (strict host key checking). After checking the fingerprint, trust it "
                f"with `ssh-keyscan {port_opt}{host} >> {kh_file}`,"
                f" or let cleanslate record it on first use: set {ACCEPT_NEW_ENV}=1, or add "
                f"?accept-new=1 to an ssh:// host URL (check --accept-new-host-key where "
                "available)"
            )
            return False
        if files:
            _record_key(files[0], _known_name(host, port), key)
        return True


def _known_keys(files: Sequence[str], host: str, addr: str, port: int) -> list[asyncssh.SSHKey]:
    found: list[asyncssh.SSHKey] = []
    for path in files:
        if not os.path.isfile(path):
            continue
        try:
            known = asyncssh.read_known_hosts(path)
        except (OSError, ValueError):
            continue
        trusted = known.match(host, addr, port if port != 22 else None)
        found.extend(trusted[0])
    return found


def _known_hosts_arg(files: Sequence[str]) -> list[str] | asyncssh.SSHKnownHosts:
    """The known_hosts files that exist, or an empty list of trusted keys (strict: nothing is
    trusted) when none does."""
    present = [path for path in files if os.path.isfile(path)]
    return present if present else asyncssh.import_known_hosts("")


def _record_key(path: str, name: str, key: asyncssh.SSHKey) -> None:
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = f"{name} {key.export_public_key('openssh').decode().strip()}\n"
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(line)


@dataclass
class _Link:
    """The connection to one target on one event loop."""

    connecting: asyncio.Task[asyncssh.SSHClientConnection] | None = None
    sessions: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_SESSIONS))


# Connections belong to the event loop that opened them: one table per live loop, so a second
# ``asyncio.run`` in the same process opens its own connections instead of reusing dead ones.
_LINKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str, int, bool],
                                                                  _Link]] = (
    weakref.WeakKeyDictionary())


class SSHExecutor:
    """The :class:`~cleanslate.hosts.base.Executor` of a host reached over SSH.

    See the module docstring for the contract. ``python`` is ``python3`` on the host's ``PATH``.
    """

    is_local = False

    def __init__(self, target: SSHTarget | str, *, connect_timeout: float | None = None,
                 accept_new: bool | None = None, python: str = "python3") -> None:
        self.target = parse_target(target) if isinstance(target, str) else target
        self.name = self.target.display
        self.python = python
        env_timeout = os.environ.get(CONNECT_TIMEOUT_ENV)
        # Seconds to connect: the argument, the URL, the environment, then ``ConnectTimeout``
        # of the SSH config (read when the target is resolved), then the default.
        self._explicit_timeout = (
            connect_timeout or self.target.connect_timeout
            or (float(env_timeout) if env_timeout else None)
        )
        self.connect_timeout = self._explicit_timeout or DEFAULT_CONNECT_TIMEOUT_S
        self._accept_new = accept_new if accept_new is not None else self.target.accept_new
        self._resolved: _Resolved | None = None

    def __repr__(self) -> str:
        return f"SSHExecutor({self.name!r})"

    @property
    def accept_new(self) -> bool:
        return self._accept_new if self._accept_new is not None else _accept_new_from_env()

    # -- connection ------------------------------------------------------------------------

    def _link_key(self, resolved: _Resolved) -> tuple[str, str, int, bool]:
        return (resolved.user, resolved.host, resolved.port, self.accept_new)

    async def _connection(self) -> tuple[asyncssh.SSHClientConnection, _Link]:
        """The shared connection of this loop, opened on first use. Raises ``OSError``."""
        loop = asyncio.get_running_loop()
        config = _config_paths()
        if self._resolved is None:
            try:
                self._resolved = _resolve(self.target, config)
            except (OSError, ValueError) as exc:
                where = f" (config {', '.join(config)})" if config else ""
                raise OSError(f"cannot use the SSH settings of {self.target.host}{where}: "
                              f"{exc}") from exc
            if self._explicit_timeout is None and self._resolved.connect_timeout:
                self.connect_timeout = self._resolved.connect_timeout
        resolved = self._resolved
        links = _LINKS.setdefault(loop, {})
        key = self._link_key(resolved)
        link = links.get(key)
        if link is None:
            link = links[key] = _Link()
        task = link.connecting
        if task is not None and task.done() and (
            task.cancelled() or task.exception() is not None or _closed(task.result())
        ):
            task = None
        if task is None:
            task = link.connecting = loop.create_task(self._open(config, resolved))
        try:
            conn = await asyncio.shield(task)
        except BaseException:
            if task.done() and link.connecting is task:
                link.connecting = None
            raise
        return conn, link

    async def _open(self, config: list[str], resolved: _Resolved) -> asyncssh.SSHClientConnection:
        client = _Client(self.target, resolved, self.accept_new)
        what = f"{resolved.user}@{resolved.host}:{resolved.port}"
        try:
            return await asyncio.wait_for(
                asyncssh.connect(
                    self.target.host,
                    port=self.target.port if self.target.port is not None else (),
                    username=self.target.user if self.target.user is not None else (),
                    # The config as _resolve read it for this host (no second parse).
                    options=resolved.options,
                    config=config if resolved.options is None else (),
                    known_hosts=_known_hosts_arg(resolved.known_hosts),
                    client_factory=lambda: client,
                    connect_timeout=self.connect_timeout,
                    keepalive_interval=15,
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            raise OSError(f"cannot connect to {what}: no answer within "
                          f"{self.connect_timeout:g} s (connect timeout)") from None
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyError(client.refusal or f"host key of {what} not trusted: {exc}"
                               ) from None
        except asyncssh.PermissionDenied as exc:
            raise OSError(f"cannot log in to {what}: {exc.reason} (check User and "
                          "IdentityFile in ~/.ssh/config, or ssh-agent)") from None
        except asyncssh.Error as exc:
            raise OSError(f"cannot connect to {what}: {exc.reason}") from None
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
            raise OSError(f"cannot connect to {what}: {reason}") from None
        except ValueError as exc:  # bad keys or config values, raised by asyncssh's options
            raise OSError(f"cannot connect to {what}: {exc}") from None
        except Exception as exc:  # whatever it was, the host is not reachable: UNKNOWN, not CLEAN
            raise OSError(f"cannot connect to {what}: {type(exc).__name__}: {exc}") from None

    async def connect(self) -> None:
        """Open the connection now (``OSError`` when the host cannot be reached)."""
        await self._connection()

    # -- commands --------------------------------------------------------------------------

    def command_line(self, argv: Sequence[str], timeout: float,
                     env: Mapping[str, str] | None = None) -> str:
        """The shell command line sent to the host for ``argv`` (see the module docstring)."""
        words = ["timeout", "-s", "KILL", f"{max(timeout, 0.1):.3f}", "sh", "-c", RELAY, "sh",
                 "env", "--", *(f"{k}={v}" for k, v in (env or {}).items())]
        return shlex.join([*words, *argv])

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
        args = tuple(argv)

        def failed(error: str) -> CommandResult:
            return CommandResult(args, None, b"", b"", time.monotonic() - start, error=error)

        try:
            conn, link = await self._connection()
        except HostKeyError as exc:
            return failed(f"host refused: {exc}")
        except OSError as exc:
            return failed(f"host unreachable: {exc}")
        command = self.command_line(argv, timeout, env)
        # The remote timeout starts when the host runs the command; waiting for a free session
        # counts against the local deadline only.
        local_deadline = timeout + LOCAL_GRACE_S
        try:
            async with asyncio.timeout(local_deadline):
                async with link.sessions:
                    done = await conn.run(command, input=stdin or None, encoding=None,
                                          check=False,
                                          stdin=asyncssh.PIPE if stdin else asyncssh.DEVNULL)
        except TimeoutError:
            # The connection did not answer in time: it may be dead; the next command reopens it.
            if link.connecting is not None and link.connecting.done():
                with contextlib.suppress(Exception):
                    link.connecting.result().abort()
                link.connecting = None
            return CommandResult(args, None, b"", b"", time.monotonic() - start, timed_out=True,
                                 error=f"no answer from {self.name} within {local_deadline:g} s")
        except (asyncssh.Error, OSError) as exc:
            if link.connecting is not None and link.connecting.done():
                link.connecting = None
            reason = exc.reason if isinstance(exc, asyncssh.Error) else str(exc)
            return failed(f"connection to {self.name} failed: {reason}")
        elapsed = time.monotonic() - start
        stdout = _as_bytes(done.stdout)
        stderr = _as_bytes(done.stderr)
        code = done.exit_status
        if done.exit_signal is not None:
            code = -_signal_number(done.exit_signal[0])
        elif code is not None and 128 < code <= 128 + 64:
            code = 128 - code  # the shell's 128+N for a command killed by signal N
        # ``timeout -s KILL`` kills its own process group, itself included. A command killed by
        # SIGKILL before the deadline is not a timeout.
        if code == -9 and elapsed >= timeout - 0.05:
            return CommandResult(args, None, stdout, stderr, elapsed, timed_out=True)
        if code in (126, 127) and stderr.startswith(b"env: "):
            message = stderr.decode(errors="replace").strip().splitlines()[-1]
            return CommandResult(args, code, stdout, stderr, elapsed, error=message)
        return CommandResult(args, code, stdout, stderr, elapsed)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        # The temporary file is readable by no one else until it has ``mode``.
        script = ('set -e; d=$(dirname -- "$1"); mkdir -p -- "$d"; t="$1.tmp.$$"; '
                  'umask 077; cat > "$t"; chmod "$2" "$t"; mv -f -- "$t" "$1"')
        result = await self.run(["sh", "-c", script, "sh", path, f"{mode:o}"],
                                timeout=30.0 + len(data) / 1e6, stdin=data)
        if not result.ok:
            raise OSError(f"cannot write {path} on {self.name}: {result.describe_failure()}")

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20, tail: bool = False,
                        under: str | None = None) -> bytes:
        if under is not None:
            return await self._read_under(under, path, max_bytes=max_bytes, tail=tail)
        reader = "tail" if tail else "head"
        script = f'test -e "$1" || exit 44; exec {reader} -c "$2" -- "$1"'
        result = await self.run(["sh", "-c", script, "sh", path, str(max_bytes)],
                                timeout=30.0 + max_bytes / 1e6)
        if result.returncode == 44:
            raise FileNotFoundError(f"{path} does not exist on {self.name}")
        if not result.ok:
            raise OSError(f"cannot read {path} on {self.name}: {result.describe_failure()}")
        return result.stdout

    async def _read_under(self, root: str, path: str, *, max_bytes: int, tail: bool) -> bytes:
        """``read_file(..., under=root)`` on the host: :mod:`cleanslate.hosts.files` run by
        the host's ``python3`` (a shell has no ``O_NOFOLLOW`` open)."""
        from cleanslate.hosts.files import MISSING_STATUS, REFUSED_STATUS, remote_source

        result = await self.run([self.python, "-I", "-S", "-c", remote_source(), root, path,
                                 str(max_bytes), "1" if tail else "0"],
                                timeout=30.0 + max_bytes / 1e6)
        if result.returncode == MISSING_STATUS:
            raise FileNotFoundError(f"{path} does not exist on {self.name}")
        if result.returncode == REFUSED_STATUS:
            why = result.stderr.decode(errors="replace").strip().splitlines()
            raise PermissionError(f"{self.name}: {why[-1] if why else 'refused'}")
        if not result.ok:
            raise OSError(f"cannot read {path} on {self.name}: {result.describe_failure()}")
        return result.stdout

    @contextlib.asynccontextmanager
    async def forward_port(self, port: int) -> AsyncIterator[str]:
        """``127.0.0.1:port`` on the host, forwarded over the executor's connection (``ssh -L
        PATH:127.0.0.1:port``) to a Unix socket in a folder only this user can enter (0700),
        for as long as the context lasts; no TCP port of this machine listens, so no other
        local user can send the server a request. Yields the forward's base URL
        (``http://fwd-<random>.cleanslate.invalid``), which HTTP clients reach through
        :func:`cleanslate.hosts.forward.connector_for`."""
        from cleanslate.hosts import forward

        conn, _link = await self._connection()
        with forward.private_socket() as path:
            try:
                listener = await conn.forward_local_path_to_port(path, "127.0.0.1", int(port))
            except (OSError, asyncssh.Error) as exc:
                raise OSError(f"cannot forward port {port} of {self.name}: {exc}") from exc
            base_url = forward.register(path)
            try:
                os.chmod(path, 0o600)  # the folder is what keeps others out; the socket too
                yield base_url
            finally:
                forward.unregister(base_url)
                listener.close()
                with contextlib.suppress(Exception):
                    await listener.wait_closed()

    async def close(self) -> None:
        """Close this target's connection on the running loop (others keep theirs)."""
        if self._resolved is None:
            return
        with contextlib.suppress(RuntimeError):
            links = _LINKS.get(asyncio.get_running_loop(), {})
            link = links.pop(self._link_key(self._resolved), None)
            if link is not None and link.connecting is not None and link.connecting.done() \
                    and not link.connecting.cancelled() and link.connecting.exception() is None:
                conn = link.connecting.result()
                conn.close()
                with contextlib.suppress(Exception):
                    await conn.wait_closed()


def _closed(conn: asyncssh.SSHClientConnection) -> bool:
    return bool(conn.is_closed())


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else str(value).encode()


def _signal_number(name: str) -> int:
    import signal

    try:
        return int(signal.Signals["SIG" + name.removeprefix("SIG")])
    except KeyError:
        return 255
