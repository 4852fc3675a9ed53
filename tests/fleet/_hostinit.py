"""PID 1 of one fleet test host (see :mod:`tests.fleet.hosts`).

Usage: ``_hostinit.py --bind SRC:DST ... --shm --decoy SPEC.json --ready FILE -- SSHD ARGV...``,
run by ``unshare --pid --fork --mount-proc`` so that it is PID 1 of a fresh PID namespace with
its own ``/proc`` and mount namespace. It

- bind-mounts each ``SRC`` on ``DST`` (the host's own simulated GPU ledger on the path every
  host and the client call the ledger, as separate machines have the same path with different
  contents), and mounts a private tmpfs on ``/dev/shm`` with ``--shm``;
- starts the decoy of ``SPEC.json`` when given (a process that no cleanslate run started);
- starts sshd, writes ``{"init": 1, "sshd": PID, "decoy": PID}`` (PIDs in this namespace) to
  ``--ready``, reaps every process re-parented here (run supervisors daemonize), forwards
  SIGTERM, SIGINT and SIGHUP to sshd, and exits when sshd exits. Its exit makes the kernel end
  every process still in the namespace, the decoy included.

Standard library only; Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests._nsinit import run_as_init


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def start_decoy(spec_path: str) -> int:
    """Start the decoy described in ``spec_path``: ``{"argv0": ..., "python": ..., "source":
    ..., "env": {...}}``; its script is read from stdin so that its command line is ``argv0``
    alone, as a process that called ``setproctitle`` shows it."""
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write)
        os.dup2(read, 0)
        os.close(read)
        os.setsid()  # its own session: nothing of sshd's, as a server started by hand
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **spec.get("env", {})}
        os.execve(spec["python"], [spec["argv0"]], env)
    os.close(read)
    with os.fdopen(write, "w", encoding="utf-8") as fh:
        fh.write(spec["source"])
    return pid


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--shm", action="store_true")
    parser.add_argument("--decoy")
    parser.add_argument("--ready", required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    for pair in args.bind:
        src, dst = pair.split(":", 1)
        mount("--bind", src, dst)
    if args.shm:
        mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    decoy = start_decoy(args.decoy) if args.decoy else None

    def started(sshd: int) -> None:
        tmp = args.ready + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"init": os.getpid(), "sshd": sshd, "decoy": decoy}, fh)
        os.replace(tmp, args.ready)

    return run_as_init(argv, started)


if __name__ == "__main__":
    sys.exit(main())
