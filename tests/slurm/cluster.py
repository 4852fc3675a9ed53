"""A real one-node Slurm for tests: ``munged``, ``slurmctld`` and ``slurmd`` in a temporary folder.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them) run as root here with
everything of their own under one folder: a generated munge key and socket, a ``slurm.conf``
with ``select/cons_tres`` and ``proctrack/linuxproc`` on free ports of 127.0.0.1, and four fake
GPUs as generic resources. Slurm accepts only character devices as GPU files, so each fake GPU
is a device node made with ``mknod`` (major 1, minor 3: what ``/dev/null`` is); nothing opens
them. With them Slurm allocates GPUs the way it does on a GPU node: a ``--gres=gpu:1`` task
gets ``CUDA_VISIBLE_DEVICES`` and ``SLURM_JOB_GPUS``, and two tasks never get the same GPU.

:func:`start_cluster` returns a :class:`SlurmCluster`; :meth:`SlurmCluster.stop` cancels the
cluster's jobs, waits for them to end, and ends the three daemons by PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests._kit import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")


def slurm_missing() -> str | None:
    """Why a real Slurm cannot run here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "a private Slurm needs root (its daemons, mknod)"
    for name in DAEMONS:
        if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists():
            return f"{name} is not installed (apt-get install slurm-wlm munge)"
    for name in (*CLIENTS, "ip"):
        if shutil.which(name) is None:
            return f"{name} is not installed (apt-get install slurm-wlm iproute2)"
    return None


#: An address of the benchmarking range (RFC 2544) put on the loopback device of a private
#: network namespace: Slurm resolves names with AI_ADDRCONFIG, which finds nothing while the
#: namespace has no address other than 127.0.0.1 and ::1, so no daemon could bind.
NAMESPACE_ADDRESS = "198.18.0.1/32"


def ensure_routable_address(private_namespace: bool) -> str | None:
    """Give a private network namespace's loopback a non-loopback address (see
    :data:`NAMESPACE_ADDRESS`) when it has none. Outside a private namespace nothing is
    changed; the reason Slurm cannot start is returned instead when there is no such address."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                         check=False).stdout
    addresses = [line.split()[3] for line in out.splitlines() if len(line.split()) > 3]
    if any(not a.startswith(("127.", "::1/")) for a in addresses):
        return None
    if not private_namespace:
        return "this host has no address but loopback, which Slurm cannot bind"
    subprocess.run(["ip", "addr", "add", NAMESPACE_ADDRESS, "dev", "lo"], check=True)
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class SlurmCluster:
    root: Path
    node: str
    gpus: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, a test) needs to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def jobs(self) -> list[str]:
        """``JOBID STATE`` lines of the jobs this cluster still knows (array tasks apart)."""
        out = self.run("squeue", "--noheader", "--array", "--format=%i %T").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_idle(self, timeout: float = 120) -> bool:
        """Wait until no job is pending or running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.jobs():
                return True
            time.sleep(0.5)
        return False

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Cancel this cluster's jobs, wait for them, then end the daemons (by PID)."""
        with contextlib.suppress(Exception):
            if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
                self.run("scancel", "--full", "--user", "root")
                self.wait_idle(30)
        for name in reversed(DAEMONS):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_cluster(root: Path, *, gpus: int = 4, cpus: int | None = None,
                  timeout: float = 30) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under ``root`` and wait until the node is idle. The
    node says it has ``cpus`` CPUs (default 4, whatever the machine has) and ``gpus`` GPUs."""
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for i in range(gpus):
        device = root / f"gpu{i}"
        if not device.exists():
            os.mknod(device, 0o600 | 0o020000, os.makedev(1, 3))  # a character device
    node = socket.gethostname().split(".")[0]
    cpus = cpus or 4
    sock = root / "munge" / "munge.sock"
    (root / "slurm.conf").write_text("\n".join([
        "ClusterName=cleanslate-test",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={sock}",
        "CredType=cred/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        # The node's CPUs as written here, not as counted: tasks need a CPU each to be
        # scheduled, and the workers mostly wait on their servers.
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        # Listen on 127.0.0.1, not on any address: in a network namespace with only a loopback
        # device, resolving "any address" fails (getaddrinfo with AI_ADDRCONFIG).
        "CommunicationParameters=NoInAddrAny",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "KillWait=5",
        "GresTypes=gpu",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 Gres=gpu:{gpus} "
        "State=UNKNOWN",
        f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ]))
    (root / "gres.conf").write_text(f"Name=gpu File={root}/gpu[0-{gpus - 1}]\n")
    cluster = SlurmCluster(root=root, node=node, gpus=gpus)
    try:
        cluster.procs["munged"] = subprocess.Popen(
            [_binary("munged"), "--foreground", "--force", f"--key-file={key}",
             f"--socket={sock}", f"--pid-file={root}/munge/munged.pid",
             f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait(lambda: sock.exists(), timeout, "munged's socket")
        env = cluster.env
        for name in ("slurmctld", "slurmd"):
            argv = [_binary(name), "-D"] + (["-N", node] if name == "slurmd" else [])
            cluster.procs[name] = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL)
        _wait(lambda: "idle" in cluster.run("sinfo", "--noheader", "--format=%T").stdout,
              timeout, "the node to be idle", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ready: object, timeout: float, what: str, cluster: SlurmCluster | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if ready():  # type: ignore[operator]
                return
        time.sleep(0.2)
    logs = "" if cluster is None else (cluster.log("slurmctld")[-2000:]
                                       + cluster.log("slurmd")[-2000:])
    raise RuntimeError(f"Slurm did not come up: no {what} in {timeout:g} s\n{logs}")
