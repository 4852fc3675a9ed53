"""``benchmarks/diagnosis.py``, short: the bottleneck verdict of real sim levels against the
sim's known truth (:func:`cleanslate.sim.model.binding_constraint`), one seed, one cell per
verdict the engine's metrics make clear: a cap of 64 at c=2, c=8 (offered_load) and c=256
(running_cap), a memory fraction of 0.57 with 512 + 16 tokens at c=32 (kv_capacity: 11 fit),
CUDA graphs up to 32 with a cap of 256 at c=128 (crashed), and the throttle-clock fault under
a cap of 32 at c=128 (throttled, from telemetry)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
diagnosis: Any = importlib.import_module("diagnosis")


@pytest.mark.slow  # 4 sim servers, 6 levels: 20-25 s on 2 loaded cores
def test_each_clear_verdict_is_the_sims_truth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              figure: Any) -> None:
    ledger = tmp_path / "gpus"
    ledger.mkdir()
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(ledger))  # the GPU observer reads it
    monkeypatch.setattr(diagnosis, "LEVEL_S", 0.6)  # steady windows of ~0.6 s: 6 samples
    cells = []
    for config in diagnosis.QUICK:
        cells += diagnosis.run_config(config, 1, str(ledger), tmp_path)
    lines = [f"{c.config} c={c.concurrency}: {c.verdict} ({c.confidence}), truth {c.truth}; "
             f"{' | '.join(c.evidence[:1])}" for c in cells]
    assert len(cells) == 6 and all(c.borderline is None for c in cells), lines
    assert all(c.correct for c in cells), "\n".join(lines)
    # a first level running all it is sent is offered_load only likely (a saturated batch
    # would too); with c=2 before it, c=8 shows the throughput still growing: clear
    clear = {c.truth for c in cells if c.confidence == "clear"}
    assert clear == {"offered_load", "running_cap", "kv_capacity", "crashed"}, lines
    (throttled,) = [c for c in cells if c.truth == "throttled"]
    assert throttled.verdict == "throttled" and throttled.beneath == "running_cap"
    assert any("hw_thermal_slowdown" in line for line in throttled.evidence), throttled
    figure("; ".join(f"{c.config} c={c.concurrency} {c.verdict} ({c.confidence})"
                     for c in cells))
