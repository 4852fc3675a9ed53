"""Test hosts that behave like separate machines: one OpenSSH server per host, each in its own
PID namespace with its own simulated GPU ledger, ``/dev/shm`` and login directory.

How it works
------------

:func:`start_fleet` starts, for each host alias (``fleet-a``, ``fleet-b`` ...), one
``unshare --pid --fork --mount-proc --kill-child`` whose child, :mod:`tests.fleet._hostinit`, is
PID 1 of a fresh PID namespace with its own ``/proc`` and a private mount namespace. That init

- bind-mounts the host's ledger directory (``<root>/hosts/<alias>/ledger``, a ledger of
  ``gpus`` simulated GPUs) on the one path every host and the client call the ledger,
  :attr:`Fleet.ledger_path` (``<root>/gpus``), and mounts a tmpfs on ``/dev/shm``: one path,
  different contents on each host, as on separate machines;
- optionally starts a **decoy** (:class:`Decoy`): a process whose command line is
  ``sglang::scheduler`` (its script read from stdin, so argv is that title alone, as a process
  that called ``setproctitle`` shows it; ``comm`` set by ``prctl(PR_SET_NAME)``, 15 bytes:
  ``sglang::schedul``), in its own session, holding simulated GPU memory in that host's ledger
  (written with :func:`cleanslate.sim.ledger.allocate`, as the sim engine's workers write
  theirs). No cleanslate run started it and no teardown may touch it: it writes every signal it
  catches (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) to a file
  (:meth:`FleetHost.decoy_signals`) and keeps running, so a stray SIGTERM is seen, and a SIGKILL
  is seen as its death;
- starts ``sshd -D`` on a free port of 127.0.0.1 with the host's own host key and a
  ``ForceCommand`` session wrapper (``tests/hosts/sshd.py``'s profile) that exports
  ``CLEANSLATE_SIM_GPU_DIR`` (the ledger path), puts a ``python3`` that runs this interpreter
  first on ``PATH`` (so ``cleanslate.sim`` is importable there) and starts in the host's login
  directory (where remote runs keep ``.cleanslate/runs/``); then reaps orphans and exits when
  sshd exits, and the kernel ends everything left in the namespace.

The client side is one home (:attr:`Fleet.home`) whose ``.ssh/config`` has one ``Host`` alias
per host and whose ``known_hosts`` has each host's key; :meth:`Fleet.client_env` is the
environment of a client using it (``HOME`` switched as in ``tests/hosts``, and
``CLEANSLATE_SIM_GPU_DIR`` set to the ledger path, which the ``sim`` GPU backend sends to the
host it reads and the sim engine's runs write to). So ``cleanslate check --host fleet-a
--gpu-backend sim`` sees only fleet-a's processes and GPUs, and a study can say ``hosts:
[fleet-a, fleet-b]``.

What the hosts share: the network namespace (every host is 127.0.0.1; a server's port is taken
on all of them, so give each host's servers their own ports: cleanslate polls a remote run's
readiness at ``http://127.0.0.1:PORT`` from the client, so a private network per host would
break serving), the file system except the ledger path and ``/dev/shm``, and the kernel log.
And the test session sees into the hosts, not the other way round: a PID namespace's processes
are visible (under other PIDs) from the namespace it was made in, so a check of *this* machine
sees every host's processes, the decoy included. Keep a fleet no longer than the tests that need
it (the fixtures end theirs with the test or the module).

Teardown (:meth:`Fleet.stop`) sends SIGTERM to each host's init (by PID; it forwards it to sshd
and exits when sshd has), then SIGKILL to an init still there after a few seconds; the end of
PID 1 ends every process in its namespace. Nothing else is signalled. Should the test run itself
be killed, each ``unshare`` gets SIGKILL as its parent ends (``PR_SET_PDEATHSIG``) and takes its
host with it (``--kill-child``).

Needs root (a PID namespace), ``unshare`` and ``nsenter`` (util-linux), ``mount`` and
``/usr/sbin/sshd``: :func:`fleet_unavailable` says which is missing, and the fixtures skip with
that reason.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from cleanslate.sim import ledger
from tests._kit import free_port
from tests.hosts.sshd import (
    SSHD,
    Profile,
    keygen,
    server_config,
    session_wrapper,
    sshd_available,
    wait_listening,
)

HOSTINIT = Path(__file__).resolve().parent / "_hostinit.py"

#: The title the decoy shows (the SGLang scheduler's ``setproctitle``).
DECOY_TITLE = "sglang::scheduler"

PYTHON_WRAPPER = """\
#!/bin/sh
if [ -n {pythonpath} ]; then PYTHONPATH={pythonpath}; export PYTHONPATH; fi
exec {python} "$@"
"""

DECOY_SOURCE = """\
import ctypes, os, signal, sys, time
ctypes.CDLL(None).prctl(15, TITLE.encode()[:15], 0, 0, 0)  # PR_SET_NAME: comm
log = os.environ["DECOY_SIGNALS"]
def note(signum, frame):
    with open(log, "a") as fh:
        fh.write("%d %s %.3f\\n" % (signum, signal.Signals(signum).name, time.time()))
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2):
    signal.signal(sig, note)
ns = {"__name__": "sim_ledger"}
exec(LEDGER, ns)
ns["allocate"](os.environ["CLEANSLATE_SIM_GPU_DIR"], GPU, USED_MIB, TITLE)
ready = os.environ["DECOY_READY"]
with open(ready + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
while True:
    signal.pause()
"""


@dataclass(frozen=True)
class Decoy:
    """A process no cleanslate run started: ``title`` holding ``used_mib`` of simulated memory on
    GPU ``gpu`` of its host's ledger."""

    gpu: int = 0
    used_mib: int = 30_000
    title: str = DECOY_TITLE


@lru_cache(maxsize=1)
def fleet_unavailable() -> str | None:
    """Why namespaced test hosts cannot run here (``None``: they can)."""
    if not sys.platform.startswith("linux"):
        return "Linux only (PID namespaces)"
    if not sshd_available():
        return f"{SSHD} or ssh-keygen is missing: apt-get install -y openssh-server"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    if os.geteuid() != 0:
        return "not root: a PID namespace per test host needs unshare as root"
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                                "true"],
                               capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare --pid --fork --mount-proc failed: {exc}"
    if probe.returncode != 0:
        return ("unshare --pid --fork --mount-proc failed: "
                + probe.stderr.decode(errors="replace").strip()[:200])
    return None


def _stat_fields(path: str) -> list[str] | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()


@dataclass
class FleetHost:
    """One test host. PIDs named ``*_pid`` are as this process sees them (outer), except
    :attr:`decoy_pid` and :attr:`sshd_pid`, which are PIDs inside the host's namespace (what
    the host's own checks report)."""

    alias: str
    port: int
    root: Path
    ledger: Path
    login: Path
    unshare: subprocess.Popen[bytes]
    init_pid: int
    sshd_pid: int
    decoy: Decoy | None = None
    decoy_pid: int | None = None
    decoy_outer_pid: int | None = None

    def proc_path(self, pid: int, name: str = "stat") -> str:
        """``/proc/PID/NAME`` of a PID inside the namespace, through the init's root."""
        return f"/proc/{self.init_pid}/root/proc/{pid}/{name}"

    def pid_alive(self, pid: int, start_ticks: int | None = None) -> bool:
        """Whether ``pid`` (a PID inside this host's namespace) exists there and is not a zombie;
        with ``start_ticks``, also that it is the same process."""
        rest = _stat_fields(self.proc_path(pid))
        if not rest or rest[0] in ("Z", "X", "x"):
            return False
        return start_ticks is None or int(rest[19]) == start_ticks

    def start_ticks(self, pid: int) -> int | None:
        rest = _stat_fields(self.proc_path(pid))
        return int(rest[19]) if rest else None

    def pids(self) -> dict[int, str]:
        """Every process of the host, by PID inside the namespace, with its command line."""
        procfs = Path(f"/proc/{self.init_pid}/root/proc")
        found: dict[int, str] = {}
        for entry in procfs.iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(
                        b"\0", b" ").decode(errors="replace").strip()
        return found

    def inside(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the host's PID and mount namespaces (``nsenter``)."""
        return subprocess.run(["nsenter", "-t", str(self.init_pid), "-p", "-m", "--", *argv],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def decoy_signals(self) -> list[str]:
        """The signals the decoy caught (``"15 SIGTERM <time>"`` lines); empty when none."""
        path = self.root / "decoy-signals"
        return path.read_text().splitlines() if path.exists() else []

    def ledger_entries(self) -> list[dict[str, Any]]:
        """The allocations written in this host's ledger (as files, whoever holds them)."""
        entries = []
        for path in sorted(self.ledger.glob("alloc-*.json")):
            with contextlib.suppress(OSError, ValueError):
                entries.append(json.loads(path.read_text()))
        return entries

    @property
    def running(self) -> bool:
        return self.unshare.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the host's init (it stops sshd and exits, which ends its namespace), SIGKILL
        it when it is still there after ``timeout`` seconds; then reap ``unshare``."""
        if self.unshare.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGTERM)
            try:
                self.unshare.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.init_pid, signal.SIGKILL)
                try:
                    self.unshare.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.unshare.kill()  # --kill-child: its child dies with it
                    self.unshare.wait(timeout=timeout)


@dataclass
class Fleet:
    """Running test hosts, by alias, and the client home that knows them all."""

    root: Path
    home: Path
    user: str
    ledger_path: Path
    hosts: dict[str, FleetHost]
    start_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def aliases(self) -> list[str]:
        return list(self.hosts)

    def __getitem__(self, alias: str) -> FleetHost:
        return self.hosts[alias]

    def url(self, alias: str) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.hosts[alias].port}"

    def client_env(self, home: Path | None = None) -> dict[str, str]:
        """The environment of a client with this fleet's ``~/.ssh`` and ledger path."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("SSH_AUTH_SOCK", "CLEANSLATE_SSH_ACCEPT_NEW", "CLEANSLATE_SSH_CONFIG",
                            "CLEANSLATE_STORE")}
        return {**env, "HOME": str(home or self.home),
                ledger.SIM_GPU_DIR_ENV: str(self.ledger_path), **self.env}

    def cli(self, *args: str, timeout: float = 180,
            env: Mapping[str, str] | None = None) -> CliRun:
        """Run ``cleanslate ARGS`` as a user of this fleet's client home would, in the fleet's
        root directory (a ``./cleanslate.db`` or ``./artifacts`` there is the fleet's)."""
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "cleanslate", *args], capture_output=True,
                              text=True, env={**self.client_env(), **(env or {})},
                              cwd=self.root, timeout=timeout, check=False)
        return CliRun(done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def ssh(self, alias: str, command: str,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on a host with OpenSSH's own client, as ``ssh ALIAS COMMAND``
        (OpenSSH finds ``~`` from the password database, not ``HOME``: the client home's files
        are named on its command line)."""
        dot = self.home / ".ssh"
        return subprocess.run(["ssh", "-F", str(dot / "config"), "-o", "BatchMode=yes",
                               "-o", f"UserKnownHostsFile={dot / 'known_hosts'}",
                               "-o", f"IdentityFile={dot / 'id_ed25519'}",
                               "-o", "IdentitiesOnly=yes", alias, command],
                              capture_output=True, text=True, env=self.client_env(),
                              timeout=timeout, check=False)

    def stop(self) -> None:
        """End every host (see :meth:`FleetHost.stop`); the hosts stop at the same time."""
        for host in self.hosts.values():
            if host.unshare.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(host.init_pid, signal.SIGTERM)
        for host in self.hosts.values():
            host.stop()


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    def json(self) -> Any:
        return json.loads(self.stdout)


def _wait_file(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"test host exited {proc.returncode} before it was ready: "
                               + log.read_text(errors="replace"))
        if time.monotonic() > deadline:
            raise RuntimeError(f"test host not ready after {timeout:g} s ({path.name}): "
                               + log.read_text(errors="replace"))
        time.sleep(0.02)
    return path.read_text()


def outer_pid(init_pid: int, inner: int) -> int | None:
    """The PID, as this process sees it, of the process ``inner`` of the namespace whose init is
    ``init_pid`` (from ``NSpid`` in ``/proc/PID/status``)."""
    ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != ns:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == inner:
                    return int(entry.name)
        except (OSError, ValueError):
            continue
    return None


def start_fleet(root: Path, aliases: Iterable[str] = ("fleet-a", "fleet-b"), *,
                decoys: Mapping[str, Decoy] | None = None, gpus: int = 8,
                timeout: float = 30.0) -> Fleet:
    """Start one namespaced sshd per alias (concurrently), with ``decoys[alias]`` on that host;
    return when every host listens and every decoy holds its memory. On failure, what was
    started is ended before the error goes on."""
    reason = fleet_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    started = time.monotonic()
    decoys = dict(decoys or {})
    aliases = list(aliases)
    unknown = set(decoys) - set(aliases)
    if unknown:
        raise ValueError(f"decoys on hosts that are not started: {sorted(unknown)}")
    root.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    home = root / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh").chmod(0o700)
    client_pub = keygen(home / ".ssh" / "id_ed25519")
    authorized = root / "authorized_keys"
    authorized.write_text(client_pub + "\n")
    authorized.chmod(0o600)
    ledger_path = root / "gpus"  # the client's own ledger: no GPU in use
    ledger.write_config(str(ledger_path), gpus=gpus)
    pybin = root / "bin"
    pybin.mkdir(exist_ok=True)
    (pybin / "python3").write_text(PYTHON_WRAPPER.format(
        pythonpath=shlex.quote(os.environ.get("PYTHONPATH", "")),
        python=shlex.quote(sys.executable)))
    (pybin / "python3").chmod(0o755)
    with contextlib.suppress(OSError):
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation

    pending: list[tuple[str, Path, int, str, subprocess.Popen[bytes]]] = []
    hosts: dict[str, FleetHost] = {}
    try:
        for alias in aliases:
            hroot = root / "hosts" / alias
            hroot.mkdir(parents=True)
            host_key = hroot / "ssh_host_ed25519_key"
            host_pub = keygen(host_key)
            hledger = hroot / "ledger"
            ledger.write_config(str(hledger), gpus=gpus)
            port = free_port()
            wrapper = session_wrapper(hroot / "session.sh", Profile(
                path=f"{pybin}:/usr/local/bin:/usr/bin:/bin", cwd=str(hroot / "login"),
                env=((ledger.SIM_GPU_DIR_ENV, str(ledger_path)),)))
            lines = [*server_config(hroot, host_key, authorized, [port]),
                     f"SetEnv {ledger.SIM_GPU_DIR_ENV}={ledger_path}",
                     f"ForceCommand {wrapper}"]
            config = hroot / "sshd_config"
            config.write_text("\n".join(lines) + "\n")
            argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                    sys.executable, "-I", str(HOSTINIT),
                    "--bind", f"{hledger}:{ledger_path}", "--shm",
                    "--ready", str(hroot / "ready.json")]
            decoy = decoys.get(alias)
            if decoy is not None:
                spec = {
                    "argv0": decoy.title,
                    "python": sys.executable,
                    "source": (f"LEDGER = {Path(ledger.__file__).read_text()!r}\n"
                               f"TITLE = {decoy.title!r}\nGPU = {decoy.gpu}\n"
                               f"USED_MIB = {decoy.used_mib}\n" + DECOY_SOURCE),
                    "env": {ledger.SIM_GPU_DIR_ENV: str(ledger_path),
                            "DECOY_SIGNALS": str(hroot / "decoy-signals"),
                            "DECOY_READY": str(hroot / "decoy-ready")},
                }
                (hroot / "decoy.json").write_text(json.dumps(spec))
                argv += ["--decoy", str(hroot / "decoy.json")]
            argv += ["--", SSHD, "-D", "-e", "-f", str(config)]
            log = open(hroot / "host.log", "wb")  # noqa: SIM115 (written while the host runs)
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            log.close()
            pending.append((alias, hroot, port, host_pub, proc))

        for alias, hroot, port, _, proc in pending:
            ready = json.loads(_wait_file(hroot / "ready.json", proc, hroot / "host.log",
                                          timeout))
            init_pid = _outer_pid_of_child(proc.pid)
            host = FleetHost(alias=alias, port=port, root=hroot, ledger=hroot / "ledger",
                             login=hroot / "login", unshare=proc, init_pid=init_pid,
                             sshd_pid=int(ready["sshd"]), decoy=decoys.get(alias))
            hosts[alias] = host
            wait_listening(proc, [port], hroot / "host.log", timeout)
            if host.decoy is not None:
                inner = int(_wait_file(hroot / "decoy-ready", proc, hroot / "host.log",
                                       timeout))
                host.decoy_pid = inner
                host.decoy_outer_pid = outer_pid(init_pid, inner)
    except BaseException:
        for _, _, _, _, proc in pending:
            _end_unshare(proc)
        raise

    (home / ".ssh" / "known_hosts").write_text("".join(
        f"[127.0.0.1]:{port} {pub}\n" for _, _, port, pub, _ in pending))
    client = ["# written by tests/fleet/hosts.py"]
    for alias, host in hosts.items():
        client += [f"Host {alias}", "    HostName 127.0.0.1", f"    Port {host.port}",
                   f"    User {user}", "    IdentityFile ~/.ssh/id_ed25519", ""]
    (home / ".ssh" / "config").write_text("\n".join(client))
    return Fleet(root=root, home=home, user=user, ledger_path=ledger_path, hosts=hosts,
                 start_s=time.monotonic() - started)


def _die_with_parent() -> None:
    """In ``unshare`` before it runs: SIGKILL when the thread that started it ends (a test run
    killed without its teardown), and ``--kill-child`` passes that on to the host's init."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _outer_pid_of_child(unshare_pid: int, timeout: float = 5.0) -> int:
    """The PID (as this process sees it) of the child ``unshare --fork`` started: the init."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text()
            if children.split():
                return int(children.split()[0])
        if time.monotonic() > deadline:
            raise RuntimeError(f"unshare (PID {unshare_pid}) has no child")
        time.sleep(0.01)


def _end_unshare(proc: subprocess.Popen[bytes]) -> None:
    """End a host that failed to start: its init first (by PID), then unshare."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(RuntimeError, ProcessLookupError):
        os.kill(_outer_pid_of_child(proc.pid, timeout=0.5), signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
