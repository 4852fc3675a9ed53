"""The observers' raw samples as an artifact file per level (issue 36 item 6): written beside
``bench --json`` (or ``--observe-dir``) through the safe output helpers, never through a link,
listed in an index, read back by ``report --bench``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench import (
    Harness,
    Observed,
    SampleFiles,
    discard_samples,
    observed_folder,
    read_sample_files,
)
from cleanslate.errors import InputError
from tests._kit import untouched
from tests.bench.conftest import start_fake_server_process
from tests.conftest import run_cli

SAMPLES: list[dict[str, Any]] = [
    {"t": 10.0, "series": {"running": {"": 0.0}}},
    {"t": 10.25, "series": {"running": {"": 3.0}}, "skipped": 1},
    {"t": 10.5, "error": "HTTP 503"},
]


def test_each_measurement_gets_its_file_and_the_index_lists_them(tmp_path: Path) -> None:
    folder = observed_folder(tmp_path / "out.json")
    assert folder == tmp_path / "out.json.observed"
    files = SampleFiles(folder, where="--json")
    files.check()  # a missing folder is fine: made at the first write
    files("c=16", "server_metrics", SAMPLES)
    files("c=16", "server_metrics", SAMPLES[:1])  # a second measurement of the same name
    files("c=16 repeat 2/3", "gpu", [{"t": 1.0, "gpu": 0, "util": 50.0}])
    assert files.problems == []
    names = sorted(os.listdir(folder))
    assert names == ["c=16-2.server_metrics.jsonl", "c=16.server_metrics.jsonl",
                     "c=16_repeat_2_3.gpu.jsonl", "index.json"]
    lines = (folder / "c=16.server_metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == SAMPLES
    assert stat.S_IMODE((folder / "c=16.server_metrics.jsonl").stat().st_mode) == 0o600
    back = read_sample_files(folder)
    assert [(f.label, f.key, f.file, len(f.samples), f.problem) for f in back] == [
        ("c=16", "server_metrics", "c=16.server_metrics.jsonl", 3, None),
        ("c=16", "server_metrics", "c=16-2.server_metrics.jsonl", 1, None),
        ("c=16 repeat 2/3", "gpu", "c=16_repeat_2_3.gpu.jsonl", 1, None)]
    assert back[0].samples == tuple(SAMPLES)
    # samples asked to go nowhere are dropped, not kept for the whole run
    dropped = Harness(on_samples=discard_samples)
    dropped.keep("c=16", Observed("server_metrics", None, tuple(SAMPLES)))
    assert dropped.kept == {}


def test_a_link_where_a_file_goes_is_refused_and_nothing_is_written_through_it(
        tmp_path: Path, victim: Path) -> None:
    folder = tmp_path / "obs"
    folder.mkdir()
    (folder / "c=16.server_metrics.jsonl").symlink_to(victim)
    files = SampleFiles(folder, where="--observe-dir")
    files("c=16", "server_metrics", SAMPLES)
    assert len(files.problems) == 1 and "symbolic link" in files.problems[0]
    untouched(victim)
    assert (folder / "c=16.server_metrics.jsonl").is_symlink()
    # the level after it is still written
    files("c=256", "server_metrics", SAMPLES)
    assert [e["label"] for e in files.written] == ["c=256"]
    # before a run: a folder that is a link, or an index that is one, is refused
    (tmp_path / "linked").symlink_to(folder)
    with pytest.raises(InputError, match="not a folder"):
        SampleFiles(tmp_path / "linked", where="--observe-dir").check()
    (folder / "index.json").unlink()
    (folder / "index.json").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link") as refused:
        SampleFiles(folder, where="--observe-dir").check()
    assert refused.value.where == "--observe-dir"
    untouched(victim)


def test_the_reader_names_what_it_cannot_read(tmp_path: Path) -> None:
    folder = tmp_path / "obs"
    folder.mkdir()
    (folder / "bad.jsonl").write_text('{"t": 1}\nnot json\n')
    (folder / "index.json").write_text(json.dumps({"files": [
        {"label": "a", "key": "server_metrics", "file": "../../etc/passwd"},
        {"label": "b", "key": "server_metrics", "file": "bad.jsonl"},
        {"label": "c", "key": "gpu", "file": "missing.jsonl"}]}))
    got = {f.label: f.problem for f in read_sample_files(folder)}
    assert got["a"] == "not a file name in the folder"
    assert got["b"] == "bad.jsonl:2: not a JSON object"
    assert got["c"] is not None and "missing.jsonl" in got["c"]
    (folder / "index.json").write_text("[")
    with pytest.raises(InputError, match="not JSON"):
        read_sample_files(folder)


@pytest.mark.slow  # three cleanslate processes: about 2 s
def test_bench_writes_the_samples_beside_its_json_and_refuses_a_link(
        tmp_path: Path, procs: Any, victim: Path) -> None:
    _, url = start_fake_server_process(procs)
    out = tmp_path / "out.json"
    args = ("bench", "--url", url, "--model", "m", "--concurrency", "2", "--num-prompts", "4",
            "--workload", "random:input_len=8,output_len=4", "--no-live",
            "--observe-interval", "0.05")
    done = run_cli(*args, "--json", str(out))
    assert done.returncode == 0, done.stderr
    index = json.loads((tmp_path / "out.json.observed" / "index.json").read_text())
    # the fake serves no /metrics: the samples say so (each scrape's error), the level is whole
    assert [(e["label"], e["key"]) for e in index["files"]] == [("c=2", "server_metrics")]
    level = json.loads(out.read_text())["levels"][0]
    assert level["completed"] == 4 and level["server_metrics"]["unreadable"]
    assert "engine metrics unreadable" in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["out.json", "out.json.observed", "victim"]
    # a link planted where a level's file goes: the result is written, the run exits 2
    target = tmp_path / "obs"
    target.mkdir()
    (target / "c=2.server_metrics.jsonl").symlink_to(victim)
    done = run_cli(*args, "--json", str(tmp_path / "two.json"), "--observe-dir", str(target))
    assert done.returncode == 2, done.stderr
    assert "samples file(s) not written" in done.stderr and "--observe-dir" in done.stderr
    assert json.loads((tmp_path / "two.json").read_text())["levels"][0]["completed"] == 4
    untouched(victim)


@pytest.mark.slow  # a cleanslate process searching two probes: about 3.5 s
def test_every_find_max_probe_keeps_its_samples(tmp_path: Path, procs: Any) -> None:
    _, url = start_fake_server_process(procs)
    folder = tmp_path / "probes"
    done = run_cli("bench", "--url", url, "--model", "m", "--find-max", "concurrency",
                   "--slo", "p99_ttft_ms=1000", "--start", "1", "--max-load", "2",
                   "--num-prompts", "4", "--workload", "random:input_len=8,output_len=4",
                   "--no-live", "--observe-interval", "0.05", "--observe-dir", str(folder),
                   "--json", str(tmp_path / "search.json"))
    assert done.returncode == 0, done.stderr
    index = json.loads((folder / "index.json").read_text())
    assert [(e["label"], e["key"]) for e in index["files"]] == [("c=1", "server_metrics"),
                                                                ("c=2", "server_metrics")]
    assert all(e["samples"] >= 2 for e in index["files"])  # the baseline and the final scrape
    # the fake serves no /metrics: said once for the probes, not per probe
    assert done.stderr.count("engine metrics unreadable: HTTP 404") == 1
    assert "(every level)" in done.stderr
    # report --bench reads the search as its probes' levels, with the samples
    from cleanslate.report import load_bench_report

    report = load_bench_report(tmp_path / "search.json", folder)
    assert [lv.label for lv in report.result.levels] == ["c=1", "c=2"]
    assert [line.label for line in report.timelines()] == ["c=1", "c=2"]
    assert all(line.failed_scrapes >= 2 for line in report.timelines())
