"""A baseline given to ``check --baseline`` is what the host looked like idle: the listeners and
processes it lists are accepted as there before. One that another user owns or could have
written is refused (exit 2, naming the file and why), as a store is; ``--save-baseline`` writes
one only its owner can write, whatever the umask."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleanslate.errors import InputError
from cleanslate.verdict.baseline import Baseline

BASELINE = Baseline(version=2, host="h", saved_at="2026-12-01T00:00:00Z", gpu_backend="none",
                    listeners=(), processes=())


def _refused(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        Baseline.load(path)
    assert info.value.where == str(path)
    return info.value


def test_a_baseline_others_could_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "idle.json"
    BASELINE.save(path)
    assert Baseline.load(path) == BASELINE
    for mode, who in ((0o666, "others"), (0o664, "its group")):
        path.chmod(mode)
        assert f"writable by {who}" in _refused(path).message
    path.chmod(0o644)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may replace a file there
    moved = shared / "idle.json"
    path.rename(moved)
    assert "without the sticky bit" in _refused(moved).message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_baseline_of_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "idle.json"
    BASELINE.save(path)
    os.chown(path, 65534, 65534)
    assert "owned by nobody" in _refused(path).message


def test_a_saved_baseline_is_writable_by_its_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o002)  # a common umask with per-user groups
    try:
        BASELINE.save(tmp_path / "idle.json")
    finally:
        os.umask(old)
    assert (tmp_path / "idle.json").stat().st_mode & 0o022 == 0
    assert Baseline.load(tmp_path / "idle.json") == BASELINE
