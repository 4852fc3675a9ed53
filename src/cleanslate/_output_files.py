"""Files cleanslate writes on this machine: never through a link someone else planted, never
half-written, never readable by others unless they are meant to be.

Every output (``bench --json``, ``check --save-baseline``, ``report --html/--out/--png``, the
Slurm script) goes through :func:`write_output`:

1. The target's folder is opened one component at a time from ``/`` with ``O_NOFOLLOW``
   (``openat``). A symbolic link on the way is followed only when this user or root owns it
   and it has one name (a hard link to a root-owned link, made by another user, is refused):
   a link the user made (``/tmp -> /private/tmp``, ``~/data -> /mnt/data``) is the user's
   choice; one another user planted (``/tmp/shared -> /etc`` in a world-writable folder) is
   refused. The folder itself is then held open: what happens to its path later changes
   nothing.
2. The target in that folder must be missing or a regular file. A symbolic link (whoever owns
   it), a FIFO, a device, a socket or a folder is an :class:`~cleanslate.errors.InputError`
   (exit 2) naming the path and what it is. The check runs before the work when the command
   knows its outputs up front (:func:`check_output`), and again at the write.
3. The data goes to a new file in the same folder (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode
   0600), is flushed to disk, gets its final mode and is renamed over the target: a reader sees
   the old file or the new one, never a part. ``rename`` replaces a link rather than following
   it, so a link planted between the last check and the rename is replaced, not written
   through.
4. The target is checked again once the data is on disk: one that turned into a link (or
   anything not a regular file) while the work ran is refused, and the result is kept in the
   temporary file (mode 0600, in the target's folder) that the error names
   (:class:`OutputRefused`): a long benchmark is not lost. A folder refused at the write (its
   path changed under the run) has no safe place for the data: the caller keeps it (``bench``
   prints it on stdout).

Modes: :data:`PRIVATE_MODE` (0600) for everything that may carry text from a server, a host or
the store (a benchmark's endpoint URL and the server's error words, a baseline's process list,
exports and the HTML page with launch commands and environments, the Slurm script);
:data:`SHARED_MODE` (0644, less the umask) only for the plots. An existing target's mode is not
kept: the file is replaced.

Standard library only (and :mod:`cleanslate.errors`): every room may use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from cleanslate.errors import InputError

#: Mode of an output that may hold another party's text (see the module docstring).
PRIVATE_MODE = 0o600
#: Mode of an output meant to be shared (plots), before the umask.
SHARED_MODE = 0o644
#: Mode of a folder :func:`make_output_folder` creates, before the umask.
FOLDER_MODE = 0o755
#: Symbolic links followed while resolving one folder, as the kernel's own limit.
MAX_LINKS = 40

# O_PATH: a folder is reached with search permission only (a home folder of mode 0711).
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HINT = ("remove it or choose another file name: cleanslate never writes through a symbolic "
         "link, nor into a FIFO, a device or a folder")


class OutputRefused(InputError):
    """An output refused at the write, after the work: ``kept`` is where the result is."""

    def __init__(self, message: str, *, where: str | None, kept: Path) -> None:
        self.kept = kept
        super().__init__(f"{message}; the result is kept in {kept} (mode 0600)", where=where,
                         hint=_HINT)


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` is, in words (``a FIFO``, ``a symbolic link``...)."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def _trusted_link(info: os.stat_result) -> bool:
    return info.st_uid in (os.geteuid(), 0) and info.st_nlink == 1


def _open_folder(folder: Path, *, where: str | None, create: int | None = None,
                 target: Path | None = None) -> int:
    """A descriptor of ``folder`` reached without following a link that is not trusted (see
    the module docstring); ``create``: the mode of the missing folders to make on the way.
    The caller closes it. An :class:`InputError` says what is wrong and where (``target``:
    the output named first in messages other than a refusal)."""
    shown = Path(os.path.abspath(folder))

    def fail(text: str, hint: str | None = None) -> InputError:
        return InputError(f"cannot write {target}: {text}" if target else text, where=where,
                          hint=hint)

    todo = [p for p in str(shown).split("/") if p]
    todo.reverse()  # a stack: the next component last
    fd = os.open("/", _DIR_FLAGS)
    here = Path("/")  # the logical path reached, for messages
    links = 0
    try:
        while todo:
            part = todo.pop()
            if part == ".":
                continue
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create is None:
                    raise fail(f"the folder {here / part} does not exist",
                               hint="create the folder first") from None
                try:
                    os.mkdir(part, create, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened (and checked) below
                except OSError as exc:
                    raise fail(f"cannot create the folder {here / part}: "
                               f"{exc.strerror or exc}") from None
                todo.append(part)
                continue
            except OSError as exc:
                try:
                    info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    raise fail(f"cannot open the folder {here / part}: "
                               f"{exc.strerror or exc}") from None
                if not stat.S_ISLNK(info.st_mode):
                    if stat.S_ISDIR(info.st_mode):
                        raise fail(f"cannot open the folder {here / part}: "
                                   f"{exc.strerror or exc}") from None
                    raise fail(f"{here / part} is {kind_of(info.st_mode)}, not a folder") \
                        from None
                if not _trusted_link(info):
                    why = (f"owned by {_user(info.st_uid)}" if info.st_nlink == 1
                           else f"with {info.st_nlink} names (a hard link to another's link)")
                    raise InputError(
                        f"refused: {here / part} is a symbolic link {why}, neither you "
                        "nor root: another user may have planted it",
                        where=where,
                        hint=f"write to the real folder ({os.path.realpath(here / part)}) "
                             "if you trust it, or to a folder you own") from None
                links += 1
                if links > MAX_LINKS:
                    raise fail(f"{shown}: more than {MAX_LINKS} symbolic links") from None
                points_to = os.readlink(part, dir_fd=fd)
                again = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if (again.st_ino, again.st_dev) != (info.st_ino, info.st_dev):
                    raise InputError(f"refused: the symbolic link {here / part} was replaced "
                                     "while it was read", where=where) from None
                todo.extend(reversed([p for p in points_to.split("/") if p]))
                if points_to.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                    here = Path("/")
                continue
            os.close(fd)
            fd = nxt
            here = here.parent if part == ".." else here / part
        return fd
    except BaseException:
        os.close(fd)
        raise


def _target_problem(dir_fd: int, name: str, path: Path) -> str | None:
    """Why ``name`` in the folder ``dir_fd`` cannot be replaced by an output: it is a link or
    not a regular file. ``None`` when it is missing or a regular file."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if stat.S_ISREG(info.st_mode):
        return None
    what = kind_of(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        with contextlib.suppress(OSError):
            what += f" (to {os.readlink(name, dir_fd=dir_fd)!r}, owned by {_user(info.st_uid)})"
    return f"refused: {path} is {what}, not a regular file"


def _sticky_owner(dir_fd: int, name: str) -> str | None:
    """The owner of ``name`` when the folder's sticky bit keeps this user from replacing it
    (another user's file in ``/tmp``; root may), else ``None``."""
    euid = os.geteuid()
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        folder = os.fstat(dir_fd)
    except OSError:
        return None
    if euid == 0 or info.st_uid == euid or folder.st_uid == euid or \
            not folder.st_mode & stat.S_ISVTX:
        return None
    return _user(info.st_uid)


def _split(path: Path | str, where: str | None) -> tuple[Path, str]:
    path = Path(path)
    name = path.name
    if not name or name in (".", ".."):
        raise InputError(f"{path} names no file", where=where, hint="give a file name")
    return path, name


def check_output(path: Path | str, *, where: str | None) -> None:
    """Refuse, before any work, an output the write would refuse: a folder that is missing,
    not writable or reached through another user's link, or a target that is a link or not a
    regular file (:class:`InputError`, exit 2). Opens nothing but folders; never blocks."""
    path, name = _split(path, where)
    fd = _open_folder(path.parent, where=where, target=path)
    try:
        problem = _target_problem(fd, name, path)
        if problem is not None:
            raise InputError(problem, where=where, hint=_HINT)
        held = f"/proc/self/fd/{fd}"  # the folder opened, not its path again
        if not os.access(held if os.path.exists(held) else path.parent, os.W_OK | os.X_OK):
            raise InputError(f"cannot write {path}: no permission to write in its folder",
                             where=where, hint="choose a folder you can write to")
        owner = _sticky_owner(fd, name)
        if owner is not None:
            raise InputError(f"cannot replace {path}: it is {owner}'s, in a folder with the "
                             "sticky bit (only its owner may replace it)", where=where,
                             hint="choose another file name")
    finally:
        os.close(fd)


def check_output_folder(path: Path | str, *, where: str | None,
                        target: Path | None = None) -> None:
    """Refuse, before any work, a folder output (``report --png DIR``, or the folder of a file
    output ``target``) that is not a folder or is reached through another user's link; a
    missing one is fine if its nearest existing folder is (it is made at the write)."""
    path = Path(os.path.abspath(path))
    missing = path
    while not os.path.lexists(missing) and missing != missing.parent:
        missing = missing.parent
    os.close(_open_folder(missing, where=where, target=target or path))


def make_output_folder(path: Path | str, *, where: str | None, mode: int = FOLDER_MODE) -> None:
    """Make ``path`` and its missing parents (``mode`` less the umask), following only trusted
    links (see the module docstring)."""
    os.close(_open_folder(Path(path), where=where, create=mode, target=Path(path)))


def planted_link(path: Path | str) -> str | None:
    """Why ``path`` is reached through a symbolic link that neither this user nor root owns
    (in its folders, or the file itself), or ``None``: the rule of :func:`write_output` for a
    file that something else creates (a SQLite store). Never raises."""
    path = Path(os.path.abspath(path))
    try:
        fd = _open_folder(path.parent, where=None)
    except InputError as exc:
        return exc.message.removeprefix("refused: ") if exc.message.startswith("refused") \
            else None
    except OSError:
        return None
    try:
        info = os.stat(path.name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)
    if stat.S_ISLNK(info.st_mode) and not _trusted_link(info):
        return (f"{path} is a symbolic link owned by {_user(info.st_uid)}, neither you nor "
                "root: another user may have planted it")
    return None


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_output(path: Path | str, data: str | bytes, *, where: str | None,
                 mode: int = PRIVATE_MODE) -> Path:
    """Write ``data`` (``str``: UTF-8) to ``path`` through a temporary file and a rename (see
    the module docstring); ``mode`` is the file's mode (:data:`SHARED_MODE` less the umask).
    Returns ``path``. A refused target or folder, or a failed write (a full disk), is an
    :class:`InputError` naming ``where``; a target that is a link or not a regular file is an
    :class:`OutputRefused` naming the temporary file that holds the data."""
    path, name = _split(path, where)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if mode != PRIVATE_MODE:
        mode &= ~_umask()
    folder = _open_folder(path.parent, where=where, target=path)
    try:
        tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
        kept = Path(os.path.abspath(path.parent)) / tmp
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, PRIVATE_MODE, dir_fd=folder)
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}", where=where,
                             hint="choose a folder you can write to") from None
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
            # Checked once the data is safe: a target refused now keeps the data in ``tmp``.
            problem = _target_problem(folder, name, path)
            if problem is None:
                os.fchmod(fd, mode)
        except OSError as exc:
            os.close(fd)
            os.unlink(tmp, dir_fd=folder)
            raise InputError(f"cannot write {path}: {exc.strerror or exc}", where=where) \
                from None
        os.close(fd)
        if problem is not None:
            raise OutputRefused(problem, where=where, kept=kept)
        try:
            os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as exc:
            raise OutputRefused(f"cannot replace {path}: {exc.strerror or exc}", where=where,
                                kept=kept) from None
        return path
    finally:
        os.close(folder)


__all__ = ["FOLDER_MODE", "MAX_LINKS", "PRIVATE_MODE", "SHARED_MODE", "OutputRefused",
           "check_output", "check_output_folder", "kind_of", "make_output_folder",
           "planted_link", "write_output"]
