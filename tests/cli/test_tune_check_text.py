"""``tune --check`` prints its plan as text too, not only as JSON: the workload line, read
from the study's workload model."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

STUDY = """\
name: plan-text
engine: sim
model: sim
port: 30999
gpus: [0]
space:
  mem-fraction-static: [0.88, 0.92]
strategy: grid
workload: {kind: random, input_len: 256, output_len: 32}
concurrency: [4, 8]
duration_s_per_level: 1
"""


def test_the_plan_as_text(tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    done = run_cli("tune", str(study), "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    text = " ".join(done.stdout.split())
    assert 'workload {"kind": "random", "input_len": 256, "output_len": 32' in text
    assert "levels c=4, c=8, 1 s each" in text and "nothing was launched (--check)" in text
