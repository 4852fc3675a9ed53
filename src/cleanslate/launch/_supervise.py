"""The run supervisor: a self-contained, stdlib-only script that starts one engine.

``cleanslate serve`` starts this script in a new session with the run's ``CLEANSLATE_RUN``
marker in its environment; it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
workers that outlive the engine's root process are re-parented to it rather than to PID 1, then
starts the engine in its own process group with the log going to the run's log file, and writes
a state file:

    {"supervisor_pid": .., "pid": .., "pgid": .., "sid": .., "started": <epoch s>,
     "exit_code": null | int, "exited_at": null | <epoch s>}

It reaps every child (the engine and the orphans it inherits) until none is left, then exits.
SIGTERM and SIGINT are forwarded to the engine's root process. Like the collector it needs only
the standard library, so it can be shipped to a remote host's ``python3``.

Usage: ``python3 -I -S _supervise.py SPEC.json`` where the spec holds ``argv``, ``env``, ``log``,
``state``, ``cwd`` and ``daemonize``. With ``daemonize`` the script forks, the parent exits at
once (so the command that started it returns), and the child starts a new session.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import time
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15


def _write_state(path: str, state: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def _prctl(option: int, value: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def main() -> int:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    argv: list[str] = spec["argv"]
    state_path: str = spec["state"]
    if spec.get("daemonize"):
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_NAME, b"cleanslate-sup")
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    state: dict[str, Any] = {
        "supervisor_pid": os.getpid(),
        "sid": os.getsid(0),
        "started": time.time(),
        "pid": None,
        "pgid": None,
        "exit_code": None,
        "exited_at": None,
        "error": None,
    }
    try:
        pid = os.fork()
    except OSError as exc:
        state["error"] = f"fork failed: {exc}"
        _write_state(state_path, state)
        return 1
    if pid == 0:  # the engine
        try:
            os.setpgid(0, 0)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            if spec.get("cwd"):
                os.chdir(spec["cwd"])
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, f"cleanslate: cannot start {argv[0]}: {exc}\n".encode())
            os._exit(127)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so the group exists before anyone signals it
    state["pid"] = pid
    state["pgid"] = pid
    _write_state(state_path, state)

    def forward(signum: int, _frame: Any) -> None:
        if state["exit_code"] is None:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if child == pid:
            state["exit_code"] = os.waitstatus_to_exitcode(status)
            state["exited_at"] = time.time()
            _write_state(state_path, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
