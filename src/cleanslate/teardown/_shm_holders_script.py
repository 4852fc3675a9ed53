"""Which of the named ``/dev/shm`` files a live process still maps or holds open.

A self-contained, stdlib-only script (shipped to a host's ``python3`` like
``_signal_script.py``). It matches by inode, not by name: glibc maps a POSIX semaphore under a
temporary name (``sem.XXXXXX (deleted)`` in ``/proc/PID/maps``) before linking it as
``sem.mp-*``.

Input (argv[1], JSON): ``{"dir": "/dev/shm", "names": [..]}``.
Output (stdout, JSON): ``{"held": {name: [pid, ..]}}`` for the names some process holds.
Processes whose ``/proc/PID/maps`` and ``fd`` cannot be read (another user's, without root) are
not seen.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    spec = json.loads(sys.argv[1])
    directory = spec.get("dir") or "/dev/shm"
    inodes: dict[int, str] = {}
    for name in spec["names"]:
        try:
            inodes[os.lstat(os.path.join(directory, name)).st_ino] = name
        except OSError:
            continue
    held: dict[str, list[int]] = {}
    me = os.getpid()
    prefix = directory.rstrip("/") + "/"
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        found: set[str] = set()
        try:
            with open(f"/proc/{entry}/maps") as fh:
                for line in fh:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        name = inodes.get(int(fields[4]))
                        if name:
                            found.add(name)
        except (OSError, ValueError):
            pass
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}").startswith(prefix):
                    name = inodes.get(os.stat(f"/proc/{entry}/fd/{fd}").st_ino)
                    if name:
                        found.add(name)
            except OSError:
                continue
        for name in found:
            held.setdefault(name, []).append(int(entry))
    json.dump({"held": held}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
