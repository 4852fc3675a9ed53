"""A ``/dev/shm`` without room for the next start is not clean, whatever fills it (issue 35,
Build 4).

Before, a ``/dev/shm`` filled to 95 % by another user's file of any name read CLEAN, and an
engine-named file held open by another user's process was only a warning: the next NCCL or
engine start then failed on a host just called clean. Real tmpfs mounts on ``/dev/shm`` (the
session's mount namespace is private: nothing outside it sees them), real files written by
another user, real holders of another uid.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.fallback import run_fallback
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import GpuReading, Snapshot
from cleanslate.verdict.findings import Finding, FindingKind, Severity, Verdict
from cleanslate.verdict.rules import Scope, evaluate, shm_required_free
from tests._kit import NOBODY, as_user
from tests.conftest import Processes, isolated, run_cli

MIB = 1 << 20
SHM = Path("/dev/shm")
#: Nothing but ``/dev/shm`` counts here: no engine signature, no marker.
SCOPE = Scope(engines=(), markers=frozenset(), exclude_roots=frozenset({os.getpid()}))


@pytest.fixture
def shm_of() -> Iterator[Callable[..., Path]]:
    """Mount a tmpfs of the given size (and inodes) on ``/dev/shm``; unmounted afterwards,
    which shows the session's own ``/dev/shm`` again. Only in the session's private mount
    namespace: on a host as it is, that would hide everyone's ``/dev/shm``."""
    if not isolated() or os.geteuid() != 0:
        pytest.skip("mounts a tmpfs on /dev/shm: only in the suite's private namespaces")
    mounted: list[Path] = []

    def mount(size_mib: int, nr_inodes: int | None = None) -> Path:
        options = f"size={size_mib}m,mode=1777" + (f",nr_inodes={nr_inodes}" if nr_inodes
                                                   else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "cs-shm-test", str(SHM)],
                       check=True, capture_output=True)
        mounted.append(SHM)
        return SHM

    try:
        yield mount
    finally:
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def _fill(path: Path, mib: float) -> None:
    """``mib`` MiB written in ``path`` by ``nobody`` (another user)."""
    def write() -> None:
        with open(path, "wb") as fh:
            fh.write(b"\1" * int(mib * MIB))
    as_user(NOBODY, write)


def _system_python() -> str:
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if python is None:
        pytest.skip("no system python3 that another user can run")
    return python


def _hold(procs: Processes, path: Path, *, unlink: bool = False) -> int:
    """A process of ``nobody`` that opens ``path`` and maps it (and, with ``unlink``, removes
    it: its memory stays held); returns its PID once it holds the file."""
    code = ("import mmap, os, sys, time\n"
            "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
            "if sys.argv[2] == '1': os.unlink(sys.argv[1])\n"
            "print(1, flush=True); time.sleep(60)\n")
    holder = procs.start([_system_python(), "-c", code, str(path), "1" if unlink else "0"],
                         user=NOBODY, group=NOBODY, extra_groups=[], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"1\n"
    return holder.pid


def _probe(**kwargs: Any) -> Snapshot:
    return asyncio.run(probe_host(LocalExecutor(), NoGpuBackend(), shm_patterns=("psm_*",),
                                  timeout=10.0, **kwargs))


def _low(findings: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in findings if f.kind == FindingKind.SHM_LOW_SPACE]


def test_a_shm_95_percent_full_of_another_users_file_is_not_clean(
        shm_of: Callable[..., Path]) -> None:
    """The issue's reproduction, through ``cleanslate check``: 15.2 of 16 MiB in a file of
    no engine's name, written by another user. DIRTY, the file and its owner in evidence."""
    shm = shm_of(16)
    _fill(shm / "scratch.bin", 15.2)
    done = run_cli("check", "--gpu-backend", "none", "--no-default-ports", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    host = done.json()["hosts"][0]
    assert host["verdict"] == "dirty"
    assert host["shm"]["total_bytes"] == 16 * MIB
    assert host["shm"]["free_bytes"] < 1 * MIB and host["shm"]["inodes_total"] > 0
    (low,) = [f for f in host["findings"] if f["kind"] == "shm_low_space"]
    assert low["severity"] == "error"
    assert "scratch.bin" in low["message"] and "nobody (uid 65534)" in low["message"]
    first = low["evidence"]["largest"][0]
    assert first["path"] == "scratch.bin" and first["uid"] == NOBODY
    assert first["user"] == "nobody" and first["allocated_bytes"] >= 15 * MIB
    assert low["evidence"]["required_free_bytes"] == 8 * MIB  # half of a small /dev/shm
    assert low["evidence"]["scan_complete"] is True


def test_an_engine_file_held_by_another_user_is_not_clean_when_it_fills_shm(
        shm_of: Callable[..., Path], procs: Processes) -> None:
    """The file stays a warning as a leftover (a live process's, maybe another slot's run),
    but the space it takes is an error naming it, its owner and its holder."""
    shm = shm_of(16)
    segment = shm / "psm_0c0ffee0"
    _fill(segment, 15)
    holder = _hold(procs, segment)
    verdict = evaluate(_probe(), SCOPE)
    assert verdict.verdict == Verdict.DIRTY
    (leftover,) = [f for f in verdict.findings if f.kind == FindingKind.SHM_LEFTOVER]
    assert leftover.severity == Severity.WARNING and leftover.evidence["held_by"] == [holder]
    (low,) = _low(verdict.findings)
    first = low.evidence["largest"][0]
    assert first["path"] == segment.name and first["uid"] == NOBODY
    assert first["held_by"] == [{"pid": holder, "uid": NOBODY, "comm": "python3"}]
    assert first["mapped_by"] == first["held_by"]
    assert f"in use by PID {holder} `python3` uid {NOBODY}" in low.message


def test_a_removed_file_still_mapped_is_named_by_its_holder(
        shm_of: Callable[..., Path], procs: Processes) -> None:
    """No listing of ``/dev/shm`` shows a file removed while open, yet its memory is held:
    the open-file scan finds it, with its size and owner, through its holder."""
    shm = shm_of(16)
    gone = shm / "invisible"
    _fill(gone, 15)
    holder = _hold(procs, gone, unlink=True)
    assert not gone.exists()
    (low,) = _low(evaluate(_probe(), SCOPE).findings)
    first = low.evidence["largest"][0]
    assert first["path"] == "invisible" and first["deleted"] is True
    assert first["allocated_bytes"] >= 15 * MIB and first["uid"] == NOBODY
    assert [h["pid"] for h in first["held_by"]] == [holder]
    assert "/dev/shm/invisible (deleted)" in low.message


def test_half_full_is_clean(shm_of: Callable[..., Path]) -> None:
    """8 of 16 MiB used: what fills it is read (half full), and it is clean."""
    shm = shm_of(16)
    _fill(shm / "scratch.bin", 8)
    snapshot = _probe()
    assert snapshot.shm_usage is not None
    assert [f.path for f in snapshot.shm_usage.largest] == ["scratch.bin"]
    verdict = evaluate(snapshot, SCOPE)
    assert not _low(verdict.findings)
    assert verdict.verdict == Verdict.CLEAN


def test_too_few_inodes_is_not_clean(shm_of: Callable[..., Path]) -> None:
    """Tiny files that use up the inodes stop the next start as surely as bytes do."""
    shm = shm_of(16, nr_inodes=64)

    def touch() -> None:
        for i in range(40):
            (shm / f"lock.{i}").touch()
    as_user(NOBODY, touch)
    (low,) = _low(evaluate(_probe(), SCOPE).findings)
    assert "inodes free" in low.message and low.evidence["inodes_total"] == 64


def test_the_fallback_reads_a_full_shm_too(shm_of: Callable[..., Path]) -> None:
    """Without python3 on the host: ``stat -f`` and ``ls`` give the same verdict, with the
    largest file and its owner (uids only; mappings are not read, and it says so)."""
    shm = shm_of(16)
    _fill(shm / "scratch.bin", 15.2)
    data, result = asyncio.run(run_fallback(LocalExecutor(), ports=[], timeout=10.0))
    assert data is not None, result
    snapshot = Snapshot.model_validate({**data, "host": "h", "elapsed_s": 0.1,
                                        "gpu": GpuReading(backend="none", ok=True)})
    assert snapshot.shm_space is not None and snapshot.shm_space.inodes_total
    assert snapshot.shm_usage is not None and snapshot.shm_usage.maps_read is False
    (low,) = _low(evaluate(snapshot, SCOPE).findings)
    first = low.evidence["largest"][0]
    assert first["path"] == "scratch.bin" and first["uid"] == NOBODY


@pytest.mark.parametrize("probe", ["collector", "fallback"])
def test_a_shm_whose_size_cannot_be_read_is_unknown(probe: str, tmp_path: Path) -> None:
    """``statvfs`` (``stat -f``) failing: UNKNOWN, never clean."""
    missing = str(tmp_path / "no-shm-here")
    if probe == "collector":
        snapshot = _probe(shm_dir=missing)
    else:
        data, _ = asyncio.run(run_fallback(LocalExecutor(), ports=[], timeout=10.0,
                                           shm_dir=missing))
        assert data is not None
        snapshot = Snapshot.model_validate({**data, "host": "h", "elapsed_s": 0.1,
                                            "gpu": GpuReading(backend="none", ok=True)})
    assert snapshot.shm_space is None
    (source,) = [s for s in snapshot.sources if s.name == "shm_space"]
    assert not source.ok and source.critical
    verdict = evaluate(snapshot, Scope(engines=(), markers=frozenset()))
    assert verdict.verdict == Verdict.UNKNOWN


def test_the_free_space_required() -> None:
    """1 GiB, at least 10 %, at most half: Docker's 64 MiB default is judged by how full it
    is, a large ``/dev/shm`` keeps a tenth of itself free."""
    gib = 1 << 30
    assert shm_required_free(64 * MIB, gib, 0.1) == 32 * MIB
    assert shm_required_free(4 * gib, gib, 0.1) == gib
    assert shm_required_free(100 * gib, gib, 0.1) == 10 * gib
    assert shm_required_free(0, gib, 0.1) == 0  # a tmpfs without a limit
