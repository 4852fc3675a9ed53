"""The reproduction of issue 35, item 5: ``check --save-baseline`` and ``bench --json``, run as
root in a shared folder, overwrote the root-owned file that another user's symbolic link named.
Now each is exit 2 naming the path and what it is, before any work, and the file is untouched;
a link planted during the benchmark is refused at the write, and the result is kept in the file
the error names. The links are made by a child that has become ``nobody``
(:func:`tests._kit.as_user`) in a sticky world-writable folder (``/tmp``)."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests._kit import NOBODY, as_user, untouched
from tests.bench.conftest import start_fake_server_process
from tests.cli.inproc import run_main

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant as nobody")

SMALL = ["--model", "m", "--workload", "random:input_len=8,output_len=4", "--no-live",
         "--concurrency", "1"]



def _requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as resp:
        return int(json.load(resp)["requests"])


def test_bench_json_to_a_planted_link_is_exit_2_before_any_request(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        shared: Path, victim: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    link = shared / "bench.json"
    as_user(NOBODY, lambda: os.symlink(victim, link))
    res = run_main(capsys, monkeypatch, "bench", "--url", url, *SMALL, "--num-prompts", "2",
                   "--json", str(link))
    assert res.code == 2, res.err
    assert f"--json: refused: {link} is a symbolic link" in res.err and "nobody" in res.err
    assert "Traceback" not in res.err
    assert _requests(url) == 0  # refused before the benchmark, not after it
    untouched(victim)


def test_bench_json_to_a_fifo_is_exit_2_without_hanging(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        shared: Path) -> None:
    fifo = shared / "bench.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    res = run_main(capsys, monkeypatch, "bench", "--url", "http://127.0.0.1:9", *SMALL,
                   "--json", str(fifo))
    assert res.code == 2 and f"{fifo} is a FIFO, not a regular file" in res.err, res.err
    assert time.monotonic() - started < 2.0


def test_bench_json_to_a_normal_path_is_written_with_mode_0600(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        shared: Path) -> None:
    _proc, url = start_fake_server_process(procs)
    out = shared / "bench.json"
    res = run_main(capsys, monkeypatch, "bench", "--url", url, *SMALL, "--num-prompts", "2",
                   "--json", str(out))
    assert res.code == 0, res.err
    assert json.loads(out.read_text())["levels"][0]["completed"] == 2
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.stat().st_uid == 0
    # no temporary file left; the observers' raw samples beside it, each file 0600 too
    assert sorted(p.name for p in shared.iterdir()) == ["bench.json", "bench.json.observed"]
    observed = shared / "bench.json.observed"
    assert not observed.is_symlink() and observed.is_dir()
    files = list(observed.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)


def test_a_link_planted_during_the_benchmark_is_refused_and_the_result_kept(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, procs: Any,
        shared: Path, victim: Path) -> None:
    # each response waits 300 ms: the link is planted once the first request has arrived
    _proc, url = start_fake_server_process(procs, "--ttft-ms", "300")
    link = shared / "bench.json"
    planted = threading.Event()

    def plant_when_running() -> None:
        deadline = time.monotonic() + 10
        while _requests(url) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        as_user(NOBODY, lambda: os.symlink(victim, link))
        planted.set()

    planter = threading.Thread(target=plant_when_running, daemon=True)
    planter.start()
    res = run_main(capsys, monkeypatch, "bench", "--url", url, *SMALL, "--num-prompts", "2",
                   "--json", str(link))
    planter.join(10)
    assert planted.is_set()
    assert res.code == 2, res.err
    assert f"refused: {link} is a symbolic link" in res.err and "the result is kept in" in res.err
    untouched(victim)
    kept = [p for p in shared.iterdir() if p.name.endswith(".tmp")]
    assert len(kept) == 1 and str(kept[0]) in res.err
    assert stat.S_IMODE(kept[0].stat().st_mode) == 0o600
    assert json.loads(kept[0].read_text())["levels"][0]["completed"] == 2


def test_check_save_baseline_to_a_planted_link_is_exit_2_and_the_fileuntouched(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, shared: Path,
        victim: Path) -> None:
    link = shared / "baseline.json"
    as_user(NOBODY, lambda: os.symlink(victim, link))
    res = run_main(capsys, monkeypatch, "check", "--gpu-backend", "none", "--no-default-ports",
                   "--save-baseline", str(link))
    assert res.code == 2, res.err
    assert f"--save-baseline: refused: {link} is a symbolic link" in res.err
    untouched(victim)


def test_check_save_baseline_through_a_planted_folder_link_is_exit_2(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, shared: Path,
        victim: Path) -> None:
    link = shared / "baselines"
    as_user(NOBODY, lambda: os.symlink(victim.parent, link))
    res = run_main(capsys, monkeypatch, "check", "--gpu-backend", "none", "--no-default-ports",
                   "--save-baseline", str(link / victim.name))
    assert res.code == 2 and "another user may have planted it" in res.err, res.err
    untouched(victim)


def test_check_save_baseline_to_a_normal_path_is_0600_and_loads_back(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    out = tmp_path / "baseline.json"
    res = run_main(capsys, monkeypatch, "check", "--gpu-backend", "none", "--no-default-ports",
                   "--save-baseline", str(out), "--json")
    assert res.code in (0, 1, 3), res.err  # the verdict is the host's; the file is the point
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    again = run_main(capsys, monkeypatch, "check", "--gpu-backend", "none",
                     "--no-default-ports", "--baseline", str(out), "--json")
    assert again.code in (0, 1, 3) and "refused" not in again.err, again.err
