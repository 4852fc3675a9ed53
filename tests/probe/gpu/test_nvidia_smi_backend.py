"""The ``nvidia-smi`` backend end to end through a real :class:`LocalExecutor`, with stand-in
``nvidia-smi`` scripts first on ``PATH``: one that replays the real fixture outputs, one that
hangs (the failure a real GPU cannot be made to show on demand), one that behaves like an old
driver."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu import get_backend
from cleanslate.probe.gpu.nvidia_smi import GPU_QUERY_FIELDS, NvidiaSmiBackend
from cleanslate.probe.snapshot import GpuReading

from ._data import FIXTURES, UUID0, UUID1, exit_status, output


def _install(bin_dir: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def _replay(directory: Path, name: str, stem: str) -> None:
    """Copy one fixture triple as ``name.out/.err/.code`` (the code bare, for ``exit``)."""
    (directory / f"{name}.out").write_text((FIXTURES / f"{stem}.out").read_text())
    (directory / f"{name}.err").write_text((FIXTURES / f"{stem}.err").read_text())
    (directory / f"{name}.code").write_text(str(exit_status(stem)))


REPLAY_SCRIPT = """\
D="{data}"
echo "$*" >> "$D/calls"
case "$*" in
  *--query-gpu=*) n=gpu ;;
  *--query-compute-apps=*) n=apps ;;
  *) echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 99 ;;
esac
cat "$D/$n.out"
cat "$D/$n.err" >&2
exit "$(cat "$D/$n.code")"
"""


def replaying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, apps: str) -> Path:
    data = tmp_path / "replay"
    data.mkdir()
    _replay(data, "gpu", gpu)
    _replay(data, "apps", apps)
    _install(tmp_path / "bin", REPLAY_SCRIPT.format(data=data), monkeypatch)
    return data


def read(timeout: float = 10.0) -> GpuReading:
    return asyncio.run(NvidiaSmiBackend().read(LocalExecutor(), timeout=timeout))


def test_registered_under_its_name() -> None:
    assert isinstance(get_backend("nvidia-smi"), NvidiaSmiBackend)


def test_replayed_busy_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = replaying(tmp_path, monkeypatch, "busy_query", "busy_apps")
    r = read()
    assert r.ok, r.error
    assert [(g.uuid, g.memory_used_mib) for g in r.gpus] == [(UUID0, 41487), (UUID1, 25627)]
    assert [p.pid for p in r.gpus[0].processes] == [584]
    assert [p.pid for p in r.gpus[1].processes] == [627, 665]
    assert r.note is None
    assert 0 < r.elapsed_s < 5
    calls = (data / "calls").read_text().splitlines()
    assert sorted(calls) == sorted(
        [
            f"--query-gpu={','.join(GPU_QUERY_FIELDS)} --format=csv",
            "--query-compute-apps=gpu_uuid,pid,used_memory --format=csv",
        ]
    )


def test_replayed_bad_index_quotes_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replaying(tmp_path, monkeypatch, "bad_index", "bad_index")
    r = read()
    assert not r.ok
    assert r.error is not None and "No devices were found" in r.error and "exited 6" in r.error


def test_replayed_bad_field_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = replaying(tmp_path, monkeypatch, "bad_field", "idle_apps")
    r = read()
    assert not r.ok
    assert r.error is not None and 'Field "memory.bogus" is not a valid field' in r.error
    # memory.bogus is not an optional field: no second GPU query.
    assert sum("--query-gpu" in c for c in (data / "calls").read_text().splitlines()) == 1


OLD_DRIVER_SCRIPT = """\
D="{data}"
echo "$*" >> "$D/calls"
case "$*" in
  *memory.reserved*) echo 'Field "memory.reserved" is not a valid field to query.'; echo; exit 2 ;;
  *--query-gpu=*) cat "$D/gpu_old.out" ;;
  *--query-compute-apps=*) cat "$D/apps.out" ;;
esac
"""


def test_old_driver_without_memory_reserved_is_retried_and_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An old driver's answer, derived from the real idle query: no memory.reserved column, and
    # the reserved 616 MiB counted in memory.used (as such drivers report it).
    data = tmp_path / "replay"
    data.mkdir()
    header, *rows = output("idle_query")[0].splitlines()
    columns = [c.split(" [")[0] for c in header.split(", ")]
    drop, used = columns.index("memory.reserved"), columns.index("memory.used")
    lines = []
    for line in [header, *rows]:
        cells = line.split(", ")
        if line is not header:
            cells[used] = "616 MiB"
        lines.append(", ".join(c for i, c in enumerate(cells) if i != drop))
    (data / "gpu_old.out").write_text("\n".join(lines) + "\n")
    (data / "apps.out").write_text(output("idle_apps")[0])
    _install(tmp_path / "bin", OLD_DRIVER_SCRIPT.format(data=data), monkeypatch)

    r = read()
    assert r.ok, r.error
    assert r.note is not None and "memory.reserved" in r.note and "includes" in r.note
    for gpu in r.gpus:
        assert gpu.memory_used_mib == 616
        assert gpu.memory_reserved_mib is None
        assert "memory_reserved_mib" in gpu.unknown_fields
    gpu_calls = [c for c in (data / "calls").read_text().splitlines() if "--query-gpu" in c]
    assert len(gpu_calls) == 2
    assert "memory.reserved" not in gpu_calls[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.mark.slow  # about 2 s: the timeout it checks
def test_hanging_nvidia_smi_is_not_ok_within_the_timeout_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    _install(tmp_path / "bin", f'echo $$ >> "{pids}"\nexec sleep 30\n', monkeypatch)
    start = time.monotonic()
    r = read(timeout=2)
    elapsed = time.monotonic() - start
    assert not r.ok
    assert r.error is not None and "did not answer within 2.0 s" in r.error
    assert elapsed < 3.5
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2  # the GPU query and the process query, run side by side
    # The executor ended each command's process group; these are the sleeps it started.
    assert [pid for pid in started if _alive(pid)] == []


def test_missing_nvidia_smi_is_not_ok(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    r = read()
    assert not r.ok
    assert r.error is not None and "could not run" in r.error


def test_usable_follows_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A PATH with `sh` and nothing else, so a real nvidia-smi next to sh does not count.
    sh = shutil.which("sh")
    assert sh is not None
    only_sh = tmp_path / "only-sh"
    only_sh.mkdir()
    (only_sh / "sh").symlink_to(sh)
    monkeypatch.setenv("PATH", str(only_sh))
    assert asyncio.run(NvidiaSmiBackend.usable(LocalExecutor())) is False
    _install(tmp_path / "bin", "exit 0\n", monkeypatch)
    assert asyncio.run(NvidiaSmiBackend.usable(LocalExecutor())) is True
