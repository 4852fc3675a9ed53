"""``bench --find-max``'s probe table shows what the observers saw in each probe, as bench's
table does (issue 36 item 6): the columns only when some probe has them."""

from __future__ import annotations

import pytest
from rich.console import Console

from cleanslate.bench import GaugeStats, ServerMetrics
from cleanslate.cli._find_max import probe_table
from tests.report.capacity_data import CLIFF, search


@pytest.mark.slow  # the recorded capacity search (scipy's intervals): 1.2-2.5 s
def test_the_probe_table_gains_the_observed_columns_only_when_observed() -> None:
    result, levels = search(CLIFF.__getitem__)

    def text(observed: bool) -> str:
        probes = []
        for probe, level in zip(result.probes, levels, strict=True):
            load = int(probe.load)
            seen = ServerMetrics(running=GaugeStats(mean=min(load, 32) * 0.9, max=min(load, 32)),
                                 waiting=GaugeStats(mean=max(0, load - 32), max=load),
                                 kv_usage=GaugeStats(mean=0.5, max=0.75))
            probes.append(probe.model_copy(update={"level": level.model_copy(
                update={"server_metrics": seen if observed else None})}))
        console = Console(record=True, width=300)
        console.print(probe_table(result.model_copy(update={"probes": tuple(probes)})))
        return console.export_text()

    plain = text(False)
    assert "running" not in plain and "KV %" not in plain
    seen = text(True)
    header = seen.splitlines()[2]
    assert "running" in header and "waiting" in header and "KV %" in header
    assert "GPU % / W" not in header
    row = next(line for line in seen.splitlines() if line.startswith("│ c=64 "))
    assert "29/32" in row and "32/64" in row and "50%/75%" in row
