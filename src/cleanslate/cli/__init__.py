"""The ``cleanslate`` command line (typer + rich).

Each command is a function in its own module of this package (``check``, ``serve``, ``stop``,
``clean``, ``bench``, ``tune``, ``worker``, ``report``, ``runs``; ``slurm`` and ``sim`` are groups;
``sim`` mounts
:mod:`cleanslate.sim.cli`) that turns its options into one call of the library and renders
the result; :func:`build_app` registers them here, so that no command module imports this
one, and a command run from the shell imports only its own module. Exit codes everywhere are
:class:`cleanslate.errors.ExitCode`: 0 clean / success, 1 dirty / failed, 2 usage or input
error, 3 unknown.

A command module imports only what ``cleanslate --help`` needs at its top; the library's heavy
stacks (the store, the benchmark client, Optuna) are imported when a command runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any

import typer

from cleanslate.errors import ExitCode, InputError

#: The commands, in the order `cleanslate --help` lists them: name -> (module, options of
#: ``app.command``). The module's function of the same name is the command.
COMMANDS: dict[str, tuple[str, dict[str, Any]]] = {
    "bench": ("cleanslate.cli.bench", {}),
    "check": ("cleanslate.cli.check", {}),
    "doctor": ("cleanslate.cli.doctor", {}),
    "serve": ("cleanslate.cli.serve", {"context_settings": {
        "allow_extra_args": True, "ignore_unknown_options": True}}),
    "stop": ("cleanslate.cli.stop", {}),
    "clean": ("cleanslate.cli.clean", {}),
    "report": ("cleanslate.cli.report", {}),
    "runs": ("cleanslate.cli.runs", {}),
    "tune": ("cleanslate.cli.tune", {}),
    "worker": ("cleanslate.cli.worker", {}),
}
#: Sub-applications mounted under a name: name -> (module, attribute).
GROUPS: dict[str, tuple[str, str]] = {"slurm": ("cleanslate.cli.slurm", "slurm_app"),
                                      "sim": ("cleanslate.sim.cli", "sim_app")}

HELP = "Verify a GPU host is a clean slate, launch and benchmark inference servers, tune them."


def _root() -> None:
    """Verify a GPU host is a clean slate, launch and benchmark inference servers, tune them."""


def build_app(only: str | None = None) -> typer.Typer:
    """The command line with every command, or with ``only`` that one: a command run from the
    shell imports its own module alone (``cleanslate check`` loads neither the benchmark client
    nor Optuna), while ``--help`` and unknown names get them all."""
    app = typer.Typer(name="cleanslate", help=HELP, no_args_is_help=True,
                      add_completion=False, pretty_exceptions_enable=False)
    app.callback()(_root)  # a group even with one command: `cleanslate check` stays `check`
    for name, (module, options) in COMMANDS.items():
        if only is None or only == name:
            app.command(**options)(getattr(importlib.import_module(module), name))
    for name, (module, attribute) in GROUPS.items():
        if only is None or only == name:
            app.add_typer(getattr(importlib.import_module(module), attribute), name=name)
    return app


#: The width of ``--help`` written to a pipe or a file: rich would take 80 columns and cut the
#: defaults column (``random:input_len=1024,o…``); at this width no default of any command is
#: cut. ``$COLUMNS`` or ``$TERMINAL_WIDTH`` still decide when set; a terminal keeps its own.
HELP_PIPE_WIDTH = 160


def _help_width(argv: list[str]) -> None:
    """Widen ``--help`` that is not written to a terminal (see :data:`HELP_PIPE_WIDTH`)."""
    if "--help" not in argv or "COLUMNS" in os.environ or "TERMINAL_WIDTH" in os.environ:
        return
    try:
        if sys.stdout.isatty():
            return
    except (AttributeError, ValueError):
        pass
    import typer.rich_utils

    typer.rich_utils.MAX_WIDTH = HELP_PIPE_WIDTH


def _command_in(argv: list[str]) -> str | None:
    """The command named on a command line (its first word that is not an option), if it is
    one of :data:`COMMANDS` or :data:`GROUPS`."""
    for word in argv:
        if word.startswith("-"):
            return None  # an option of the root (--help): every command
        return word if word in COMMANDS or word in GROUPS else None
    return None


def _error(text: str) -> None:
    from rich.markup import escape  # rich only when there is something to say

    from cleanslate.cli._common import console_err

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
    _help_width(sys.argv[1:])
    try:
        build_app(_command_in(sys.argv[1:]))()
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


__all__ = ["COMMANDS", "GROUPS", "build_app", "main"]
