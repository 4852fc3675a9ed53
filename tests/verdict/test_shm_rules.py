"""``/dev/shm`` leftovers that break the next start are errors (issue 23, Build 8).

A dead engine's file of 17 GB in ``/dev/shm`` (vllm#54002: every restart then fails) used to
be a warning, so the host read CLEAN; SGLang's multimodal segments ``sgl_shm_mm_*``
(sglang#40723) matched no pattern at all. Now a leftover holding more than
:data:`SHM_ERROR_BYTES`, or any leftover while ``/dev/shm`` has less than
:data:`SHM_MIN_FREE_FRACTION` free, is an error. Real files: the session's ``/dev/shm`` is a
private tmpfs; the free-space case mounts a 4 MiB tmpfs of its own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import GpuReading, ShmEntry, ShmSpace, Snapshot
from cleanslate.verdict.check import CheckOptions, check_hosts
from cleanslate.verdict.findings import Finding, FindingKind, Severity, Verdict
from cleanslate.verdict.rules import SHM_ERROR_BYTES, SHM_MIN_FREE_FRACTION, Scope, evaluate
from tests.conftest import Processes

MIB = 1 << 20


def _leftovers(verdict_findings: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in verdict_findings if f.kind == FindingKind.SHM_LEFTOVER]


@pytest.fixture
def segment() -> Iterator[Path]:
    """A SGLang multimodal segment's name in the real ``/dev/shm``, removed afterwards."""
    path = Path("/dev/shm") / f"sgl_shm_mm_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _check() -> tuple[Verdict, list[Finding]]:
    options = CheckOptions(scope=Scope(engines=("sglang",), markers=frozenset(),
                                       exclude_roots=frozenset({os.getpid()})),
                           gpu_backend="none")
    report = asyncio.run(check_hosts([LocalExecutor()], options))
    return report.verdict, _leftovers(report.hosts[0].findings)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_large_dead_segment_is_dirty(segment: Path) -> None:
    """The reproduction: 80 MiB written in an SGLang multimodal segment, no process left."""
    segment.write_bytes(b"\1" * (80 * MIB))
    verdict, found = _check()
    assert verdict == Verdict.DIRTY
    (finding,) = [f for f in found if f.evidence["name"] == segment.name]
    assert finding.severity == Severity.ERROR and finding.evidence["pattern"] == "sgl_shm_*"
    assert "80.0 MiB" in finding.message and "next start" in finding.message


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_small_segment_is_a_warning(segment: Path) -> None:
    segment.write_bytes(b"\1" * MIB)
    verdict, found = _check()
    (finding,) = [f for f in found if f.evidence["name"] == segment.name]
    assert finding.severity == Severity.WARNING
    assert verdict == Verdict.CLEAN


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the suite's private namespaces give it)")
    path = Path(tempfile.mkdtemp(prefix="cs-shmfs-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "cs-test", str(path)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        shutil.rmtree(path, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode()[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)


def test_a_leftover_on_a_nearly_full_shm_is_dirty(small_tmpfs: Path) -> None:
    """A small file is an error when ``/dev/shm`` has less than 10 % free: the next start's
    segments do not fit (SIGBUS at its first write)."""
    (small_tmpfs / "psm_0c0ffee0").write_bytes(b"\1" * (3 * MIB + 3 * MIB // 4))
    snapshot = asyncio.run(probe_host(LocalExecutor(), NoGpuBackend(), shm_dir=str(small_tmpfs),
                                      shm_patterns=("psm_*",), timeout=10.0))
    assert snapshot.shm_space is not None
    assert snapshot.shm_space.free_bytes < SHM_MIN_FREE_FRACTION * snapshot.shm_space.total_bytes
    verdict = evaluate(snapshot, Scope(engines=(), markers=frozenset(),
                                       exclude_roots=frozenset({os.getpid()})))
    (finding,) = _leftovers(verdict.findings)
    assert finding.severity == Severity.ERROR and "free" in finding.message
    assert verdict.verdict == Verdict.DIRTY


def _snapshot(*entries: ShmEntry, space: ShmSpace | None = None) -> Snapshot:
    return Snapshot(host="h", taken_at="2026-12-01T00:00:00Z", elapsed_s=0.1,
                    gpu=GpuReading(backend="none", ok=True), shm=entries, shm_space=space)


def test_the_memory_held_counts_not_the_length() -> None:
    """A sparse segment (created with its full length, never written) holds nothing: the
    threshold is on the blocks it holds; the fallback probe, which reads them too, agrees."""
    sparse = ShmEntry(name="psm_1", size_bytes=4 << 30, allocated_bytes=0, mtime=0.0,
                      pattern="psm_*")
    full = sparse.model_copy(update={"name": "psm_2", "allocated_bytes": SHM_ERROR_BYTES + 1})
    unknown = sparse.model_copy(update={"name": "psm_3", "allocated_bytes": None})
    found = {f.evidence["name"]: f.severity
             for f in evaluate(_snapshot(sparse, full, unknown), Scope()).findings
             if f.kind == FindingKind.SHM_LEFTOVER}
    assert found == {"psm_1": Severity.WARNING, "psm_2": Severity.ERROR,
                     "psm_3": Severity.ERROR}  # unknown blocks: its length counts


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_large_segment_in_use_is_not_a_leftover(segment: Path, procs: Processes) -> None:
    """Another slot's run (or any service) holding its segment open: not a leftover to weigh;
    otherwise a second run on the host could not even pass its check before the launch."""
    segment.write_bytes(b"\1" * (80 * MIB))
    holder = procs.python("import sys, time; f = open(sys.argv[1], 'rb'); print(1, flush=True);"
                          " time.sleep(30)", str(segment), stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline()
    verdict, found = _check()
    (finding,) = [f for f in found if f.evidence["name"] == segment.name]
    assert finding.severity == Severity.WARNING and finding.evidence["held_by"] == [holder.pid]
    assert f"open in PID {holder.pid}" in finding.message
    assert verdict == Verdict.CLEAN
