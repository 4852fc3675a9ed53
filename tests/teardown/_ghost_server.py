"""A server that leaves a ghost: ``_ghost_server.py PIDFILE SERVER-ARGV...``.

Before it becomes the server (``os.execv`` of SERVER-ARGV), it starts a grandchild that escapes
every link to the run but its cgroup: it double-forks (re-parented away from the run), calls
``setsid`` (a new session and group), renames itself (``PR_SET_NAME``) and re-executes
``sleep`` under another name with an empty environment (no ``CLEANSLATE_RUN`` marker). The
ghost's PID goes to PIDFILE.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time


def main() -> None:
    pidfile, argv = sys.argv[1], sys.argv[2:]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(15, b"ghost", 0, 0, 0)
            with open(pidfile + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(pidfile + ".tmp", pidfile)
            os.execve("/bin/sleep", ["innocent-looking", "300"], {})
        os._exit(0)
    os.wait()
    deadline = time.monotonic() + 10
    while not os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
