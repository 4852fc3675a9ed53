"""The ``cleanslate`` command line (typer + rich).

Each command is a function in its own module of this package (``check``, ``serve``, ``stop``,
``clean``, ``bench``, ``tune``, ``worker``, ``report``; ``sim`` mounts
:mod:`cleanslate.sim.cli`) that turns its options into one call of the library and renders
the result; they are registered on :data:`app` here, so that no command module imports this
one. Exit codes everywhere are :class:`cleanslate.errors.ExitCode`: 0 clean / success, 1 dirty
/ failed, 2 usage or input error, 3 unknown.

A command module imports only what ``cleanslate --help`` needs at its top; the library's heavy
stacks (the store, the benchmark client, Optuna) are imported when a command runs.
"""

from __future__ import annotations

import contextlib
import os
import sys

import typer
from rich.markup import escape

from cleanslate.cli._common import console_err
from cleanslate.cli.bench import bench
from cleanslate.cli.check import check
from cleanslate.cli.clean import clean
from cleanslate.cli.report import report
from cleanslate.cli.serve import serve
from cleanslate.cli.stop import stop
from cleanslate.cli.tune import tune
from cleanslate.cli.worker import worker
from cleanslate.errors import ExitCode, InputError
from cleanslate.sim.cli import sim_app

app = typer.Typer(
    name="cleanslate",
    help="Verify a GPU host is a clean slate, launch and benchmark inference servers, tune them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# In the order `cleanslate --help` lists them.
app.command()(bench)
app.command()(check)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve)
app.command()(stop)
app.command()(clean)
app.command()(report)
app.command()(tune)
app.command()(worker)
app.add_typer(sim_app, name="sim")


def _error(text: str) -> None:
    console_err.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def main() -> None:
    """Console-script entry point: runs the app; never a traceback for a user's mistake.

    - :class:`InputError`: its message, ``where`` and hint; exit 2.
    - ``MemoryError``: the sizes asked for do not fit in memory; exit 2.
    - ``BrokenPipeError``: the reader of stdout went away (``| head``); exit 1 quietly.
    - any other ``OSError`` that no command handled (a file named on the command line that
      cannot be read or written): its reason and file; exit 2. Commands name the option where
      they write outputs (``--json``, ``--html``, ``--save-baseline``).
    """
    try:
        app()
    except InputError as exc:
        _error(exc.render())
        sys.exit(ExitCode.INPUT)
    except MemoryError:
        _error("out of memory: the sizes asked for (levels, prompts, lengths, files) do not "
               "fit in this machine's memory\n  hint: ask for less; docs/bench.md and "
               "docs/study.md list the caps")
        sys.exit(ExitCode.INPUT)
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit: point it at /dev/null.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        sys.exit(ExitCode.FAILED)
    except OSError as exc:
        name = exc.filename if exc.filename is not None else ""
        reason = exc.strerror or str(exc)
        _error(f"{name}: {reason}" if name else reason)
        sys.exit(ExitCode.INPUT)


__all__ = ["app", "main"]
