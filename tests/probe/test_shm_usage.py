"""The collector's scan of what fills ``/dev/shm`` is bounded and ranks by memory held
(issue 35, Build 4): the largest files of any name, in folders too, at most
``SHM_SCAN_FILES`` files looked at, and a cut scan says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cleanslate.probe import _collect_script as collector

KIB = 1 << 10


def _files(folder: Path, count: int, size: int = 4 * KIB) -> None:
    for i in range(count):
        (folder / f"f{i:04d}").write_bytes(b"\1" * size)


def test_the_largest_files_come_first_folders_included(tmp_path: Path) -> None:
    _files(tmp_path, 30)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "big").write_bytes(b"\1" * (256 * KIB))
    (tmp_path / "sparse").open("wb").truncate(1 << 30)  # long, holds nothing
    usage = collector._shm_usage(str(tmp_path), [], {}, {}, time.monotonic() + 10)
    assert usage["complete"] is True and usage["files_scanned"] == 32
    largest = usage["largest"]
    assert len(largest) == collector.SHM_LARGEST
    assert largest[0]["path"] == "sub/big" and largest[0]["allocated_bytes"] >= 256 * KIB
    assert "sparse" not in [f["path"] for f in largest]
    assert usage["listed_bytes"] >= 256 * KIB + 30 * 4 * KIB


def test_a_scan_past_its_bound_stops_and_says_so(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "SHM_SCAN_FILES", 50)
    _files(tmp_path, 120, size=1)
    usage = collector._shm_usage(str(tmp_path), [], {}, {}, time.monotonic() + 10)
    assert usage["complete"] is False and usage["files_scanned"] == 50
    assert len(usage["largest"]) == collector.SHM_LARGEST
