"""``benchmarks/selection.py``, short: the product's Racer driven on the sim's surface through an
in-memory store, and the JSON and table the results page reads (the machinery, not the
targets)."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
selection: Any = importlib.import_module("selection")


#: The quick start as these tests know it (examples/quickstart.yaml may move on).
QUICKSTART = """\
name: quickstart
engine: sim
model: sim-llama-70b
gpus: [0]
fixed: {tp-size: 1, cuda-graph-max-bs: 112, time-scale: 0.25}
baseline: {mem-fraction-static: 0.88, disable-cuda-graph: true, max-running-requests: 128}
space:
  mem-fraction-static: [0.85, 0.88, 0.92, 0.95]
  disable-cuda-graph: [true, false]
  max-running-requests: [128, 256, 512]
strategy: ablation
workload: {kind: random, input_len: 1024, output_len: 128}
concurrency: [32, 128, 256]
duration_s_per_level: 2
objective: {maximize: output_throughput}
"""


@pytest.fixture
def quickstart(tmp_path: Path) -> Path:
    path = tmp_path / "quickstart.yaml"
    path.write_text(QUICKSTART)
    return path


def _ablation(quickstart: Path) -> Any:
    (surface,) = selection.surfaces(["ablation"], selection.OVERHEAD_S, selection.LEVEL_S,
                                    selection.NOT_STARTED_S, quickstart=quickstart)
    return surface


def _spec(surface: Any, **stats: object) -> Any:
    return surface.spec.model_copy(update={
        "statistics": surface.spec.statistics.model_validate(
            {**surface.spec.statistics.model_dump(), **stats})})


def test_the_quickstart_surface_and_its_truly_equal_pairs(quickstart: Path) -> None:
    surface = _ablation(quickstart)
    # The quick start's ablation: the baseline (0.88, eager, 128), 0.85, 0.92, 0.95 (does not
    # start), CUDA graphs on, 256 and 512 running requests.
    assert len(surface.plan) == 7 and surface.truth[3] is None
    assert surface.plan[0] == {"mem-fraction-static": 0.88, "disable-cuda-graph": True,
                               "max-running-requests": 128}
    # 0.92 cannot matter when 128 running requests cap the batch; 256 and 512 neither.
    assert surface.equal_pairs() == [(0, 2), (5, 6)]
    assert surface.cost_s[3] == selection.NOT_STARTED_S
    assert surface.cost_s[0] == selection.OVERHEAD_S + 3 * selection.LEVEL_S


def test_without_noise_the_racer_finds_the_best_and_its_twin(quickstart: Path) -> None:
    surface = _ablation(quickstart)
    auto = asyncio.run(selection._run(surface, _spec(surface, replicates="auto"), 0, 0.0))
    races = {(c, a): outcome for c, a, outcome in auto.races}
    # Without noise the spread's prior (2.4 % a measurement, two degrees of freedom) still
    # counts: 0.85 (3 % slower, on the 3 % tie margin) is not told apart from the baseline,
    # 0.92 (the same speed) ties it, 256 running requests (0.25 % faster, inside the margin)
    # tie it too, and 512 ties 256. Nothing is called better or worse than it is.
    assert races[(1, 0)] == "undecided" and races[(2, 0)] == "tie"
    assert races[(5, 0)] == "tie" and races[(6, 5)] == "tie"
    assert auto.best == 5 and auto.tied == (0, 2, 6)
    assert not auto.wrong
    assert auto.pairs == 1 and auto.pairs_different == 0 and auto.race_different == 0
    single = asyncio.run(selection._run(surface, _spec(surface, replicates=1), 0, 0.0))
    # Single-shot ranks its best over its twin: a difference declared where there is none.
    assert single.best == 5 and single.tied == () and single.measurements == 7
    assert single.pairs == single.pairs_different == single.pairs_silent == 1
    assert single.gpu_s == pytest.approx(sum(surface.cost_s))
    # Every measurement after the first of each trial is a replicate: a new cycle that climbs
    # the levels up to the highest within 10 % of the best (c=256 here: all three; the
    # CUDA-graph trial 4, which crashed at c=128, has only c=32).
    assert surface.replicate_s == [selection.OVERHEAD_S + 3 * selection.LEVEL_S] * 3 + [
        selection.OVERHEAD_S + selection.LEVEL_S] * 2 + [
        selection.OVERHEAD_S + 3 * selection.LEVEL_S] * 2
    assert auto.measurements > 7
    assert auto.gpu_s == pytest.approx(
        single.gpu_s + (auto.measurements - 7) * (selection.OVERHEAD_S + 3 * selection.LEVEL_S))


def test_noise_is_paired_across_policies(quickstart: Path) -> None:
    surface = _ablation(quickstart)
    assert selection.noise(3, 1, 0, 0.02) == selection.noise(3, 1, 0, 0.02)
    assert selection.noise(3, 1, 0, 0.02) != selection.noise(3, 1, 1, 0.02)
    rows = selection.evaluate(surface, selection.POLICIES, 4, 0.02)
    by = {r["policy"]: r for r in rows}
    assert by["single-shot"]["cost_ratio"] == 1.0
    assert by["replicates-3"]["measurements"] == 7 + 2 * 6  # feasible ones measured 3 times
    assert by["auto"]["measurements"] >= 7
    for row in rows:
        for rate in (row["wrong"], row["false_difference"]):
            assert rate["n"] == 0 or rate["low"] <= rate["rate"] <= rate["high"]


def test_selection_writes_rows_targets_and_the_table(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "selection.json"
    monkeypatch.setattr(sys, "argv", ["selection.py", "--seeds", "3", "--surfaces",
                                      "ablation,grid", "--json", str(out)])
    assert selection.main() == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert {(r["surface"], r["policy"]) for r in data["rows"]} == {
        (s, p) for s in ("ablation", "grid") for p in ("single-shot", "auto", "replicates-3")}
    assert [t["what"] for t in data["targets"]] == [
        "wrong winner", "false difference", "GPU-seconds against single-shot"]
    assert all(isinstance(t["met"], bool) for t in data["targets"])
    assert "| ablation | auto |" in printed and "Targets" in printed
    rendered = selection.render(data)
    assert rendered[0].startswith("`python benchmarks/selection.py --seeds 3")
    assert any(line.startswith("| surface | policy |") for line in rendered)
    assert len(selection.results_targets(data)) == 3
    monkeypatch.setattr(sys, "argv", ["selection.py", "--seeds", "0"])
    assert selection.main() == 2
    assert "--seeds" in capsys.readouterr().err
