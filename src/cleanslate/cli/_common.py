"""Helpers shared by the command modules: consoles, option parsing, progress lines.

Exit codes are :class:`cleanslate.errors.ExitCode`; what several commands print is in
:mod:`cleanslate.cli._render`, their JSON documents in :mod:`cleanslate.cli._documents`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cleanslate.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    #: Standard output and standard error, as rich consoles (made on first use: a command
    #: that prints only JSON, such as ``check --json``, does not import rich).
    console: Console
    console_err: Console

#: The width of a console whose output is not a terminal (a file or a pipe): tables are printed
#: at their natural width (rich never widens a table to the console), not folded or cut at
#: 80 columns, which helps nobody who reads a file or greps a pipe.
PIPE_WIDTH = 1000


def _width(stream: TextIO) -> int | None:
    """``None`` (the terminal's own width) on a terminal, else :data:`PIPE_WIDTH`."""
    try:
        return None if stream.isatty() else PIPE_WIDTH
    except (AttributeError, ValueError):  # a closed or replaced stream
        return PIPE_WIDTH


def _console(name: str) -> Console:
    """The console ``name`` (``console`` or ``console_err``), made the first time."""
    made = globals().get(name)
    if made is None:
        from rich.console import Console

        stream = sys.stdout if name == "console" else sys.stderr
        made = globals()[name] = Console(stderr=name == "console_err", highlight=False,
                                         width=_width(stream))
    return made


def __getattr__(name: str) -> Any:
    """``console`` and ``console_err``, made the first time they are used."""
    if name not in ("console", "console_err"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _console(name)


def parse_int_list(value: str | None, *, option: str,
                   example: str = "0,1,2") -> list[int] | None:
    """Parse ``"0,1,3"`` into ``[0, 1, 3]``; ``None`` stays ``None``."""
    if value is None or value.strip() == "":
        return None
    out: list[int] = []
    for index, part in enumerate(value.split(",")):
        part = part.strip()
        if not part:
            raise InputError(f"item {index + 1} of {value.strip()!r} is empty", where=option,
                             hint=f"write a list like {example}")
        try:
            out.append(int(part))
        except ValueError:
            raise InputError(
                f"{part!r} is not an integer", where=option, hint=f"write a list like {example}"
            ) from None
    return out


#: The highest GPU index ``--gpus`` takes (far above any host's count).
MAX_GPU_INDEX = 1023


def parse_gpus(value: str | None, *, option: str = "--gpus") -> list[int] | None:
    """``--gpus 0,1,3`` of every command: indices 0 to :data:`MAX_GPU_INDEX`, each once (an
    :class:`InputError` naming ``option`` otherwise); ``None`` stays ``None``."""
    out = parse_int_list(value, option=option, example="0,1")
    for gpu in out or ():
        if not 0 <= gpu <= MAX_GPU_INDEX:
            raise InputError(f"GPU {gpu} is not an index: GPU indices are 0 to {MAX_GPU_INDEX}",
                             where=option, hint="write a list like 0,1")
    if out is not None and len(set(out)) < len(out):
        twice = next(g for g in out if out.count(g) > 1)
        raise InputError(f"GPU {twice} is named twice", where=option, hint="name each GPU once")
    return out


def check_writable(path: Path, *, option: str) -> None:
    """Refuse an output path that cannot be written, before the work that produces it (a
    benchmark, a study) rather than after: an :class:`InputError` naming ``option``.

    :func:`cleanslate._output_files.check_output`: the folder exists, is writable and is not
    reached through another user's link; ``path`` is missing or a regular file (not a link,
    a FIFO, a device or a folder). The write (``write_output``) checks again."""
    from cleanslate._output_files import check_output

    check_output(path, where=option)


def write_result(path: Path, text: str, *, option: str) -> None:
    """Write a result the user waited for (``bench --json``) to ``path``
    (:func:`cleanslate._output_files.write_output`, mode 0600). A target refused at the write
    keeps the data in the file the error names; when the folder itself is refused (its path
    changed during the run) the data is printed on stdout before the :class:`InputError`."""
    from cleanslate._output_files import OutputRefused, write_output

    try:
        write_output(path, text, where=option)
    except OutputRefused:
        raise
    except InputError as exc:
        sys.stdout.write(text)
        sys.stdout.flush()
        raise InputError(f"{exc.message}; the result is printed on standard output",
                         where=exc.where, hint=exc.hint) from None


def progress_printer(quiet: bool = False) -> Callable[[str], None]:
    """A progress callback that prints dim lines on stderr, as text (``quiet``: prints
    nothing, for ``--json``)."""
    def say(message: str) -> None:
        if not quiet:
            from rich.text import Text

            _console("console_err").print(Text(message, style="dim"))

    return say
