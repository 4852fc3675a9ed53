"""``/dev/shm`` as both probes read it: each leftover's owner and the memory it really holds,
and the file system's size and free space (issue 23, Build 7 and 8).

Real files in a folder of the session's private ``/dev/shm`` (a tmpfs), read by the collector
(``python3``) and by the ``ps``/``ls`` fallback (hosts without ``python3``), which must agree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.fallback import run_fallback
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.probe.snapshot import Snapshot
from tests.conftest import Processes

NOBODY = 65534
MIB = 1 << 20
PATTERNS = ("sgl_shm_*", "psm_*")


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = Path(tempfile.mkdtemp(prefix="cs-shm-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write(path: Path, mib: int, *, sparse_mib: int = 0) -> None:
    with open(path, "wb") as fh:
        fh.write(b"\1" * (mib * MIB))
        if sparse_mib:
            fh.truncate((mib + sparse_mib) * MIB)


def _collector(shm_dir: Path) -> Snapshot:
    return asyncio.run(probe_host(LocalExecutor(), NoGpuBackend(), shm_dir=str(shm_dir),
                                  shm_patterns=PATTERNS, timeout=10.0))


def _fallback(shm_dir: Path) -> dict[str, Any]:
    data, result = asyncio.run(run_fallback(LocalExecutor(), ports=[], timeout=10.0,
                                            shm_dir=str(shm_dir), shm_patterns=PATTERNS))
    assert data is not None, result
    return data


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to nobody needs root")
def test_both_probes_read_the_owner_and_the_memory_held(shm_dir: Path) -> None:
    ours = shm_dir / "sgl_shm_mm_4242_deadbeef"
    theirs = shm_dir / "psm_0badf00d"
    _write(ours, 2, sparse_mib=30)  # 32 MiB long, 2 MiB of it written
    _write(theirs, 1)
    os.chown(theirs, NOBODY, NOBODY)
    (shm_dir / "unrelated").write_bytes(b"x")

    snapshot = _collector(shm_dir)
    entries = {e.name: e for e in snapshot.shm}
    assert set(entries) == {ours.name, theirs.name}
    assert entries[ours.name].uid == os.geteuid() and entries[theirs.name].uid == NOBODY
    assert entries[ours.name].pattern == "sgl_shm_*"
    assert entries[ours.name].size_bytes == 32 * MIB
    assert entries[ours.name].allocated_bytes == 2 * MIB
    space = snapshot.shm_space
    assert space is not None and 0 < space.free_bytes <= space.total_bytes
    st = os.statvfs(shm_dir)
    assert space.total_bytes == st.f_blocks * st.f_frsize

    fallback = {e["name"]: e for e in _fallback(shm_dir)["shm"]}
    assert set(fallback) == set(entries)
    for name, entry in entries.items():
        assert fallback[name]["uid"] == entry.uid
        assert fallback[name]["size_bytes"] == entry.size_bytes
        assert fallback[name]["allocated_bytes"] == entry.allocated_bytes
    for entry in fallback.values():
        assert entry["held_by"] == []
    fb_space = _fallback(shm_dir)["shm_space"]
    assert fb_space["total_bytes"] == space.total_bytes
    assert abs(fb_space["free_bytes"] - space.free_bytes) <= 8 * MIB


def test_both_probes_name_the_processes_holding_a_file_open(shm_dir: Path,
                                                           procs: Processes) -> None:
    path = shm_dir / "psm_1dea5eed"
    _write(path, 1)
    holder = procs.python("import sys, time; f = open(sys.argv[1], 'rb'); print(1, flush=True);"
                          " time.sleep(30)", str(path), stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline()
    (entry,) = _collector(shm_dir).shm
    assert entry.held_by == (holder.pid,)
    (fb,) = _fallback(shm_dir)["shm"]
    assert fb["held_by"] == [holder.pid]
