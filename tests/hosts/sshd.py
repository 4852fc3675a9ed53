"""A real OpenSSH server on 127.0.0.1 for tests and benchmarks, started and ended by PID.

:func:`start_sshd` writes, under a fresh directory: a host key, a client key, an
``authorized_keys``, an ``sshd_config`` listening on free non-default ports of 127.0.0.1, and a
client home (``home/.ssh/config`` with one ``Host`` alias per port, ``known_hosts`` holding the
server's key, ``id_ed25519``). Running a client with ``HOME`` set to that home is how a user
with that ``~/.ssh`` would run it. Each port can have a *profile*: a ``ForceCommand`` wrapper that
changes the session (a ``PATH`` without ``python3``, an added latency) the way a restricted
account or a far-away host would.

Used by ``tests/hosts`` (session fixture), ``benchmarks/remote_check.py`` and ``tests/fleet``
(one server per host, each in its own PID namespace: :mod:`tests.fleet.hosts`).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests._kit import free_port

SSHD = "/usr/sbin/sshd"

#: Tools a session without ``python3`` keeps (what the fallback probe and the executor use).
RESTRICTED_TOOLS = (
    "sh", "bash", "timeout", "env", "ps", "ss", "cat", "grep", "ls", "head", "tail", "date",
    "mkdir", "mv", "chmod", "dirname", "sleep", "id", "tr", "stat",
)


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK) and shutil.which("ssh-keygen") is not None


@dataclass(frozen=True)
class Profile:
    """How sessions on one port differ from a plain login.

    ``path``: the ``PATH`` of the session (``None``: sshd's default). ``delay_s``: seconds each
    command waits before it starts (a slow link or a loaded host). ``cwd``: the directory the
    session starts in (created). ``env``: variables exported to the session, ``(NAME, VALUE)``.
    """

    path: str | None = None
    delay_s: float = 0.0
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class Sshd:
    """A running test server. ``ports`` maps an alias (a ``Host`` in the client config) to its
    port; ``home`` is the client home whose ``.ssh`` knows every alias."""

    root: Path
    pid: int
    ports: dict[str, int]
    home: Path
    user: str
    host_key_pub: str
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def url(self, alias: str, **query: str) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"ssh://{self.user}@127.0.0.1:{self.ports[alias]}" + (f"?{q}" if q else "")

    def client_env(self, home: Path | None = None) -> dict[str, str]:
        """The environment of a client that uses ``home`` (default: the one that knows all)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("SSH_AUTH_SOCK", "CLEANSLATE_SSH_ACCEPT_NEW", "CLEANSLATE_SSH_CONFIG")}
        return {**env, "HOME": str(home or self.home), **self.env}

    def stop(self) -> None:
        """End the server, by its PID (the sessions it forked end with their connections)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def keygen(path: Path) -> str:
    """A new ed25519 key pair without a passphrase at ``path``; returns the public line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True)
    return Path(str(path) + ".pub").read_text().strip()


def restricted_bin(directory: Path, extra: Mapping[str, str] | None = None) -> Path:
    """A directory of links to :data:`RESTRICTED_TOOLS` (no ``python3``), plus ``extra`` scripts
    (name -> shell source)."""
    directory.mkdir(parents=True, exist_ok=True)
    for tool in RESTRICTED_TOOLS:
        found = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        if found and not (directory / tool).exists():
            (directory / tool).symlink_to(found)
    for name, source in (extra or {}).items():
        script = directory / name
        script.write_text(source)
        script.chmod(0o755)
    return directory


def start_sshd(root: Path, profiles: Mapping[str, Profile], *, timeout: float = 15.0) -> Sshd:
    """Start ``sshd -D`` with one port per alias in ``profiles``; wait until every port accepts.

    Runs as whoever runs the tests: as root, root logs in by key (``PermitRootLogin
    prohibit-password``); as another user, only that user can log in.
    """
    root.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    host_key = root / "ssh_host_ed25519_key"
    host_pub = keygen(host_key)
    home = root / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh").chmod(0o700)
    client_key = home / ".ssh" / "id_ed25519"
    client_pub = keygen(client_key)
    authorized = root / "authorized_keys"
    authorized.write_text(client_pub + "\n")
    authorized.chmod(0o600)

    ports = {alias: free_port() for alias in profiles}
    lines = server_config(root, host_key, authorized, ports.values())
    for alias, profile in profiles.items():
        wrapper = session_wrapper(root / f"session-{alias}.sh", profile)
        if wrapper is not None:
            lines += [f"Match LocalPort {ports[alias]}", f"    ForceCommand {wrapper}"]
    config = root / "sshd_config"
    config.write_text("\n".join(lines) + "\n")

    client = [
        "# written by tests/hosts/sshd.py",
    ]
    known = home / ".ssh" / "known_hosts"
    known.write_text("".join(f"[127.0.0.1]:{port} {host_pub}\n" for port in ports.values()))
    for alias, port in ports.items():
        client += [
            f"Host {alias}",
            "    HostName 127.0.0.1",
            f"    Port {port}",
            f"    User {user}",
            "    IdentityFile ~/.ssh/id_ed25519",
            "",
        ]
    (home / ".ssh" / "config").write_text("\n".join(client))

    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
    log = open(root / "sshd.log", "wb")  # noqa: SIM115 (the server writes it while it runs)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    server = Sshd(root=root, pid=proc.pid, ports=ports, home=home, user=user,
                  host_key_pub=host_pub, proc=proc)
    try:
        wait_listening(proc, ports.values(), root / "sshd.log", timeout)
    except RuntimeError:
        server.stop()
        raise
    return server


def server_config(root: Path, host_key: Path, authorized: Path,
                  ports: Iterable[int]) -> list[str]:
    """The ``sshd_config`` lines of a test server: key login only, on ``ports`` of 127.0.0.1,
    its PID file in ``root``."""
    return [
        *(f"Port {port}" for port in ports),
        "ListenAddress 127.0.0.1",
        f"HostKey {host_key}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "MaxSessions 64",
        "MaxStartups 200",
        "AllowTcpForwarding yes",
        "LogLevel ERROR",
        "Subsystem sftp internal-sftp",
    ]


def session_wrapper(path: Path, profile: Profile) -> Path | None:
    """Write the ``ForceCommand`` script of ``profile`` at ``path`` (``None``: a plain login
    needs none)."""
    if profile.path is None and not profile.delay_s and profile.cwd is None and not profile.env:
        return None
    body = ["#!/bin/sh"]
    if profile.delay_s:
        body.append(f"/bin/sleep {profile.delay_s}")
    if profile.path is not None:
        body.append(f"PATH={profile.path}; export PATH")
    for name, value in profile.env:
        body.append(f"{name}={shlex.quote(value)}; export {name}")
    if profile.cwd is not None:
        Path(profile.cwd).mkdir(parents=True, exist_ok=True)
        body.append(f"cd {profile.cwd} || exit 1")
    body.append('exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"')
    path.write_text("\n".join(body) + "\n")
    path.chmod(0o755)
    return path


def wait_listening(proc: subprocess.Popen[bytes], ports: Iterable[int], log: Path,
                   timeout: float) -> None:
    """Wait until every port of 127.0.0.1 accepts; :class:`RuntimeError` with the server's log
    when ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    pending = set(ports)
    while pending:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: "
                               + log.read_text(errors="replace"))
        if time.monotonic() > deadline:
            raise RuntimeError("sshd did not listen in time: " + log.read_text(errors="replace"))
        for port in list(pending):
            with socket.socket() as s, contextlib.suppress(OSError):
                s.settimeout(0.2)
                s.connect(("127.0.0.1", port))
                pending.discard(port)
        time.sleep(0.05)
