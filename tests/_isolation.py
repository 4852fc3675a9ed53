"""Run the whole test session on a quiet host: private PID, network and mount namespaces.

The integration tests start engines, probe the host and expect a verdict. Another user's server,
another test run, or a stray ``/dev/shm`` file on a shared machine would make those verdicts
DIRTY for reasons that have nothing to do with the code under test. So, where the machine allows
it (root, a working ``unshare``, no NVIDIA GPU whose processes must be seen with the host's PIDs),
this plugin re-executes pytest inside fresh namespaces before anything else happens:

- a PID namespace with its own ``/proc`` (``--mount-proc``): only the session's processes exist;
- a network namespace with its own loopback: no other listener on any port;
- a mount namespace with a private ``/dev/shm`` (tmpfs): no other process's leftovers.

:mod:`tests._nsinit` is PID 1 there: it reaps orphans (the run supervisors daemonize) and, when
pytest exits, its exit ends every process left in the namespace, so nothing a test started can
outlive the session.

It is loaded with ``-p tests._isolation`` (pyproject's ``addopts``), i.e. before pytest captures
output, and acts at import time. ``CLEANSLATE_TEST_ISOLATION=0`` turns it off; then the tests that
need a quiet host check for one and skip with the reason when it is not (``quiet_host`` in
``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: ``0`` runs the session on the host as it is.
SWITCH_ENV = "CLEANSLATE_TEST_ISOLATION"
#: Set inside the namespaces (to the reason text "isolated"), or to why the session is not.
STATE_ENV = "CLEANSLATE_TEST_ISOLATED"

UNSHARE_FLAGS = ("--pid", "--fork", "--mount-proc", "--net", "--mount", "--propagation",
                 "private")


def why_not_isolated() -> str | None:
    """Why this session cannot run in private namespaces (``None``: it can)."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return f"turned off ({SWITCH_ENV}=0)"
    if os.geteuid() != 0:
        return "not root (unshare of PID, network and mount namespaces needs it)"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "unshare (util-linux) is not installed"
    if os.path.exists("/dev/nvidiactl"):
        return "an NVIDIA GPU is present: GPU tests must see the host's PIDs"
    try:
        probe = subprocess.run([unshare, *UNSHARE_FLAGS, "true"], capture_output=True,
                               timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare failed: {exc}"
    if probe.returncode != 0:
        return "unshare failed: " + probe.stderr.decode(errors="replace").strip()[:200]
    return None


def _reexec() -> None:
    if os.environ.get(STATE_ENV):
        return  # inside already, or decided earlier in this session
    reason = why_not_isolated()
    if reason is not None:
        os.environ[STATE_ENV] = "no: " + reason
        return
    unshare = shutil.which("unshare")
    assert unshare is not None
    here = os.path.dirname(os.path.abspath(__file__))
    init = os.path.join(here, "_nsinit.py")
    argv = [sys.executable, *sys.orig_argv[1:]]
    print("tests run in private PID, network and mount namespaces (a quiet host); "
          f"{SWITCH_ENV}=0 runs them on the host as it is", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(unshare, [unshare, *UNSHARE_FLAGS, sys.executable, init, "--", *argv])


_reexec()
