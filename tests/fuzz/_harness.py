"""Run the ``cleanslate`` command line in this process on one fuzzed input and judge the outcome.

An outcome is acceptable when the command ends with exit code 0, 1, 2 or 3, printed no
traceback, ended within its time bound, and left no process behind. :class:`Tally` counts inputs,
tracebacks, hangs and leftovers for the whole session (printed at the end by the conftest), so
the closing figures of a run can be quoted.

In-process is what makes thousands of inputs affordable (a child ``python -m cleanslate`` costs
half a second of imports); what a child process would add (the console-script entry point) is
:func:`cleanslate.cli.main` itself, which is what is called here. Signal handlers, the working
directory and the environment are restored after each call.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ACCEPTED = (0, 1, 2, 3)


class Hang(BaseException):
    """Raised by the alarm when a command overruns its time bound."""


@dataclass
class Outcome:
    args: tuple[str, ...]
    code: int | None
    stdout: str
    stderr: str
    elapsed_s: float
    traceback: str | None = None
    hung: bool = False
    leftovers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return (self.code in ACCEPTED and self.traceback is None and not self.hung
                and not self.leftovers and "Traceback (most recent call last)" not in
                self.stderr + self.stdout)

    def explain(self) -> str:
        return (f"cleanslate {' '.join(self.args)!r}\n  exit {self.code} in {self.elapsed_s:.2f} s"
                f"{' (HUNG)' if self.hung else ''}\n  leftovers: {list(self.leftovers)}\n"
                f"  traceback: {self.traceback}\n  stdout: {self.stdout[-1500:]}\n"
                f"  stderr: {self.stderr[-1500:]}")


@dataclass
class Tally:
    inputs: int = 0
    tracebacks: int = 0
    hangs: int = 0
    bad_exit: int = 0
    leftovers: int = 0
    by_command: dict[str, int] = field(default_factory=dict)
    codes: dict[int, int] = field(default_factory=dict)
    slowest_s: float = 0.0

    def add(self, outcome: Outcome) -> None:
        self.inputs += 1
        command = outcome.args[0] if outcome.args else "(none)"
        self.by_command[command] = self.by_command.get(command, 0) + 1
        if outcome.code is not None:
            self.codes[outcome.code] = self.codes.get(outcome.code, 0) + 1
        self.tracebacks += outcome.traceback is not None or (
            "Traceback (most recent call last)" in outcome.stderr + outcome.stdout)
        self.hangs += outcome.hung
        self.bad_exit += outcome.code not in ACCEPTED and not outcome.hung
        self.leftovers += bool(outcome.leftovers)
        self.slowest_s = max(self.slowest_s, outcome.elapsed_s)

    def summary(self) -> str:
        commands = ", ".join(f"{k} {v}" for k, v in sorted(self.by_command.items()))
        return (f"fuzz: {self.inputs} inputs ({commands}); "
                f"exit codes {dict(sorted(self.codes.items()))}; tracebacks {self.tracebacks}, "
                f"hangs {self.hangs}, other exit codes {self.bad_exit}, "
                f"processes left behind {self.leftovers}; slowest {self.slowest_s:.1f} s")


TALLY = Tally()


def _living_pids() -> dict[int, str]:
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            continue
        out[int(entry)] = stat[stat.find("(") + 1 : stat.rfind(")")]
    return out


@contextlib.contextmanager
def _restored_state() -> Iterator[None]:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    cwd = os.getcwd()
    env = dict(os.environ)
    argv = list(sys.argv)
    try:
        yield
    finally:
        signal.alarm(0)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = argv


def run_cli(args: Sequence[str], *, time_bound_s: float = 30.0, stdin: str = "") -> Outcome:
    """Run ``cleanslate ARGS`` through :func:`cleanslate.cli.main` and record the outcome."""
    from cleanslate.cli import main

    before = _living_pids()
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    tb: str | None = None
    hung = False
    started = time.monotonic()

    def alarm(_signum: int, _frame: object) -> None:
        raise Hang()

    with _restored_state():
        sys.argv = ["cleanslate", *args]
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, time_bound_s)
        old_stdin = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Hang:
            hung = True
        except BaseException:  # a traceback reaching the user
            tb = traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdin = old_stdin
    elapsed = time.monotonic() - started
    leftovers = _leftovers(before)
    outcome = Outcome(tuple(args), code, out.getvalue(), err.getvalue(), elapsed, tb, hung,
                      tuple(leftovers))
    TALLY.add(outcome)
    return outcome


def _leftovers(before: dict[int, str], wait_s: float = 3.0) -> list[str]:
    """Processes that did not exist before the call and still live (given a moment to exit)."""
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    while True:
        new = {pid: comm for pid, comm in _living_pids().items()
               if pid not in before and pid != me and _is_ours(pid)}
        if not new or time.monotonic() > deadline:
            return [f"{pid} {comm}" for pid, comm in sorted(new.items())]
        time.sleep(0.1)


def _is_ours(pid: int) -> bool:
    """In private namespaces every process is this session's; on a shared host only our
    descendants and processes carrying a run marker in our environment's store count."""
    if os.environ.get("CLEANSLATE_TEST_ISOLATED") == "isolated":
        return True
    try:
        import psutil

        return psutil.Process(pid) in psutil.Process().children(recursive=True)
    except Exception:
        return False
