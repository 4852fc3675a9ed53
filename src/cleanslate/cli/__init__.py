"""The ``cleanslate`` command line (typer + rich).

Exit codes everywhere: 0 clean / success, 1 dirty / failed, 2 usage or input error, 3 unknown.
Each command lives in its own module of this package and registers itself on :data:`app`.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from cleanslate.cli._common import EXIT_INPUT, console_err
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


def main() -> None:
    """Console-script entry point: runs the app, turning input errors into exit code 2."""
    try:
        app()
    except InputError as exc:
        console_err.print(f"[bold red]error:[/] {escape(exc.render())}", highlight=False,
                          soft_wrap=True)
        sys.exit(EXIT_INPUT)
