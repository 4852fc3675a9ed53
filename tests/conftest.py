"""Shared fixtures: processes that a test starts and ends by PID, the CLI as a user runs it, and
the quiet-host guard of the tests that expect a clean verdict (see :mod:`tests._isolation`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests._kit import sticky_folder, victim_file

if TYPE_CHECKING:
    from tests.sim.conftest import SimServers

#: Set by ``tests._isolation`` (``-p tests._isolation`` in pyproject's addopts).
STATE_ENV = "CLEANSLATE_TEST_ISOLATED"


def isolated() -> bool:
    """Whether this session runs in its own PID, network and mount namespaces."""
    return os.environ.get(STATE_ENV) == "isolated"


@pytest.fixture(autouse=True, scope="session")
def _session_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The default store of every command a test runs (``$CLEANSLATE_STORE``): one file in the
    session's temporary folder, never ``./cleanslate.db`` in the folder pytest runs in (every
    ``bench`` records its result there). A test that means the default unsets it."""
    if os.environ.get("CLEANSLATE_STORE"):
        yield
        return
    db = tmp_path_factory.mktemp("store") / "cleanslate.db"
    os.environ["CLEANSLATE_STORE"] = f"sqlite:///{db}"
    try:
        yield
    finally:
        os.environ.pop("CLEANSLATE_STORE", None)


def pytest_report_header() -> str:
    state = os.environ.get(STATE_ENV, "no: tests._isolation was not loaded")
    if state == "isolated":
        return "host: private PID, network and mount namespaces (a quiet host)"
    return (f"host: shared ({state.removeprefix('no: ')}); tests marked quiet_host skip when "
            "other processes make it not clean")


_QUIET: dict[str, Any] = {}


def host_noise() -> list[str]:
    """What on this host, not started by this session, would spoil a clean verdict: engine
    processes, run markers, ``/dev/shm`` leftovers, listeners on the engines' default ports.
    Empty on a quiet host. Cached for a few seconds (it is a whole probe)."""
    import asyncio
    import time

    from cleanslate.hosts.local import LocalExecutor
    from cleanslate.verdict.check import CheckOptions, check_hosts
    from cleanslate.verdict.findings import Severity
    from cleanslate.verdict.rules import Scope

    now = time.monotonic()
    if _QUIET and now - _QUIET["at"] < 5.0:
        return list(_QUIET["noise"])
    options = CheckOptions(scope=Scope(exclude_roots=frozenset({os.getpid()})),
                           gpu_backend="none")
    report = asyncio.run(check_hosts([LocalExecutor()], options))
    # Warnings about what this user cannot read (PID 1's environment, other users' files) are
    # not noise: they are there on every shared host.
    noise = [f.message for host in report.hosts for f in host.findings
             if f.severity in (Severity.ERROR, Severity.UNKNOWN)
             or (f.severity == Severity.WARNING and f.kind.value == "shm_leftover")]
    _QUIET.update(at=now, noise=noise)
    return noise


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``quiet_host`` asserts verdicts about the whole host: outside private
    namespaces it runs only when the host is quiet, and otherwise skips saying what is there."""
    if item.get_closest_marker("quiet_host") is None or isolated():
        return
    noise = host_noise()
    if noise:
        pytest.skip(f"this machine is not quiet ({len(noise)} findings not made by this test, "
                    f"e.g. {noise[0][:160]}); run as root for private namespaces")


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    """Fail a test that leaves a process running (see :mod:`tests._leftovers`); only in the
    session's private PID namespace, where every process is this session's."""
    if not isolated():
        yield
        return
    from tests import _leftovers

    before = _leftovers.processes()
    yield
    left = _leftovers.settle(before, os.getpid())
    if left:
        pytest.fail(f"the test left {len(left)} process(es) running, now ended: "
                    + "; ".join(left), pytrace=False)


#: Figures the integration tests measured (ready time, throughput, kill-to-CLEAN), printed in a
#: "figures" section at the end of the run, so that a CI log shows them without ``-s``.
_FIGURES: list[str] = []


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Any:
    """``figure("ready in 1.6 s")``: report a measured figure under the test's name."""
    def add(line: str) -> None:
        _FIGURES.append(f"{request.node.nodeid}: {line}")
        print(line)
    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _FIGURES:
        terminalreporter.section("figures measured by the tests")
        for line in _FIGURES:
            terminalreporter.write_line(line)


class Processes:
    """Starts processes for a test and ends exactly those, by PID, when the test ends."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(list(argv), **kwargs)
        self.started.append(proc)
        return proc

    def python(self, code: str, *extra_args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        return self.start([sys.executable, "-c", code, *extra_args], **kwargs)

    def end_all(self) -> None:
        """SIGTERM each started process (a server stops its workers then), wait, SIGKILL what is
        left; descendants found before the first signal are ended too, by PID and start time,
        so that nothing a test started outlives it as an orphan."""
        import psutil

        tree: list[psutil.Process] = []
        for proc in self.started:
            with contextlib.suppress(psutil.Error):
                tree += psutil.Process(proc.pid).children(recursive=True)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for child in tree:  # psutil checks the start time: a reused PID is not signalled
            with contextlib.suppress(psutil.Error):
                child.kill()


@pytest.fixture
def procs() -> Iterator[Processes]:
    p = Processes()
    try:
        yield p
    finally:
        p.end_all()


def recorded_rows(db: Path, table: str = "cs_runs") -> list[dict[str, Any]]:
    """The JSON documents of a SQLite store's table (runs by default), read directly: a test's
    own view, independent of the store's API. Empty when the file does not exist yet."""
    import sqlite3

    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [json.loads(row[0]) for row in conn.execute(f"select data from {table}")]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> CliResult:
    """Run ``cleanslate ARGS`` as a user would, in a child process."""
    full_env = {**os.environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "cleanslate", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout, check=False,
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def cli() -> Any:
    return run_cli


PG_BIN = "/usr/lib/postgresql/15/bin"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server in a temporary folder, run as the ``postgres`` user (it refuses
    to run as root), on a free port; stopped at the end of the session. The folder is outside
    pytest's (root-only) temporary tree so that the ``postgres`` user can reach it."""
    import shutil
    import socket
    import tempfile

    if not os.path.exists(f"{PG_BIN}/initdb"):
        pytest.skip(f"PostgreSQL binaries not found in {PG_BIN}")
    base = Path(tempfile.mkdtemp(prefix="cleanslate-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    shutil.chown(base, "postgres")
    shutil.chown(sock, "postgres")
    base.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_pg, f"{PG_BIN}/initdb", "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*as_pg, f"{PG_BIN}/pg_ctl", "-D", str(data), "-l", str(base / "log"), "-w",
                    "-o", f"-p {port} -k {sock} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_pg, f"{PG_BIN}/pg_ctl", "-D", str(data), "-m", "fast", "-w",
                        "stop"], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky folder, like ``/tmp``, where another user plants links."""
    with sticky_folder() as folder:
        yield folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A root-owned file that a planted link points at (:func:`tests._kit.victim_file`)."""
    return victim_file(tmp_path)


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[SimServers]:
    """Sim servers a test starts (:class:`tests.sim.conftest.SimServers`), each ended by its
    PID when the test ends; shared by the tests of every folder."""
    from tests.sim.conftest import SimServers

    servers = SimServers(tmp_path)
    try:
        yield servers
    finally:
        servers.end_all()

