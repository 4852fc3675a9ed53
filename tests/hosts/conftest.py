"""A real OpenSSH server on 127.0.0.1 for the whole session, started and ended by PID.

Ports (each a ``Host`` alias in the client config of ``Sshd.home``):

- ``plain``: a normal login;
- ``nopy``: a session whose ``PATH`` has the usual tools and a replaying ``nvidia-smi``
  stand-in (the idle H200 fixture) but no ``python3``;
- ``hang``: a session whose ``python3`` records its PID and hangs;
- ``py``: a session whose ``python3`` is the interpreter running the tests (so the simulated
  engine is importable there), starting in a directory of the test run (where ``serve`` keeps
  a remote run's files, relative to the login directory).

Skipped, with the reason, only where ``/usr/sbin/sshd`` is missing (``apt-get install -y
openssh-server``); CI installs it.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.sshd import Profile, Sshd, restricted_bin, sshd_available, start_sshd

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-h200x2"

NVIDIA_SMI_REPLAY = """\
#!/bin/sh
case "$*" in
  *--query-gpu=*) n=idle_query; code={gpu_code} ;;
  *--query-compute-apps=*) n=idle_apps; code={apps_code} ;;
  *) echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 99 ;;
esac
cat "{fixtures}/$n.out"
cat "{fixtures}/$n.err" >&2
exit $code
"""


def nvidia_smi_replay() -> str:
    """A stand-in ``nvidia-smi`` replaying the idle H200 fixture (its ``.exit`` reads
    ``exit=N``)."""
    def code(stem: str) -> int:
        return int(re.sub(r"\D", "", (FIXTURES / f"{stem}.exit").read_text()) or 0)

    return NVIDIA_SMI_REPLAY.format(fixtures=FIXTURES, gpu_code=code("idle_query"),
                                    apps_code=code("idle_apps"))

PYTHON_WRAPPER = """\
#!/bin/sh
if [ -n {pythonpath} ]; then PYTHONPATH={pythonpath}; export PYTHONPATH; fi
exec {python} "$@"
"""

HANGING_PYTHON = """\
#!/bin/sh
echo $$ >> "{pids}"
exec sleep 300
"""


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not sshd_available():
        pytest.skip("/usr/sbin/sshd is missing: apt-get install -y openssh-server")
    root = tmp_path_factory.mktemp("sshd")
    nopy = restricted_bin(root / "nopy-bin", {
        "nvidia-smi": nvidia_smi_replay(),
    })
    hang = restricted_bin(root / "hang-bin", {
        "python3": HANGING_PYTHON.format(pids=root / "hang-pids"),
    })
    # A script, not a link: a virtual environment's interpreter must run under its own path,
    # and the session does not inherit this process's PYTHONPATH.
    pybin = restricted_bin(root / "py-bin", {"python3": PYTHON_WRAPPER.format(
        pythonpath=shlex.quote(os.environ.get("PYTHONPATH", "")),
        python=shlex.quote(sys.executable))})
    server = start_sshd(root, {
        "plain": Profile(),
        "nopy": Profile(path=str(nopy)),
        "hang": Profile(path=f"{hang}:/usr/local/bin:/usr/bin:/bin"),
        "py": Profile(path=f"{pybin}:/usr/local/bin:/usr/bin:/bin", cwd=str(root / "login")),
    })
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ssh_home(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's ``HOME`` is the test client home (for executors used in-process)."""
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("CLEANSLATE_SSH_ACCEPT_NEW", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return sshd.home


def hang_pids(sshd: Sshd) -> list[int]:
    path = sshd.root / "hang-pids"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
