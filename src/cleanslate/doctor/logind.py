"""systemd-logind's ``RemoveIPC=`` as a host's files set it: systemd's precedence rules applied to
the raw files the host script read (``read_logind`` in :mod:`cleanslate.doctor._doctor_script`).
A pure function of text, tested on fixture trees.

The rules, from ``logind.conf(5)`` ("Configuration Directories and Precedence") and
``systemd.syntax(7)``:

- the main file is the first of :data:`MAIN_FILES` that exists (older systemd reads only the
  one in ``/etc``; the others do not exist there);
- drop-ins, the ``*.conf`` files of :data:`DROPIN_DIRS`, override it. A drop-in hides one of
  the same name in a folder of lower priority (``/etc`` over ``/run`` over ``/usr/local/lib``
  over ``/usr/lib``; a symlink to ``/dev/null`` masks it, and reads empty), and the drop-ins are
  applied in the lexicographic order of their names whatever their folder: the last assignment
  wins;
- in a file only the ``[Login]`` section counts; a line that starts with ``#`` or ``;`` is a
  comment; a value that is not a boolean (``1 yes y true t on``, ``0 no n false f off``, in any
  case) is ignored and the value before it kept;
- set nowhere, the compiled-in default applies: ``yes`` upstream. A distribution may build it
  otherwise (RHEL ships ``no`` since 7.3), and the vendor's main file lists the compiled-in
  defaults as comments (Debian 12's: "Entries in this file show the compile time defaults",
  then ``#RemoveIPC=yes``), so such a comment is read as the default where there is one;
- root's and system users' IPC objects are never removed. A system user is one at or below the
  ``SYSTEM_UID_MAX`` systemd was built with: its pkg-config file says it
  (``system_uid_max=``); the build takes it from ``SYS_UID_MAX`` of the build machine's
  ``/etc/login.defs``, 999 when unset. systemd does not read ``login.defs`` at run time (unless
  built with ``compat-mutable-uid-boundaries``), so the host's ``login.defs`` is the estimate
  used only when the pkg-config file is not installed.

A file that decides the value and cannot be read makes it unknown (``None``), never ``no``: an
unreadable main file or drop-in after the last assignment that was read, or a drop-in folder
that cannot be listed (its names could sort anywhere).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cleanslate.doctor.report import LogindIpc

#: Candidates for the main file, in order: the first that exists is used.
MAIN_FILES = ("/etc/systemd/logind.conf", "/run/systemd/logind.conf",
              "/usr/local/lib/systemd/logind.conf", "/usr/lib/systemd/logind.conf")
#: Drop-in folders, highest priority first.
DROPIN_DIRS = ("/etc/systemd/logind.conf.d", "/run/systemd/logind.conf.d",
               "/usr/local/lib/systemd/logind.conf.d", "/usr/lib/systemd/logind.conf.d")
#: systemd's ``SYSTEM_UID_MAX`` when nothing on the host says otherwise.
DEFAULT_SYSTEM_UID_MAX = 999
#: ``RemoveIPC=``'s compiled-in default upstream.
UPSTREAM_DEFAULT = True

_TRUE = frozenset({"1", "yes", "y", "true", "t", "on"})
_FALSE = frozenset({"0", "no", "n", "false", "f", "off"})


def parse_boolean(value: str) -> bool | None:
    """A systemd boolean (``yes``/``no`` and their synonyms, any case), ``None`` if not one."""
    word = value.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


@dataclass(frozen=True)
class Assignment:
    """One ``RemoveIPC=`` line of the ``[Login]`` section: where, as written, and its value
    (``None``: not a boolean, so systemd ignores it)."""

    path: str
    line: int
    text: str
    value: bool | None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def assignments(path: str, text: str) -> tuple[list[Assignment], Assignment | None]:
    """The ``RemoveIPC=`` assignments of one file's ``[Login]`` section, in order, and its first
    commented-out one (``#RemoveIPC=yes``: the default a vendor's file shows)."""
    found: list[Assignment] = []
    hint: Assignment | None = None
    section: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line[0] in "#;":
            body = line[1:].strip()
            key, eq, value = body.partition("=")
            if hint is None and eq and section == "Login" and key.strip() == "RemoveIPC":
                hint = Assignment(path, number, line, parse_boolean(value))
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, eq, value = line.partition("=")
        if eq and section == "Login" and key.strip() == "RemoveIPC":
            found.append(Assignment(path, number, line, parse_boolean(value)))
    return found, hint


def _entry(files: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    entry = files.get(path)
    return entry if isinstance(entry, Mapping) else {"error": "not read by the host script"}


def _why(entry: Mapping[str, Any]) -> str:
    return str(entry.get("error") or "unreadable")


def _sources(raw: Mapping[str, Any]) -> tuple[list[tuple[str, Mapping[str, Any]]], list[str]]:
    """The files systemd applies, in its order (the main file, then the drop-ins), each with
    what the host script read of it; and the drop-in folders that could not be listed, as
    ``PATH: why`` (each makes the order, and so the value, unknown)."""
    files_raw = raw.get("files")
    files: Mapping[str, Any] = files_raw if isinstance(files_raw, Mapping) else {}
    dirs_raw = raw.get("dirs")
    dirs: Mapping[str, Any] = dirs_raw if isinstance(dirs_raw, Mapping) else {}
    order: list[tuple[str, Mapping[str, Any]]] = []
    for path in MAIN_FILES:
        entry = _entry(files, path)
        if not entry.get("missing"):
            order.append((path, entry))  # the first that exists, readable or not
            break
    unlisted: list[str] = []
    chosen: dict[str, str] = {}
    for folder in DROPIN_DIRS:
        listing = dirs.get(folder)
        if not isinstance(listing, Mapping):
            unlisted.append(f"{folder}: not read by the host script")
            continue
        if listing.get("missing"):
            continue
        names = listing.get("names")
        if not isinstance(names, list):
            unlisted.append(f"{folder}: {_why(listing)}")
            continue
        if listing.get("truncated"):
            unlisted.append(f"{folder}: {listing['truncated']} drop-ins, more than were read")
        for name in names:
            if isinstance(name, str) and name.endswith(".conf"):
                chosen.setdefault(name, f"{folder}/{name}")
    for name in sorted(chosen):
        entry = _entry(files, chosen[name])
        if not entry.get("missing"):  # listed, then gone (or a dangling symlink): not applied
            order.append((chosen[name], entry))
    return order, unlisted


def _remove_ipc(raw: Mapping[str, Any]) -> tuple[bool | None, str, str | None, tuple[str, ...]]:
    """(value, where it came from, why it is unknown, the files in systemd's order)."""
    order, unlisted = _sources(raw)
    last: Assignment | None = None
    ignored: Assignment | None = None
    unreadable: list[str] = []  # files after the last assignment read that could not be read
    for path, entry in order:
        if "text" not in entry:
            unreadable.append(f"{path}: {_why(entry)}")
            continue
        for a in assignments(path, str(entry["text"]))[0]:
            if a.value is None:
                ignored = a
                continue
            last, ignored, unreadable = a, None, []
    read = tuple(path for path, _ in order)
    if unlisted or unreadable:
        why = "; ".join([*unlisted, *unreadable])
        return None, f"RemoveIPC= cannot be told: {why}", why, read
    note = f" ({ignored} ignored: not a boolean)" if ignored is not None else ""
    if last is not None:
        return last.value, f"{last}{note}", None, read
    hint = _default_hint(raw)
    where = ("RemoveIPC= not set in " + (", ".join(read) if len(read) <= 3
                                           else f"any of the {len(read)} files")
             if read else "no logind.conf and no drop-in")
    if hint is not None and hint.value is not None:
        return hint.value, (f"{where}: systemd's compiled-in default applies, "
                            f"{'yes' if hint.value else 'no'} as {hint} shows{note}"), None, read
    return UPSTREAM_DEFAULT, (f"{where}: systemd's compiled-in default applies, yes "
                              f"upstream (logind.conf(5)){note}"), None, read


def _default_hint(raw: Mapping[str, Any]) -> Assignment | None:
    """The first commented-out ``RemoveIPC=`` of the main-file candidates, in their order."""
    files = raw.get("files") if isinstance(raw.get("files"), Mapping) else {}
    assert isinstance(files, Mapping)
    for path in MAIN_FILES:
        entry = files.get(path)
        if isinstance(entry, Mapping) and "text" in entry:
            hint = assignments(path, str(entry["text"]))[1]
            if hint is not None:
                return hint
    return None


def system_uid_max(raw: Mapping[str, Any]) -> tuple[int, str]:
    """systemd's system-user boundary and where it came from: its pkg-config file, else
    ``SYS_UID_MAX`` of ``/etc/login.defs`` (the last line that sets it), else 999."""
    pcs = raw.get("systemd_pc")
    for path, entry in (pcs.items() if isinstance(pcs, Mapping) else ()):
        if isinstance(entry, Mapping) and "text" in entry:
            for number, line in enumerate(str(entry["text"]).splitlines(), 1):
                found = re.fullmatch(r"\s*system_uid_max=(\d+)\s*", line)
                if found:
                    return int(found.group(1)), (f"{path}:{number}: {line.strip()} (the "
                                                 "boundary systemd was built with)")
    defs = raw.get("login_defs")
    best: tuple[int, str] | None = None
    if isinstance(defs, Mapping) and "text" in defs:
        for number, line in enumerate(str(defs["text"]).splitlines(), 1):
            found = re.match(r"\s*SYS_UID_MAX\s+(\d+)\b", line)
            if found:
                best = int(found.group(1)), (
                    f"/etc/login.defs:{number}: {line.strip()} (systemd's pkg-config file is "
                    "not installed: the value systemd's build takes by default)")
    if best is not None:
        return best
    why = ("not set in /etc/login.defs" if isinstance(defs, Mapping) and "text" in defs
           else "/etc/login.defs " + ("missing" if isinstance(defs, Mapping)
                                      and defs.get("missing") else "unreadable"))
    return DEFAULT_SYSTEM_UID_MAX, (f"SYS_UID_MAX {why} and systemd's pkg-config file not "
                                    f"installed: {DEFAULT_SYSTEM_UID_MAX}, systemd's default")


def logind_state(raw: Mapping[str, Any], pids: Any) -> tuple[bool | None, str]:
    """Whether systemd-logind runs here, or would be started (PID 1 is systemd, which starts it
    on the first login), and why; ``None`` when neither could be read (``hidepid``)."""
    if isinstance(pids, list) and pids:
        return True, f"systemd-logind runs (pid {', '.join(str(p) for p in pids[:4])})"
    comm = raw.get("pid1_comm")
    pid1 = str(comm["text"]).strip() if isinstance(comm, Mapping) and "text" in comm else None
    if not isinstance(pids, list):
        return None, f"whether systemd-logind runs could not be read: /proc: {pids}"
    if pid1 == "systemd":
        return True, ("PID 1 is systemd, which starts systemd-logind with the first login "
                      "(none runs now)")
    if pid1 is None:
        why = _why(comm) if isinstance(comm, Mapping) else "not read"
        return None, (f"no systemd-logind process seen, and /proc/1/comm unreadable ({why}): "
                      "whether one runs is unknown")
    return False, f"no systemd-logind process, and PID 1 is {pid1!r}, not systemd"


def logind_ipc(raw: Any, pids: Any) -> LogindIpc | None:
    """The host script's ``env.logind`` (and ``env.logind_pids``) as a :class:`LogindIpc`;
    ``None`` when the script did not read it."""
    if not isinstance(raw, Mapping):
        return None
    value, setting, unknown, files = _remove_ipc(raw)
    uid_max, uid_max_source = system_uid_max(raw)
    logind, logind_evidence = logind_state(raw, pids)
    uid = raw.get("uid")
    user = raw.get("user")
    return LogindIpc(
        remove_ipc=value, setting=setting, unknown=unknown, files=files,
        uid=uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
        user=user if isinstance(user, str) else None, system_uid_max=uid_max,
        system_uid_max_source=uid_max_source, logind=logind, logind_evidence=logind_evidence)


__all__ = ["DROPIN_DIRS", "MAIN_FILES", "Assignment", "assignments", "logind_ipc",
           "logind_state", "parse_boolean", "system_uid_max"]
