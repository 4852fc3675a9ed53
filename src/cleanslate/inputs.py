"""Files a user names, opened and read with bounds: never a hang, never unbounded memory.

Every file cleanslate reads from a path a user gave (a study or server file, a trace, a
ShareGPT dataset, a conversation file, a baseline) goes through :func:`read_input`:

- it is opened with ``O_NONBLOCK | O_NOCTTY`` (a FIFO nobody writes to never blocks the open,
  a terminal never becomes the controlling one), then the *opened* descriptor is checked with
  ``fstat``: anything but a regular file (a FIFO, a character or block device such as
  ``/dev/zero``, a directory, a socket), or a link to one, is an :class:`InputError` naming the
  path and what it is;
- its size is capped per kind (:data:`MAX_BYTES`, ``docs/bench.md``): a file larger than its
  kind's cap is refused from ``fstat`` before a byte is read, and the read itself stops at the
  cap plus one byte (a file that grows while it is read);
- an optional line cap stops the read as soon as the file holds more lines than a caller
  accepts (a trace's rows), without reading the rest.

Errors name the file and what was wrong with it, never its content.

:func:`interruptible` makes long synchronous preparation (reading a trace, building prompts)
answer SIGINT and SIGTERM within a moment even inside an asyncio loop, whose own handlers run
only when the loop gets control back.

Standard library and :mod:`cleanslate.errors` only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Literal

from cleanslate.errors import InputError

InputKind = Literal["yaml", "trace", "dataset", "baseline", "other"]

#: The largest file of each kind, in bytes, and why:
#:
#: - ``yaml``: a study or server file is a few kilobytes (1 MiB);
#: - ``trace``: a trace holds at most 1,000,000 rows (``MAX_NUM_PROMPTS``) of at most about
#:   1 KiB each (a Mooncake row of a 128 Ki-token prompt with its 256 block hashes) (1 GiB);
#: - ``dataset``: a ShareGPT-format JSON file (ShareGPT V3 is 642 MB; parsing it takes about
#:   5 times its size in memory) (1 GiB);
#: - ``baseline``: a saved ``check --save-baseline`` (kilobytes; 64 MiB: a host of many
#:   processes and listeners);
#: - ``other``: anything else read whole (16 MiB).
MAX_BYTES: dict[InputKind, int] = {
    "yaml": 1 << 20,
    "trace": 1 << 30,
    "dataset": 1 << 30,
    "baseline": 64 << 20,
    "other": 16 << 20,
}

#: Bytes read at a time (the line cap is checked after each).
CHUNK = 1 << 20


def _size_text(n: int) -> str:
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} bytes"


def file_type(mode: int) -> str:
    """What a ``st_mode`` is, in words (``a FIFO``, ``a character device``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _subject(file: Path, where: str | None) -> str:
    """How an error names the file: by its path when ``where`` names something else."""
    return "the file" if where is None or where == str(file) else str(file)


def _open_fd(path: Path, where: str) -> int:
    """An opened read-only descriptor of ``path``, checked to be a regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"cannot read {_subject(path, where)}: {reason}", where=where) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"cannot read {_subject(path, where)}: it is "
                             f"{file_type(info.st_mode)}, not a regular file",
                             where=where, hint="name a file (a FIFO, a device or a folder "
                             "is never read)")
        # Regular files ignore O_NONBLOCK for reads; cleared so that nothing depends on it.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_input_file(path: Path | str, *, kind: InputKind = "other",
                     where: str | None = None) -> int:
    """Refuse ``path`` unless it opens as a readable regular file within ``kind``'s size cap;
    returns its size in bytes. Reads nothing (``tune --check`` and option checks)."""
    file = Path(path)
    place = where or str(file)
    fd = _open_fd(file, place)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    _check_size(file, size, kind, place)
    return size


def _check_size(file: Path, size: int, kind: InputKind, where: str) -> None:
    cap = MAX_BYTES[kind]
    if size > cap:
        raise InputError(f"{_subject(file, where)} is larger than {_size_text(cap)} "
                         f"({size:,} bytes), the cap of a {kind} file", where=where,
                         hint="cut the file (docs/bench.md lists the caps and why)")


def read_input(path: Path | str, *, kind: InputKind = "other", where: str | None = None,
               max_lines: int | None = None, what: str = "lines") -> bytes:
    """The bytes of the regular file ``path`` (see the module docstring).

    ``where`` names the place in errors (an option, ``file:line``; default the path);
    ``max_lines``: refuse, as soon as it is read, a file holding more than this many newline
    characters (``what`` names them in the error: ``rows``)."""
    file = Path(path)
    place = where or str(file)
    cap = MAX_BYTES[kind]
    fd = _open_fd(file, place)
    try:
        _check_size(file, os.fstat(fd).st_size, kind, place)
        chunks: list[bytes] = []
        total = lines = 0
        while True:
            try:
                chunk = os.read(fd, min(CHUNK, cap + 1 - total))
            except OSError as exc:
                raise InputError(f"cannot read {_subject(file, place)}: {exc.strerror}",
                                 where=place) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                _check_size(file, total, kind, place)
            if max_lines is not None:
                lines += chunk.count(b"\n")
                if lines > max_lines:
                    raise InputError(f"{_subject(file, place)} holds more than {max_lines:,} "
                                     f"{what}",
                                     where=place, hint="cut the file")
    finally:
        os.close(fd)
    return b"".join(chunks)


def check_input_dir(path: Path | str, *, where: str | None = None) -> None:
    """Refuse ``path`` unless it is a directory whose entries (the files a library such as
    ``transformers`` will open in it) are regular files or directories: a FIFO or a device
    there would block or never end a read we do not control."""
    folder = Path(path)
    place = where or str(folder)
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise InputError(f"cannot read {_subject(folder, place)}: {exc.strerror}",
                         where=place) from None
    if not stat.S_ISDIR(info.st_mode):
        raise InputError(f"{_subject(folder, place)} is {file_type(info.st_mode)}, not a "
                         "directory",
                         where=place)
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= 10_000:
                    raise InputError(f"{_subject(folder, place)} holds more than 10,000 "
                                     "entries", where=place)
                try:
                    mode = entry.stat().st_mode  # follows links: what a reader would open
                except OSError:
                    continue  # a dangling link: the library says so if it needs the file
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise InputError(f"{folder / entry.name} is {file_type(mode)}",
                                     where=place, hint="a directory of regular files")
    except OSError as exc:
        raise InputError(f"cannot read {_subject(folder, place)}: {exc.strerror}",
                         where=place) from None


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during :func:`interruptible` preparation (a
    ``KeyboardInterrupt``: what lets a run tear down what it started and stop)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} during preparation")


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM raise :class:`Interrupted` in the main thread at once.

    For synchronous work inside an asyncio loop, whose handlers (``add_signal_handler``) run
    only when the loop gets control back: the work would hold a signal for as long as it runs.
    Only a signal whose handler is a Python function (an event loop's) is taken over; one left
    at its default or ignored keeps its disposition. The previous handlers are put back on the
    way out (the loop's wakeup descriptor still hears the signal, so its own stop is set too).
    Nested uses and other threads leave the handlers alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[signal.Signals, signal._HANDLER] = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old = signal.getsignal(sig)
            if callable(old) and old is not _raise and old is not signal.default_int_handler:
                saved[sig] = old
                signal.signal(sig, _raise)
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


__all__ = ["MAX_BYTES", "InputKind", "Interrupted", "check_input_dir", "check_input_file",
           "file_type", "interruptible", "read_input"]
