"""A short soak in CI: a few randomized fault-and-kill cycles of ``benchmarks/soak.py`` (the full
run is 100 cycles, outside CI's time budget). Every figure must be 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="the soak's census needs private namespaces "
                    "(root)")
def test_short_soak_has_no_false_clean_no_leftover_no_stray_signal(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--cycles", "5",
                           "--seed", "12", "--json", str(out)], capture_output=True, text=True,
                          timeout=900, check=False)
    assert out.exists(), done.stdout + done.stderr
    summary = json.loads(out.read_text())["summary"]
    print(json.dumps({k: v for k, v in summary.items() if k != "details"}))
    for key in ("false_clean", "processes_left_behind", "ports_left_bound",
                "signalled_not_owned", "finished_trials_lost"):
        assert summary[key] == 0, (key, done.stdout[-4000:])
    assert summary["cycles"] == 5 and summary["finished_trials"] >= 4
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
