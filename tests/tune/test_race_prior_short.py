"""``benchmarks/race_prior.py``, short: 400 seeded races a cell instead of 4,000. At the H200's
restart noise (2.4 %) the spread's prior makes fewer false differences between equal
configurations and decides a +25 % lead in fewer pairs; at three times that noise it makes
more false differences (the cost docs/statistics.md states)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from cleanslate.tune.race import noise_prior

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
race_prior: Any = importlib.import_module("race_prior")


def test_the_prior_buys_at_the_measured_noise_and_costs_above_it() -> None:
    def cell(ratio: float, cv: float, prior: bool) -> dict[str, Any]:
        got: dict[str, Any] = race_prior.cell(ratio, cv, noise_prior() if prior else None, 400,
                                              5)
        return got

    equal_without, equal_with = cell(1.0, 0.024, False), cell(1.0, 0.024, True)
    assert equal_with["wrong"] < equal_without["wrong"], (equal_with, equal_without)
    lead_without, lead_with = cell(1.25, 0.024, False), cell(1.25, 0.024, True)
    assert lead_with["win"] == lead_without["win"] == 400
    assert lead_with["pairs"] < lead_without["pairs"] - 0.5
    noisy_without, noisy_with = cell(1.0, 0.07, False), cell(1.0, 0.07, True)
    assert noisy_with["wrong"] > noisy_without["wrong"], (noisy_with, noisy_without)
    print(f"false differences at 2.4 %: {equal_without['wrong']} -> {equal_with['wrong']} of "
          f"400; +25 % decided in {lead_without['pairs']:.2f} -> {lead_with['pairs']:.2f} "
          f"pairs; at 7 %: {noisy_without['wrong']} -> {noisy_with['wrong']} of 400")
