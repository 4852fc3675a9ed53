"""``cleanslate report --bench``: a bench run's levels with what the observers saw, a panel per
measured level over time (throughput, running against waiting with the cap in effect, KV
usage, GPU activity and power), CSV/JSON flattened per level (issue 36 item 6)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pytest

from cleanslate.bench import (
    BenchConfig,
    BenchResult,
    ClosedLoop,
    GaugeStats,
    GpuTelemetry,
    Harness,
    ObserveOptions,
    RandomWorkload,
    SampleFiles,
    ServerMetrics,
    observed_folder,
    read_sample_files,
    run_benchmark,
)
from cleanslate.report import (
    bench_csv,
    bench_json,
    load_bench_report,
    observed_fields,
    running_cap,
)
from cleanslate.report._bench import level_row, timelines, trailing_rate
from tests.bench.conftest import fake_server
from tests.conftest import run_cli
from tests.report.conftest import StudyStore
from tests.sim._client import MODEL
from tests.sim.conftest import SimServers


def gauge(mean: float, top: float) -> GaugeStats:
    return GaugeStats(mean=mean, max=top)


METRICS = ServerMetrics(flavour="sglang", url="http://x/metrics", samples=40, window_samples=30,
                        running=gauge(53.8, 64), waiting=gauge(202.2, 248),
                        kv_usage=gauge(0.388, 0.495), generation_tokens=163840.0)
GPUS = (GpuTelemetry(index=0, source="nvml", utilization_pct=gauge(96.0, 100.0),
                     power_w=gauge(690.0, 700.0), energy_j=1000.0,
                     joules_per_output_token=0.5),
        GpuTelemetry(index=1, source="nvml", utilization_pct=gauge(98.0, 100.0),
                     power_w=gauge(710.0, 720.0)))


def fake_bench() -> BenchResult:
    async def go() -> BenchResult:
        async with fake_server() as (url, _):
            return await run_benchmark(BenchConfig(
                url=url, model="m", num_prompts=4,
                workload=RandomWorkload(input_len=8, output_len=4),
                loads=(ClosedLoop(concurrency=2), ClosedLoop(concurrency=4)),
                observe=ObserveOptions(enabled=False)))

    return asyncio.run(go())


def test_the_exports_carry_the_summaries_flattened_per_level(tmp_path: Path) -> None:
    plain = fake_bench()
    level = plain.levels[1].model_copy(update={"server_metrics": METRICS, "gpu": GPUS})
    fields = observed_fields(level)
    assert fields["server_metrics.running_max"] == 64
    assert fields["server_metrics.waiting_mean"] == 202.2
    assert fields["server_metrics.kv_usage_max"] == 0.495
    assert fields["server_metrics.waiting_capacity_mean"] is None
    assert fields["server_metrics.generation_tokens"] == 163840.0
    assert fields["gpu0.power_w_mean"] == 690.0 and fields["gpu1.utilization_pct_max"] == 100
    assert fields["gpu0.joules_per_output_token"] == 0.5
    assert observed_fields(plain.levels[0]) == {}
    assert level_row(level)["label"] == "c=4"
    mixed = plain.model_copy(update={"levels": (plain.levels[0], level)})
    path = tmp_path / "b.json"
    path.write_text(mixed.model_dump_json())
    report = load_bench_report(path)
    assert report.samples_note is not None and "no samples folder" in report.samples_note
    rows = list(csv.DictReader(io.StringIO(bench_csv(report))))
    assert [r["label"] for r in rows] == ["c=2", "c=4"]
    assert rows[0]["server_metrics.running_max"] == ""
    assert rows[1]["gpu1.power_w_mean"] == "710.0"
    doc = json.loads(bench_json(report))
    assert doc["levels"][1]["server_metrics.waiting_max"] == 248 and doc["running_cap"] is None


def test_the_cap_comes_from_the_configuration_in_effect_only() -> None:
    assert running_cap({"server_config": {"in_effect": {"max_running_requests": 64}}}) == (
        64, "max_running_requests")
    # SGLang leaves max_running_requests null when not asked: the scheduler's own value
    assert running_cap({"server_config": {"in_effect": {
        "max_running_requests": None, "effective_max_running_requests_per_dp": 2048}}}) == (
        2048, "effective_max_running_requests_per_dp")
    assert running_cap({"server_config": {"in_effect": {"max_num_seqs": 2}}}) == (
        2, "max_num_seqs")
    for document in ({}, {"server_config": None}, {"server_config": {"in_effect": {
            "max_running_requests": "lots"}}}, {"server_config": {"in_effect": {
                "max_running_requests": float("nan")}}}):
        assert running_cap(document) is None


def test_the_throughput_line_is_a_trailing_rate_across_counter_steps() -> None:
    # a counter that steps by 100 tokens every 2 s is 50 tok/s over a 4 s window
    steps = [(t * 0.5, 100.0 * (t // 4)) for t in range(0, 41)]
    rates = trailing_rate(steps, 4.0)
    assert all(45 <= r <= 55 for t, r in rates if t >= 4.5)
    # a restart (the counter went down) starts afresh: no negative rate
    assert all(r >= 0 for _, r in trailing_rate([(0, 50.0), (1, 80.0), (2, 5.0), (3, 25.0)],
                                                1.5))



@pytest.mark.slow  # the sim, two short levels and `cleanslate report` twice: 4-10 s
def test_a_panel_per_level_from_a_real_sim_bench(sims: SimServers, tmp_path: Path) -> None:
    server = sims.start("--max-running-requests", "4", "--enable-metrics",
                        "--time-scale", "0.1")
    out = tmp_path / "out.json"
    files = SampleFiles(observed_folder(out), where="--json")

    async def go() -> BenchResult:
        return await run_benchmark(
            BenchConfig(url=server.url, model=MODEL, num_prompts=16,
                        workload=RandomWorkload(input_len=64, output_len=16),
                        loads=(ClosedLoop(concurrency=2), ClosedLoop(concurrency=16)),
                        observe=ObserveOptions(interval_s=0.05)),
            Harness(on_samples=files))

    result = asyncio.run(go())
    assert files.problems == [] and [e["label"] for e in files.written] == ["c=2", "c=16"]
    out.write_text(result.model_dump_json())
    report = load_bench_report(out)
    assert report.samples_note is None
    # the cap in effect, as the sim reports it (/server_info)
    assert result.server_config is not None and report.cap == (4, "max_running_requests")
    lines = {line.label: line for line in timelines(report.files)}
    busy = lines["c=16"]
    assert busy.has_metrics and not busy.has_gpu
    assert max(v for v in busy.running if v is not None) == 4
    assert max(v for v in busy.waiting if v is not None) > 0
    assert any(0 < v <= 100 for v in busy.kv_pct if v is not None)
    assert busy.throughput and max(r for _, r in busy.throughput) > 0
    # the command: a panel per level as PNG files and in the page, the export per level
    pngs, page, export = tmp_path / "pngs", tmp_path / "page.html", tmp_path / "x.json"
    done = run_cli("report", "--bench", str(out), "--png", str(pngs), "--html", str(page),
                   "--out", str(export))
    assert done.returncode == 0, done.stderr
    shots = sorted(pngs.iterdir())
    assert [p.name for p in shots] == ["level-c_16.png", "level-c_2.png",
                                       "throughput-latency.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") and p.stat().st_size > 10_000
               for p in shots)
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 3 and "running mean/max" in html
    doc = json.loads(export.read_text())
    assert [lv["server_metrics.running_max"] for lv in doc["levels"]] == [2, 4]
    done = run_cli("report", "s", "--bench", str(out))
    assert done.returncode == 2 and "--bench reports on a bench result" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_study_csv_carries_the_best_levels_observer_summaries(
        recorded_store: StudyStore) -> None:
    import dataclasses

    from cleanslate.report import load_report, to_csv
    from cleanslate.store import Store

    report = load_report(Store(recorded_store.url), "quickstart")
    plain = list(csv.DictReader(io.StringIO(to_csv([report]))))
    assert not any(k.startswith(("server_metrics.", "gpu0.")) for k in plain[0])
    best = report.best
    assert best is not None and best.record.best_level is not None
    levels = tuple(lv.model_copy(update={"server_metrics": METRICS, "gpu": GPUS})
                   if lv.label == best.record.best_level else lv for lv in best.record.levels)
    seen = dataclasses.replace(best, record=best.record.model_copy(update={"levels": levels}))
    trials = tuple(seen if t.number == best.number else t for t in report.trials)
    rows = list(csv.DictReader(io.StringIO(to_csv([dataclasses.replace(report,
                                                                        trials=trials)]))))
    row = next(r for r in rows if int(r["number"]) == best.number)
    assert row["server_metrics.running_max"] == "64.0" and row["gpu1.power_w_mean"] == "710.0"
    assert list(row)[-4:] == ["verdict_before", "verdict_after", "run_id", "launch_command"]
    other = next(r for r in rows if int(r["number"]) != best.number)
    assert other["server_metrics.running_max"] == ""


def test_what_is_not_a_bench_result_is_refused_naming_the_option(tmp_path: Path) -> None:
    from cleanslate.errors import InputError

    cases = {"garbage.json": "{", "list.json": "[]", "empty.json": "{}",
             "wrong.json": json.dumps({"levels": [{"label": 3}]})}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InputError) as refused:
            load_bench_report(tmp_path / name)
        assert refused.value.where == "--bench", name
    with pytest.raises(InputError, match=r"not a regular file|No such file"):
        load_bench_report(tmp_path / "missing.json")


@pytest.mark.slow  # the study's own plots and the panel: about 4 s
def test_a_studys_best_trial_gets_a_panel_per_level_from_its_run_folder(
        recorded_store: StudyStore, tmp_path: Path) -> None:
    """The samples a local trial kept in ``<artifacts>/<run id>/observed/`` are drawn in the
    study's plots; a link in their way is not followed (no panel, no error)."""
    import shutil

    from cleanslate.report import load_report, render_plots, study_level_plots
    from cleanslate.store import Store

    report = load_report(Store(recorded_store.url), "quickstart")
    best = report.best
    assert best is not None and best.run is not None and report.artifacts is not None
    assert study_level_plots([report]) == []  # no samples kept: no panel, no error
    label = best.record.best_level or best.record.levels[0].label
    folder = report.artifacts / best.run.id / "observed"
    files = SampleFiles(folder)
    files(label, "server_metrics", [
        {"t": 100 + i * 0.25, "series": {"running": {"": float(min(i, 4))},
                                          "waiting": {"": float(max(0, 12 - i))},
                                          "kv_usage": {"": 0.05 * min(i, 10)},
                                          "generation_tokens": {"": 40.0 * i}}}
        for i in range(40)])
    try:
        plots = study_level_plots([report])
        assert [p.name for p in plots] == [f"level-{best.number}-{label.replace('=', '_')}"]
        assert plots[0].png.startswith(b"\x89PNG") and "best trial" in plots[0].title
        assert plots[0].name in [p.name for p in render_plots([report])]
        lines = timelines(read_sample_files(folder))
        assert max(v for v in lines[0].running if v is not None) == 4
        # a link where the index was: not followed, nothing drawn
        (folder / "index.json").unlink()
        (folder / "index.json").symlink_to(tmp_path / "elsewhere.json")
        (tmp_path / "elsewhere.json").write_text((folder / "../observed").as_posix())
        assert study_level_plots([report]) == []
    finally:
        shutil.rmtree(report.artifacts / best.run.id / "observed")
