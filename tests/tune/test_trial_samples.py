"""A trial keeps its levels' raw samples (issue 36 item 6): in ``observed/`` of its run folder
when the run is on this machine, beside its server log; a run on another host keeps only the
summaries in its levels."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cleanslate.bench import BenchConfig, ClosedLoop, RandomWorkload, run_level
from cleanslate.hosts import executor_for
from cleanslate.store import RunRecord
from cleanslate.tune.study import StudySpec
from cleanslate.tune.trial import trial_harness, trial_samples
from tests.bench.conftest import fake_server


def _run(folder: Path) -> RunRecord:
    return RunRecord(id="run-1", host="local", engine="sim", model="m", argv=("x",),
                     marker="m-run-1", port=1, url="http://127.0.0.1:1",
                     log_path=str(folder / "server.log"), artifacts_dir=str(folder),
                     study="s", trial=3)


def test_a_local_trials_levels_keep_their_samples_in_its_run_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "artifacts" / "run-1"
    run_dir.mkdir(parents=True)
    spec = StudySpec.model_validate({"name": "s", "engine": "sim", "model": "m",
                                     "space": {"fault": [None]}, "concurrency": [2]})
    harness = trial_harness(None, executor_for(None), spec, _run(run_dir))

    async def go() -> None:
        async with fake_server() as (url, _):
            config = BenchConfig(url=url, model="m", num_prompts=4,
                                 workload=RandomWorkload(input_len=8, output_len=4))
            for _ in range(2):  # a level measured again keeps both
                await run_level(config, ClosedLoop(concurrency=2), harness)

    asyncio.run(go())
    index = json.loads((run_dir / "observed" / "index.json").read_text())
    assert [(e["label"], e["file"]) for e in index["files"]] == [
        ("c=2", "c=2.server_metrics.jsonl"), ("c=2", "c=2-2.server_metrics.jsonl")]
    assert harness.kept == {}
    # a run on another host: its folder is there, nothing is written here
    assert trial_samples(executor_for("ssh://nobody@192.0.2.1"), _run(run_dir)) is None
    assert trial_samples(None, _run(run_dir)) is None
