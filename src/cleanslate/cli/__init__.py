"""The ``cleanslate`` command line (typer + rich).

Exit codes everywhere: 0 clean / success, 1 dirty / failed, 2 usage or input error, 3 unknown.
Each command lives in its own module of this package and registers itself on :data:`app`.
"""

from __future__ import annotations

import contextlib
import os
import sys

import typer
from rich.markup import escape

from cleanslate.cli._common import EXIT_FAILED, EXIT_INPUT, console_err
from cleanslate.errors import InputError

app = typer.Typer(
    name="cleanslate",
    help="Verify a GPU host is a clean slate, launch and benchmark inference servers, tune them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command modules register themselves on ``app`` when imported.
from cleanslate.cli import bench, check, clean, report, serve, sim, tune  # noqa: E402, F401


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
        sys.exit(EXIT_INPUT)
    except MemoryError:
        _error("out of memory: the sizes asked for (levels, prompts, lengths, files) do not "
               "fit in this machine's memory\n  hint: ask for less; docs/bench.md and "
               "docs/study.md list the caps")
        sys.exit(EXIT_INPUT)
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit: point it at /dev/null.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_FAILED)
    except OSError as exc:
        name = exc.filename if exc.filename is not None else ""
        reason = exc.strerror or str(exc)
        _error(f"{name}: {reason}" if name else reason)
        sys.exit(EXIT_INPUT)
