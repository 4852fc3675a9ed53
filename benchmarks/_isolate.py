"""Run a benchmark in private PID, network and mount namespaces (as the test suite runs).

A benchmark that starts servers and reads verdicts needs a host of its own: on a shared machine
another user's engine process, port or ``/dev/shm`` file would make its preflight refuse or its
census count strangers. :func:`reexec_isolated` re-executes the script under ``unshare`` with
``tests/_nsinit.py`` as PID 1 (loopback up; everything left ends with it).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def reexec_isolated(flag: str, who: str) -> None:
    """Re-run this script in private namespaces unless ``$flag`` says it already is; exit 2
    with the reason when it cannot (not root, no ``unshare``)."""
    if os.environ.get(flag):
        return
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        print(f"{who}: needs root and unshare: it runs in a private PID namespace, which an "
              "unprivileged run cannot make", file=sys.stderr)
        sys.exit(2)
    os.environ[flag] = "1"
    init = str(ROOT / "tests" / "_nsinit.py")
    os.execv(unshare, [unshare, "--pid", "--fork", "--mount-proc", "--net", "--mount",
                       "--propagation", "private", sys.executable, init, "--", sys.executable,
                       *sys.orig_argv[1:]])
