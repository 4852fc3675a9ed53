"""Files cleanslate acts on: whether another user could have written them, and reads that
follow no link out of a folder.

Two rules, for the two ways a file can lie about where it came from:

- :func:`untrusted` says why a file or folder that directs cleanslate (a SQLite store, the
  artifacts folder beside it, a baseline) cannot be trusted, as OpenSSH refuses a key file: it
  is owned by another user (not this one, not root), or writable by its group or by others, or
  the folder holding it (or one above) lets another user replace it (owned by another user, or
  writable by group or others without the sticky bit), or it is named through a symbolic link
  that another user owns. ``None`` when it can be trusted (for a missing path: when no other
  user could replace a file made there; the caller says what a missing file means).
- :func:`open_under` opens a file below a folder (``root``) without following any symbolic link
  below that folder: the folder is resolved with ``realpath`` (it is the caller's own, a link to
  it is the user's choice), every component below it is opened with ``O_NOFOLLOW`` from the one
  above (``openat``: nothing can be swapped between a check and the open), and the file must be
  a regular file with one link, owned by this user or root. Anything else is a
  :class:`PermissionError` saying why; a missing file is :class:`FileNotFoundError`.

:func:`remote_source` is this module as a script for a remote host's ``python3``
(:meth:`cleanslate.hosts.ssh.SSHExecutor.read_file` with ``under``).

Standard library only: ``check`` uses it before any database stack is imported.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Exit status of :func:`remote_source` for a missing file, and for a refused one.
MISSING_STATUS = 44
REFUSED_STATUS = 45


def _user(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` when the user has no name here."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _folder_problem(folder: Path) -> str | None:
    """Why ``folder`` or one above it lets another user replace what it holds, or ``None``."""
    for current in (folder, *folder.parents):
        try:
            info = current.stat()
        except OSError:
            continue  # the caller's open says what is missing or unreadable
        mode = stat.S_IMODE(info.st_mode)
        if not _trusted_owner(info.st_uid):
            return (f"the folder {current} is owned by {_user(info.st_uid)}, who can replace "
                    "what it holds")
        if mode & 0o022 and not mode & stat.S_ISVTX:
            who = "others" if mode & 0o002 else "its group"
            return (f"the folder {current} is writable by {who} (mode {mode:04o}) without the "
                    "sticky bit: they can replace what it holds")
    return None


def untrusted(path: Path | str, *, folder: bool = False) -> str | None:
    """Why the file (or, with ``folder``, the folder) ``path`` cannot be trusted to direct
    cleanslate, or ``None`` (see the module docstring). For a path that does not exist: why a
    file made there could be replaced by another user (the folders above it). Never raises."""
    path = Path(path).absolute()
    try:
        named = path.lstat()
    except OSError:
        return _folder_problem(Path(os.path.realpath(path.parent)))
    real = Path(os.path.realpath(path))
    what = "folder" if folder else "file"
    if stat.S_ISLNK(named.st_mode) and not _trusted_owner(named.st_uid):
        return (f"{path} is a symbolic link owned by {_user(named.st_uid)}, not by you "
                f"({_user(os.geteuid())})")
    try:
        info = real.stat()
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    if not _trusted_owner(info.st_uid):
        shown = f"{path} (-> {real})" if real != path else str(path)
        return (f"the {what} {shown} is owned by {_user(info.st_uid)}, not by you "
                f"({_user(os.geteuid())}): another user may have planted it")
    if mode & 0o022:
        who = "others" if mode & 0o002 else "its group"
        return f"the {what} {path} is writable by {who} (mode {mode:04o})"
    holders = {Path(os.path.realpath(path.parent)), real.parent}
    for holder in sorted(holders):
        problem = _folder_problem(holder)
        if problem is not None:
            return problem
    return None


def _parts_below(root: str, path: str) -> list[str]:
    """The components of ``path`` below ``root`` (both taken lexically, relative paths from the
    current folder); a :class:`PermissionError` when ``path`` is not below ``root``."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    parts = rel.split(os.sep)
    if rel in (".", "") or parts[0] == ".." or any(p in ("", ".", "..") for p in parts):
        raise PermissionError(f"{path} is not a file under {root}")
    return parts


def open_under(root: str, path: str) -> int:
    """A read-only descriptor of ``path``, which must lie under ``root`` with no symbolic link
    below ``root`` (see the module docstring). The caller closes it."""
    parts = _parts_below(root, path)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(os.path.realpath(root), flags | os.O_DIRECTORY)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            try:
                nxt = os.open(part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY),
                              dir_fd=fd)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                try:
                    linked = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    linked = False
                if linked:
                    raise PermissionError(f"{path}: {part} is a symbolic link, which is not "
                                          "followed") from None
                raise
            os.close(fd)
            fd = nxt
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PermissionError(f"{path} is not a regular file")
        if not _trusted_owner(info.st_uid):
            raise PermissionError(f"{path} is owned by {_user(info.st_uid)}, not by this user")
        if info.st_nlink != 1:
            raise PermissionError(f"{path} has {info.st_nlink} hard links (a link to another "
                                  "file)")
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_under(root: str, path: str, *, max_bytes: int, tail: bool = False) -> bytes:
    """At most ``max_bytes`` of ``path`` (the last ones with ``tail``), opened with
    :func:`open_under`."""
    fd = open_under(root, path)
    with open(fd, "rb") as fh:
        if tail:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
        return fh.read(max_bytes)


def _main() -> None:
    """The script a remote host runs (:func:`remote_source`): ``ROOT PATH MAX_BYTES TAIL``."""
    import sys

    root, path, size, tail = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    try:
        data = read_under(root, path, max_bytes=size, tail=tail)
    except FileNotFoundError:
        sys.exit(MISSING_STATUS)
    except OSError as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(REFUSED_STATUS)
    sys.stdout.buffer.write(data)


def remote_source() -> str:
    """This module as a script for a host's ``python3 -I -S -c``, with arguments ``ROOT PATH
    MAX_BYTES TAIL(0/1)``: the bytes on stdout; exit :data:`MISSING_STATUS` for a missing file,
    :data:`REFUSED_STATUS` (the reason on stderr) for one refused or unreadable."""
    return Path(__file__).read_text(encoding="utf-8") + "\n_main()\n"


__all__ = ["open_under", "read_under", "remote_source", "untrusted"]
