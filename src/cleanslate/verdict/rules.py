"""The verdict rules: snapshot (+ baseline) -> findings -> CLEAN / DIRTY / UNKNOWN.

The rules, each one a small function below:

- the probe excludes itself and everything it started (the ``pgrep -af`` self-match);
- a source that failed or timed out is an *unknown*, never a zero;
- a process matching an engine signature, or carrying a ``CLEANSLATE_RUN`` marker, is a stray;
- a process holding GPU memory is an error whatever its name;
- an idle GPU is not 0 MiB: used memory is compared with the baseline plus a tolerance;
- ``[N/A]`` in a field the verdict needs (memory used) is unknown; health problems are errors;
- an open ``/dev/nvidia*`` alone is a warning, with held memory an error;
- a listening socket on a port in scope is an error naming its owner; a port in scope only by
  default (an engine's default port, a recorded run's port: ``Scope.port_reasons``) accepts a
  listener that was there at the baseline;
- with a baseline, a listener on any port that was not there is an error, a process started
  since is a warning;
- what the probe could not read (environments, open files, processes hidden by ``hidepid``) is
  a warning naming the count, UNKNOWN with ``strict``: missing data is never clean;
- ``/dev/shm`` with less free than :func:`shm_required_free` (1 GiB, at least 10 % of it,
  at most half of it), or as few inodes, is an error whatever fills it, naming the largest
  files, their owners and holders; a ``/dev/shm`` whose size could not be read is unknown;
- ``/dev/shm`` leftovers are warnings, errors when one holds more than 64 MiB, when
  ``/dev/shm`` is low on space, or with ``strict``; Xid lines since the baseline errors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import takewhile

from cleanslate._types import RUN_MARKER_ENV
from cleanslate.engines import match_engine
from cleanslate.probe.snapshot import Gpu, ProcessInfo, ShmSpace, Snapshot, is_kernel_thread
from cleanslate.verdict.baseline import Baseline, had_process
from cleanslate.verdict.findings import (
    Finding,
    FindingKind,
    HostVerdict,
    Severity,
    Verdict,
    shown_command,
)

#: MiB above the baseline (or above 0 without one) that an idle GPU may show. An idle H200 reads
#: 0-4 MiB through NVML v2 / nvidia-smi; the smallest CUDA context is several hundred MiB.
DEFAULT_IDLE_TOLERANCE_MIB = 64

#: Bytes of shared memory a ``/dev/shm`` leftover may hold and stay a warning. A dead engine's
#: segments of gigabytes (vllm#54002: 17 GB; sglang#40723: 18 GiB in 852 segments) fill the
#: tmpfs, and the next start's own segments then fail (``SIGBUS`` at their first write); the
#: runtime's small files (NCCL's, semaphores) are kilobytes to a few MiB.
SHM_ERROR_BYTES = 64 << 20

#: ``/dev/shm`` must keep this share of its size free (and a leftover while it does not is an
#: error, whatever its size): the next start's segments do not fit (docs/check.md).
SHM_MIN_FREE_FRACTION = 0.10

#: Bytes ``/dev/shm`` must keep free (at most half its size, see :func:`shm_required_free`).
#: NCCL's shared-memory transport creates one segment of 6-9 MiB per channel and peer at its
#: first collective (``nccl-shm-recv-*``, 9,637,888 bytes; ``/dev/shm/nccl-*``, 5,967,872),
#: tens of them on an 8-GPU node, and fails with "No space left on device" in Docker's
#: default 64 MiB; 1 GiB (``--shm-size=1g``) is the size its users report as enough, and
#: vLLM's and SGLang's own segments (broadcast queues, multimodal inputs) come on top.
SHM_MIN_FREE_BYTES = 1 << 30

#: Inodes ``/dev/shm`` must keep free (at most half of them): every segment, semaphore and
#: lock file of a start is one, a few hundred for an 8-GPU server.
SHM_MIN_FREE_INODES = 4096

#: Long-lived daemons that keep ``/dev/nvidia*`` open on healthy hosts.
GPU_DAEMONS = frozenset({"nvidia-persiste", "nv-hostengine", "nvidia-smi", "dcgm-exporter"})

_K = FindingKind
_S = Severity


@dataclass(frozen=True)
class Scope:
    """What a verdict is about.

    ``gpus``: GPU indices in scope (``None``: all). ``exclude_roots``: PIDs whose whole process
    trees are the checker's own (locally, the checker's PID). ``engines``: engines whose
    signatures count as strays (``None``: all known). ``markers``: ``CLEANSLATE_RUN`` values
    that count as strays (``None``: any run's). ``strict``: warnings make a host DIRTY, and
    what could not be read makes it UNKNOWN. ``port_reasons``: ports in scope by default, not
    because the user named them, with why (``vllm's default port``, ``the port of run R``).
    ``shm_min_free_bytes`` and ``shm_min_free_fraction`` (0-0.5): the free space ``/dev/shm``
    must keep (:func:`shm_required_free`).
    """

    gpus: frozenset[int] | None = None
    exclude_roots: frozenset[int] = frozenset()
    engines: tuple[str, ...] | None = None
    markers: frozenset[str] | None = None
    idle_tolerance_mib: int = DEFAULT_IDLE_TOLERANCE_MIB
    strict: bool = False
    port_reasons: tuple[tuple[int, str], ...] = ()
    exclude_markers: frozenset[str] = frozenset()
    shm_min_free_bytes: int = SHM_MIN_FREE_BYTES
    shm_min_free_fraction: float = SHM_MIN_FREE_FRACTION

    def has_gpu(self, index: int) -> bool:
        return self.gpus is None or index in self.gpus


def excluded_pids(snapshot: Snapshot, roots: Iterable[int]) -> set[int]:
    """The checker's own processes: the trees under ``roots``, plus the collector and those of its
    ancestors that share its session (over SSH: the remote shell and ``timeout`` wrapping it).

    The walk never enters a process that carries a run marker (it belongs to a run, whoever its
    parent is now), and a root that is PID 1 or a child subreaper adopts orphans, so for PID 1
    only the process itself is excluded (a checker that is a container's init).
    """
    tree = snapshot.tree
    starts = list(roots)
    session: set[int] = set()
    if snapshot.collector_pid is not None:
        starts.append(snapshot.collector_pid)
        collector = tree.by_pid.get(snapshot.collector_pid)
        if collector is not None:
            session = {p.pid for p in takewhile(lambda p: p.sid == collector.sid,
                                                 tree.ancestors(collector.pid))}
    return session | tree.descendants(
        starts, enter=lambda p: p.run_marker is None and p.pid not in session)


def other_runs_pids(snapshot: Snapshot, markers: Iterable[str]) -> set[int]:
    """The processes of the runs whose markers are ``markers``: those carrying one, and their
    descendants that carry no marker at all (a child that dropped its environment)."""
    wanted = set(markers)
    if not wanted:
        return set()
    marked = [p.pid for p in snapshot.processes if p.run_marker in wanted and p.pid != 1]
    return snapshot.tree.descendants(marked, enter=lambda p: p.run_marker is None) - {1}


def evaluate(snapshot: Snapshot, scope: Scope, baseline: Baseline | None = None) -> HostVerdict:
    """Apply every rule and return the host's verdict."""
    own = excluded_pids(snapshot, scope.exclude_roots)
    # Runs of other slots are not strays here; GPU memory, device files of GPUs in scope and
    # ports in scope are judged without them (``own`` only): a run on another slot opens only
    # its own GPUs' devices, and a process carrying a copied marker is still seen on ours.
    spared = own | other_runs_pids(snapshot, scope.exclude_markers)
    gpu_pids = _gpu_memory_by_pid(snapshot.gpu.gpus)
    findings: list[Finding] = []
    findings += _source_rules(snapshot)
    findings += _process_rules(snapshot, scope, spared, gpu_pids)
    findings += _gpu_rules(snapshot, scope, baseline, own)
    findings += _device_file_rules(snapshot, scope, baseline, own, gpu_pids)
    findings += _port_rules(snapshot, scope, baseline, own)
    findings += _unreadable_rules(snapshot, scope, spared)
    findings += _baseline_rules(snapshot, scope, baseline, spared)
    findings += _shm_space_rules(snapshot, scope)
    findings += _shm_rules(snapshot, scope, baseline)
    findings += _kernel_rules(snapshot, baseline)
    gpus = tuple(g for g in snapshot.gpu.gpus if scope.has_gpu(g.index))
    return HostVerdict(
        host=snapshot.host,
        verdict=_verdict(findings, scope.strict),
        gpu_backend=snapshot.gpu.backend,
        gpus=gpus,
        findings=tuple(findings),
        probed_at=snapshot.taken_at,
        probe_elapsed_s=snapshot.elapsed_s,
        shm=snapshot.shm_space,
    )


def _verdict(findings: list[Finding], strict: bool) -> Verdict:
    severities = {f.severity for f in findings}
    if _S.ERROR in severities or (strict and _S.WARNING in severities):
        return Verdict.DIRTY
    if _S.UNKNOWN in severities:
        return Verdict.UNKNOWN
    return Verdict.CLEAN


def _gpu_memory_by_pid(gpus: Iterable[Gpu]) -> dict[int, dict[int, int | None]]:
    """pid -> {gpu index: MiB used (None when the source could not say)}."""
    out: dict[int, dict[int, int | None]] = {}
    for gpu in gpus:
        for proc in gpu.processes:
            out.setdefault(proc.pid, {})[gpu.index] = proc.used_mib
    return out


def _describe(proc: ProcessInfo | None, pid: int) -> str:
    if proc is None:
        return f"PID {pid} (not visible in this PID namespace)"
    return f"PID {pid} `{proc.comm}` ({shown_command(proc.command)})"


def _evidence(proc: ProcessInfo | None) -> dict[str, object]:
    if proc is None:
        return {}
    return {
        "comm": proc.comm,
        "cmdline": list(proc.cmdline),
        "ppid": proc.ppid,
        "pgid": proc.pgid,
        "sid": proc.sid,
        "state": proc.state,
        "create_time": proc.create_time,
        "run_marker": proc.run_marker,
    }


def _source_rules(snapshot: Snapshot) -> list[Finding]:
    out = []
    for source in snapshot.sources:
        if source.ok:
            continue
        severity = _S.UNKNOWN if source.critical else _S.WARNING
        what = "could not be read" if source.critical else "was not readable"
        out.append(Finding(
            kind=_K.PROBE_ERROR, severity=severity,
            message=f"{source.name} {what}: {source.error}",
            evidence={"source": source.name, "error": source.error},
        ))
    devices = snapshot.gpu_devices or ()
    if snapshot.gpu.auto_fallback and devices:
        out.append(Finding(
            kind=_K.PROBE_ERROR, severity=_S.UNKNOWN,
            message=f"this host has NVIDIA GPU devices ({', '.join(devices[:4])}"
                    f"{' ...' if len(devices) > 4 else ''}) but no GPU backend could read them "
                    "(NVML did not initialise here and nvidia-smi is not on PATH): GPU memory "
                    "and health are unknown; --gpu-backend nvidia-smi says why, "
                    "--gpu-backend none checks without GPUs",
            evidence={"source": "gpu:auto", "devices": list(devices)},
        ))
    if snapshot.gpu.note and snapshot.gpu.ok:
        out.append(Finding(kind=_K.PROBE_ERROR, severity=_S.INFO, message=snapshot.gpu.note,
                           evidence={"source": f"gpu:{snapshot.gpu.backend}"}))
    return out


def _process_rules(
    snapshot: Snapshot, scope: Scope, own: set[int], gpu_pids: dict[int, dict[int, int | None]]
) -> list[Finding]:
    out = []
    for proc in snapshot.processes:
        if proc.pid in own:
            continue
        engine = match_engine(proc.comm, proc.cmdline, scope.engines)
        marked = proc.run_marker is not None and (
            scope.markers is None or proc.run_marker in scope.markers)
        owned = engine is not None or marked
        what = engine or f"run {proc.run_marker}"
        evidence = {**_evidence(proc), "engine": engine}
        if proc.is_zombie:
            out.append(_zombie(proc, what if owned else None, evidence))
            continue
        if proc.state == "D" and (owned or proc.pid in gpu_pids):
            out.append(Finding(
                kind=_K.D_STATE, severity=_S.ERROR, pid=proc.pid,
                message=f"{_describe(proc, proc.pid)} is in uninterruptible sleep (D): "
                        "it cannot be killed until the kernel call returns",
                evidence=evidence,
            ))
        if not owned:
            continue
        on_gpus = gpu_pids.get(proc.pid, {})
        outside = bool(on_gpus) and scope.gpus is not None and not (set(on_gpus) & scope.gpus)
        out.append(Finding(
            kind=_K.STRAY_PROCESS, severity=_S.WARNING if outside else _S.ERROR, pid=proc.pid,
            message=f"{what} process {_describe(proc, proc.pid)} is running"
                    + (" (its GPUs are outside --gpus)" if outside else ""),
            evidence=evidence,
        ))
    return out


def _zombie(proc: ProcessInfo, what: str | None, evidence: dict[str, object]) -> Finding:
    """A zombie whose threads all exited holds nothing but its PID: a warning (info when it is
    not an engine's). A zombie *leader* with live threads is a process whose main thread exited
    while worker threads still run and may hold GPU memory: an error."""
    threads = proc.threads or 0
    if threads > 1:
        return Finding(
            kind=_K.ZOMBIE, severity=_S.ERROR, pid=proc.pid, evidence=evidence,
            message=f"{_describe(proc, proc.pid)}: main thread exited but {threads} threads "
                    "still run",
        )
    return Finding(
        kind=_K.ZOMBIE, severity=_S.WARNING if what else _S.INFO, pid=proc.pid,
        evidence=evidence,
        message=(f"zombie {what} process {_describe(proc, proc.pid)}: exited, not reaped by "
                 f"its parent {proc.ppid}") if what else
                f"zombie process {_describe(proc, proc.pid)}",
    )


def _gpu_rules(
    snapshot: Snapshot, scope: Scope, baseline: Baseline | None, own: set[int]
) -> list[Finding]:
    reading = snapshot.gpu
    out: list[Finding] = []
    if not reading.ok:
        return out  # reported by _source_rules as an unknown
    by_pid = snapshot.by_pid
    present = {g.index for g in reading.gpus}
    if scope.gpus is not None:
        for missing in sorted(scope.gpus - present):
            out.append(Finding(
                kind=_K.GPU_COUNT_CHANGED, severity=_S.ERROR, gpu=missing,
                message=f"GPU {missing} is in scope but the {reading.backend} backend does not "
                        f"see it (GPUs seen: {sorted(present) or 'none'})",
            ))
    if baseline is not None and baseline.gpus:
        before = {g.uuid or str(g.index) for g in baseline.gpus}
        now = {g.uuid or str(g.index) for g in reading.gpus}
        if before != now:
            out.append(Finding(
                kind=_K.GPU_COUNT_CHANGED, severity=_S.ERROR,
                message=f"GPU set changed since the baseline of {baseline.saved_at}: "
                        f"{len(before)} GPUs then, {len(now)} now"
                        + (f"; missing {sorted(before - now)}" if before - now else "")
                        + (f"; new {sorted(now - before)}" if now - before else ""),
                evidence={"missing": sorted(before - now), "new": sorted(now - before)},
            ))
    for gpu in reading.gpus:
        if scope.has_gpu(gpu.index):
            out += _one_gpu(gpu, scope, baseline, own, by_pid)
    return out


def _one_gpu(
    gpu: Gpu, scope: Scope, baseline: Baseline | None, own: set[int],
    by_pid: dict[int, ProcessInfo],
) -> list[Finding]:
    out = []
    label = f"GPU {gpu.index}"
    for problem in gpu.health:
        out.append(Finding(kind=_K.GPU_HEALTH, severity=_S.ERROR, gpu=gpu.index,
                           message=f"{label}: {problem}", evidence={"source": gpu.source}))
    base = baseline.gpu(gpu.index) if baseline else None
    if gpu.ecc_uncorrected:
        before = base.ecc_uncorrected if base and base.ecc_uncorrected is not None else 0
        if gpu.ecc_uncorrected > before:
            out.append(Finding(
                kind=_K.GPU_HEALTH, severity=_S.ERROR, gpu=gpu.index,
                message=f"{label}: {gpu.ecc_uncorrected} uncorrected ECC errors (volatile)"
                        + (f", {before} at the baseline" if before else ""),
            ))
    if gpu.remapped_rows_pending:
        out.append(Finding(kind=_K.GPU_HEALTH, severity=_S.ERROR, gpu=gpu.index,
                           message=f"{label}: row remapping pending: the GPU needs a reset"))
    if gpu.remapped_rows_failure:
        out.append(Finding(kind=_K.GPU_HEALTH, severity=_S.ERROR, gpu=gpu.index,
                           message=f"{label}: row remapping failed: the GPU needs service"))
    if gpu.retired_pages_pending:
        out.append(Finding(kind=_K.GPU_HEALTH, severity=_S.WARNING, gpu=gpu.index,
                           message=f"{label}: retired pages pending (a reset applies them)"))
    if gpu.memory_used_mib is None:
        out.append(Finding(
            kind=_K.GPU_HEALTH, severity=_S.UNKNOWN, gpu=gpu.index,
            message=f"{label}: memory used is unknown ({gpu.source} gave no value)",
            evidence={"unknown_fields": list(gpu.unknown_fields)},
        ))
    else:
        idle = base.memory_used_mib if base and base.memory_used_mib is not None else 0
        limit = idle + scope.idle_tolerance_mib
        if gpu.memory_used_mib > limit:
            holders = [p.pid for p in gpu.processes]
            out.append(Finding(
                kind=_K.GPU_MEMORY_HELD, severity=_S.ERROR, gpu=gpu.index,
                message=f"{label}: {gpu.memory_used_mib} MiB in use (idle is {idle} MiB, "
                        f"tolerance {scope.idle_tolerance_mib} MiB)"
                        + (f"; held by PIDs {', '.join(map(str, holders))}" if holders
                           else "; no process visible holds it (another PID namespace, or "
                                "memory still being released)"),
                evidence={"memory_used_mib": gpu.memory_used_mib, "idle_mib": idle,
                          "pids": holders, "source": gpu.source},
            ))
    for gp in gpu.processes:
        if gp.pid in own:
            continue
        proc = by_pid.get(gp.pid)
        amount = f"{gp.used_mib} MiB" if gp.used_mib is not None else "an unknown amount of memory"
        out.append(Finding(
            kind=_K.GPU_PROCESS, severity=_S.ERROR, gpu=gpu.index, pid=gp.pid,
            message=f"{label}: {_describe(proc, gp.pid)} holds {amount}",
            evidence={**_evidence(proc), "used_mib": gp.used_mib, "gpu_process_name": gp.name},
        ))
    return out


def _device_index(path: str) -> int | None:
    tail = path.removeprefix("/dev/nvidia")
    return int(tail) if tail.isdigit() else None


def _device_file_rules(
    snapshot: Snapshot, scope: Scope, baseline: Baseline | None, own: set[int],
    gpu_pids: dict[int, dict[int, int | None]],
) -> list[Finding]:
    out = []
    by_pid = snapshot.by_pid
    known: dict[int, list[float]] = {}
    for pid, create_time in baseline.device_holders if baseline else ():
        known.setdefault(pid, []).append(create_time)
    for holder in snapshot.device_holders:
        proc = by_pid.get(holder.pid)
        if holder.pid in own or proc is None or proc.comm in GPU_DAEMONS:
            continue
        if had_process(known, proc.pid, proc.create_time):
            continue
        indices = {i for i in map(_device_index, holder.devices) if i is not None}
        if scope.gpus is not None and indices and not (indices & scope.gpus):
            continue
        holds = holder.pid in gpu_pids
        out.append(Finding(
            kind=_K.DEVICE_FILE_HOLDER, severity=_S.ERROR if holds else _S.WARNING,
            pid=holder.pid,
            message=f"{_describe(proc, holder.pid)} has {', '.join(holder.devices)} open"
                    + (" and holds GPU memory" if holds else ""),
            evidence={**_evidence(proc), "devices": list(holder.devices)},
        ))
    return out


def _port_rules(
    snapshot: Snapshot, scope: Scope, baseline: Baseline | None, own: set[int]
) -> list[Finding]:
    out = []
    by_pid = snapshot.by_pid
    create = {p.pid: p.create_time for p in snapshot.processes}
    reasons = dict(scope.port_reasons)
    for sock in snapshot.sockets:
        owners = [pid for pid in sock.pids if pid not in own]
        if sock.pids and not owners:
            continue
        reason = reasons.get(sock.port)
        if reason is not None and baseline is not None and baseline.had_listener(sock, create):
            continue  # a long-lived service on an engine's default port, there at the baseline
        who = "; ".join(_describe(by_pid.get(pid), pid) for pid in owners) or \
            "an owner that is not visible (another PID namespace, or no permission)"
        out.append(Finding(
            kind=_K.PORT_IN_USE, severity=_S.ERROR, port=sock.port,
            pid=owners[0] if owners else None,
            message=f"port {sock.port}{f' ({reason})' if reason else ''} is bound "
                    f"({sock.address}) by {who}",
            evidence={**(_evidence(by_pid.get(owners[0])) if owners else {}),
                      "address": sock.address, "pids": owners, "inode": sock.inode,
                      "why_in_scope": reason or "asked for"},
        ))
    return out


#: PIDs named in an ``unreadable`` finding's message (all of them are in its evidence).
_NAMED_PIDS = 5


def _unreadable_rules(snapshot: Snapshot, scope: Scope, own: set[int]) -> list[Finding]:
    """What the probe could not read: a warning per kind naming the count and a few PIDs
    (UNKNOWN with ``strict``). A process whose environment cannot be read may carry a run
    marker that no one sees; one whose open files cannot be read may hold a GPU device file or
    a listening socket."""
    severity = _S.UNKNOWN if scope.strict else _S.WARNING
    by_pid = snapshot.by_pid

    def relevant(pid: int) -> bool:
        proc = by_pid.get(pid)
        return proc is None or not (pid in own or is_kernel_thread(proc) or proc.is_zombie)

    def finding(what: str, pids: list[int], consequence: str) -> Finding:
        pids = sorted(pids)
        named = ", ".join(
            f"{pid} ({by_pid[pid].comm}, uid {by_pid[pid].uid})" if pid in by_pid else str(pid)
            for pid in pids[:_NAMED_PIDS])
        more = f" and {len(pids) - _NAMED_PIDS} more" if len(pids) > _NAMED_PIDS else ""
        return Finding(
            kind=_K.UNREADABLE, severity=severity,
            message=f"{what} of {len(pids)} process{'es' if len(pids) != 1 else ''} could not "
                    f"be read (PID {named}{more}): {consequence}; run the check as root or as "
                    "their owner",
            evidence={"what": what, "count": len(pids), "pids": pids},
        )

    out = []
    environ = [p.pid for p in snapshot.processes if not p.environ_readable and relevant(p.pid)]
    if environ:
        out.append(finding("the environment", environ,
                           f"a {RUN_MARKER_ENV} marker there would not be seen"))
    files = [pid for pid in snapshot.fd_unreadable if relevant(pid)]
    if files:
        out.append(finding("the open files", files,
                           "a /dev/nvidia* file or a listening socket held there would not be "
                           "seen"))
    stat = [pid for pid in snapshot.stat_unreadable if pid not in own]
    if stat:
        out.append(finding("the status (/proc/PID/stat)", stat,
                           "they are missing from the process list"))
    if snapshot.proc_hidepid:
        out.append(Finding(
            kind=_K.UNREADABLE, severity=severity,
            message=f"/proc is mounted with {snapshot.proc_hidepid}: other users' processes "
                    "are hidden from this user and were not checked; run the check as root",
            evidence={"what": "processes", "hidepid": snapshot.proc_hidepid},
        ))
    return out


def _baseline_rules(
    snapshot: Snapshot, scope: Scope, baseline: Baseline | None, own: set[int]
) -> list[Finding]:
    """What is new since the baseline: listeners on any port (errors), processes (warnings)."""
    if baseline is None:
        return []
    out = []
    if baseline.host != snapshot.host:
        out.append(Finding(
            kind=_K.PROBE_ERROR, severity=_S.WARNING,
            message=f"the baseline was taken on host {baseline.host!r}, not {snapshot.host!r}: "
                    "its idle memory, listeners and processes may not be this host's",
            evidence={"baseline_host": baseline.host, "host": snapshot.host},
        ))
    if baseline.boot_id and snapshot.boot_id and baseline.boot_id != snapshot.boot_id:
        out.append(Finding(
            kind=_K.PROBE_ERROR, severity=_S.WARNING,
            message=f"the baseline of {baseline.saved_at} was taken in another boot of the host: "
                    "the processes and listeners it names are gone (save a new one)",
            evidence={"baseline_boot_id": baseline.boot_id, "boot_id": snapshot.boot_id},
        ))
    if baseline.listeners is None or baseline.processes is None:
        out.append(Finding(
            kind=_K.PROBE_ERROR, severity=_S.WARNING,
            message=f"the baseline of {baseline.saved_at} does not record listeners and "
                    "processes (an older format): new ones are not reported (save a new one)",
            evidence={"baseline_version": baseline.version},
        ))
    by_pid = snapshot.by_pid
    create = {p.pid: p.create_time for p in snapshot.processes}
    if baseline.listeners is not None and snapshot.listeners is not None:
        in_scope = {s.inode for s in snapshot.sockets}
        for sock in snapshot.listeners:
            owners = [pid for pid in sock.pids if pid not in own]
            if (sock.pids and not owners) or sock.inode in in_scope:
                continue  # ours, or already a port_in_use finding
            if baseline.had_listener(sock, create):
                continue
            who = "; ".join(_describe(by_pid.get(pid), pid) for pid in owners) or \
                "an owner that is not visible (another PID namespace, or no permission)"
            out.append(Finding(
                kind=_K.NEW_LISTENER, severity=_S.ERROR, port=sock.port,
                pid=owners[0] if owners else None,
                message=f"port {sock.port} ({sock.address}) is listened on by {who}: new since "
                        f"the baseline of {baseline.saved_at}",
                evidence={"address": sock.address, "pids": owners, "inode": sock.inode},
            ))
    if baseline.processes is not None:
        known = baseline.process_index()
        theirs = _checker_processes(snapshot, scope.exclude_roots, known)
        for proc in snapshot.processes:
            if (proc.pid in own or proc.pid in theirs or is_kernel_thread(proc)
                    or had_process(known, proc.pid, proc.create_time)):
                continue
            if match_engine(proc.comm, proc.cmdline, scope.engines) is not None or (
                    proc.run_marker is not None
                    and (scope.markers is None or proc.run_marker in scope.markers)):
                continue  # a stray_process finding already
            out.append(Finding(
                kind=_K.NEW_PROCESS, severity=_S.WARNING, pid=proc.pid,
                message=f"{_describe(proc, proc.pid)} started since the baseline of "
                        f"{baseline.saved_at}",
                evidence=_evidence(proc),
            ))
    return out


def _checker_processes(
    snapshot: Snapshot, roots: Iterable[int], known: dict[int, list[float]]
) -> set[int]:
    """Processes that are the checker's own doing, not new work on the host: the ancestors of
    the checker (``roots``) and of the collector (the shell that ran it, an SSH session), and,
    over SSH (no ``roots``), everything under the collector's topmost ancestor that is new since
    the baseline (the connection's session: the GPU backend's command runs beside the
    collector)."""
    tree = snapshot.tree
    out: set[int] = set()
    roots = list(roots)
    for pid in [*roots, snapshot.collector_pid]:
        if pid is None or pid == 1 or pid not in tree.by_pid:
            continue
        out.add(pid)
        out.update(p.pid for p in takewhile(lambda p: p.pid != 1, tree.ancestors(pid)))
    collector = tree.by_pid.get(snapshot.collector_pid or -1)
    if not roots and collector is not None:
        top = [collector, *takewhile(
            lambda p: p.pid != 1 and not had_process(known, p.pid, p.create_time),
            tree.ancestors(collector.pid))][-1]
        ours = set(out)
        out |= tree.descendants([top.pid], enter=lambda p: p.pid not in ours)
    return out


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def shm_required_free(total: int, min_free: int, fraction: float) -> int:
    """What ``/dev/shm`` of ``total`` (bytes or inodes) must keep free: ``min_free``, at least
    ``fraction`` of ``total``, and at most half of it (a ``/dev/shm`` made small on purpose, a
    container's ``--shm-size``, is judged by how full it is, not by its size). 0 for a
    ``total`` of 0 (a tmpfs without a limit)."""
    if total <= 0:
        return 0
    return max(math.ceil(fraction * total), min(min_free, total // 2))


def _shm_low(space: ShmSpace | None, scope: Scope) -> list[str]:
    """Why ``space`` is too little for the next start (empty: it is enough)."""
    if space is None:
        return []
    why = []
    need = shm_required_free(space.total_bytes, scope.shm_min_free_bytes,
                             scope.shm_min_free_fraction)
    if space.free_bytes < need:
        why.append(f"/dev/shm has {_mib(space.free_bytes)} free of {_mib(space.total_bytes)} "
                   f"(it must keep {_mib(need)})")
    if space.inodes_total and space.inodes_free is not None:
        need = shm_required_free(space.inodes_total, SHM_MIN_FREE_INODES,
                                 scope.shm_min_free_fraction)
        if space.inodes_free < need:
            why.append(f"/dev/shm has {space.inodes_free} of {space.inodes_total} inodes free "
                       f"(it must keep {need})")
    return why


#: Files named in a ``shm_low_space`` finding's message (the evidence has all it read).
_NAMED_FILES = 3


def _shm_space_rules(snapshot: Snapshot, scope: Scope) -> list[Finding]:
    """``/dev/shm`` without room for the next start is an error, whoever fills it and whatever
    the files are called: NCCL's and the engines' segments fail at creation (``ENOSPC``) or
    at their first write (``SIGBUS``). The evidence names the largest files with their owners
    and the processes that hold them open or mapped. (A ``/dev/shm`` that could not be read
    is an unknown: the ``shm_space`` source.)"""
    space = snapshot.shm_space
    why = _shm_low(space, scope)
    if space is None or not why:
        return []
    usage = snapshot.shm_usage
    by_pid = snapshot.by_pid

    def holder(pid: int) -> dict[str, object]:
        proc = by_pid.get(pid)
        return {"pid": pid, "uid": proc.uid if proc else None,
                "comm": proc.comm if proc else None}

    largest: list[dict[str, object]] = []
    named: list[str] = []
    for file in usage.largest if usage else ():
        largest.append({
            "path": file.path, "size_bytes": file.size_bytes,
            "allocated_bytes": file.allocated_bytes, "uid": file.uid, "user": file.user,
            "deleted": file.deleted, "held_by": [holder(p) for p in file.held_by],
            "mapped_by": [holder(p) for p in file.mapped_by]})
        if len(named) < _NAMED_FILES:
            owner = f"{file.user} (uid {file.uid})" if file.user else f"uid {file.uid}"
            pids = sorted({*file.held_by, *file.mapped_by})
            users = ", ".join(
                f"PID {p}" + (f" `{by_pid[p].comm}` uid {by_pid[p].uid}" if p in by_pid else "")
                for p in pids[:3])
            named.append(f"/dev/shm/{file.path}{' (deleted)' if file.deleted else ''} "
                         f"{_mib(file.allocated_bytes or 0)} of {owner}, "
                         + (f"in use by {users}" if users else "held by no process"))
    used = space.total_bytes - space.free_bytes
    evidence: dict[str, object] = {
        "free_bytes": space.free_bytes, "total_bytes": space.total_bytes,
        "required_free_bytes": shm_required_free(
            space.total_bytes, scope.shm_min_free_bytes, scope.shm_min_free_fraction),
        "inodes_free": space.inodes_free, "inodes_total": space.inodes_total,
        "largest": largest,
        "files_scanned": usage.files_scanned if usage else None,
        "listed_bytes": usage.listed_bytes if usage else None,
        "scan_complete": usage.complete if usage else False,
        "maps_read": usage.maps_read if usage else False,
    }
    detail = ("; largest: " + "; ".join(named)) if named else \
        "; what fills it was not read"
    if usage is not None and used > 0 and usage.listed_bytes < used // 2 and usage.complete:
        detail += (f"; {_mib(used - usage.listed_bytes)} of it is in no file listed "
                   "(removed files still open or mapped, or another mount's use)")
    return [Finding(
        kind=_K.SHM_LOW_SPACE, severity=_S.ERROR,
        message="; ".join(why) + ": the next NCCL or engine start cannot create its shared "
                "memory" + detail,
        evidence=evidence,
    )]


def _shm_rules(snapshot: Snapshot, scope: Scope, baseline: Baseline | None) -> list[Finding]:
    """A leftover is a warning, and an error when it holds more than :data:`SHM_ERROR_BYTES`
    (its blocks; its length where they were not read), when ``/dev/shm`` is low
    (:func:`shm_required_free`), or with ``strict``. A file that a live process holds open is
    that process's (another slot's run, a service): a warning naming it, never escalated by
    its size; a stray holding it is an error of its own, and the space it takes is judged by
    the ``shm_low_space`` rule."""
    known = set(baseline.shm) if baseline else set()
    space = snapshot.shm_space
    low = bool(_shm_low(space, scope))
    out = []
    for entry in snapshot.shm:
        if entry.name in known:
            continue
        held = entry.held_bytes
        in_use = bool(entry.held_by)
        why = []
        if held > SHM_ERROR_BYTES and not in_use:
            why.append(f"more than {_mib(SHM_ERROR_BYTES)} that the next start cannot use")
        if low and space is not None and not in_use:
            why.append(f"/dev/shm has {_mib(space.free_bytes)} free of "
                       f"{_mib(space.total_bytes)}: the next start's segments may not fit")
        evidence: dict[str, object] = {
            "name": entry.name, "size_bytes": entry.size_bytes,
            "allocated_bytes": entry.allocated_bytes, "pattern": entry.pattern,
            "uid": entry.uid, "held_by": list(entry.held_by)}
        if space is not None:
            evidence.update(shm_free_bytes=space.free_bytes, shm_total_bytes=space.total_bytes)
        out.append(Finding(
            kind=_K.SHM_LEFTOVER, severity=_S.ERROR if scope.strict or why else _S.WARNING,
            message=f"/dev/shm/{entry.name} ({_mib(held)} held, {entry.size_bytes} bytes long) "
                    + (f"is open in PID {', '.join(map(str, entry.held_by[:5]))}"
                       if in_use else "is left over")
                    + f" (matches {entry.pattern})"
                    + (f": {'; '.join(why)}" if why else ""),
            evidence=evidence,
        ))
    return out


def _kernel_rules(snapshot: Snapshot, baseline: Baseline | None) -> list[Finding]:
    out = []
    for event in snapshot.kernel_events:
        since_baseline = baseline is not None and baseline.kmsg_last_us is not None
        out.append(Finding(
            kind=_K.GPU_HEALTH, severity=_S.ERROR if since_baseline else _S.WARNING,
            message=(f"Xid {event.xid} since the baseline: " if since_baseline
                     else "kernel log (no baseline to date it against): ") + event.message,
            evidence={"xid": event.xid, "monotonic_us": event.monotonic_us},
        ))
    return out
