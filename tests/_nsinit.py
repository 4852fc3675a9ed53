"""PID 1 of the test session's private namespaces (see :mod:`tests._isolation`).

Usage: ``_nsinit.py -- COMMAND...``. Brings the namespace's loopback up, mounts a private tmpfs
on ``/dev/shm``, starts COMMAND (pytest), forwards SIGINT/SIGTERM/SIGHUP to it, reaps every
process that is re-parented here, and exits with COMMAND's exit status. As PID 1 of the PID
namespace, its exit makes the kernel end every process still in the namespace.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    """``ip link set lo up`` without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def private_shm() -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs",
                    "/dev/shm"], check=True)


def run_as_init(argv: list[str], started: Callable[[int], None] | None = None) -> int:
    """Be PID 1 of a namespace: start ``argv``, pass SIGINT, SIGTERM and SIGHUP on to it,
    reap every orphan, and return its exit code (128 + N for a signal N) once it ends;
    ``started`` is told its PID. When this returns, the kernel ends what is left."""
    child = os.fork()
    if child == 0:
        os.execv(argv[0], argv)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    if started is not None:
        started(child)
    code = 1
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            break
    return code if code >= 0 else 128 - code


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    loopback_up()
    private_shm()
    os.environ["CLEANSLATE_TEST_ISOLATED"] = "isolated"
    return run_as_init(argv)


if __name__ == "__main__":
    sys.exit(main())
