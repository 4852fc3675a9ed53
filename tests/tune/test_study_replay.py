"""A study whose trials replay a trace (``replay: true``): validated as a file, its benchmark a
replay level of the trace workload; refused without a trace or beside ``concurrency:``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanslate.bench import ReplayLoad
from cleanslate.errors import InputError
from cleanslate.tune.study import load_study
from tests._kit import OMIT, study_yaml

TRACE = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "azure-500.csv"
WORKLOAD = {"kind": "trace", "path": str(TRACE), "format": "azure", "speedup": 10}


def study(tmp_path: Path, **overrides: object) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(study_yaml(**overrides), encoding="utf-8")
    return path


def test_a_replay_study_benchmarks_the_trace_at_its_times(tmp_path: Path) -> None:
    spec, _ = load_study(study(tmp_path, workload=WORKLOAD, concurrency=OMIT, replay=True,
                               requests_per_level=OMIT, objective={"minimize": "p99_ttft_ms"}))
    bench = spec.bench_config("http://127.0.0.1:1", ignore_eos=True)
    assert bench.loads == (ReplayLoad(),)
    assert bench.workload.kind == "trace"


@pytest.mark.parametrize(("overrides", "words"), [
    ({"replay": True, "concurrency": OMIT}, "replay level sends a trace"),
    ({"replay": True, "workload": WORKLOAD}, "leave concurrency: out"),
    ({"concurrency": OMIT, "workload": WORKLOAD}, "replay: true with a trace workload"),
])
def test_a_replay_needs_a_trace_and_no_other_levels(tmp_path: Path, overrides: dict[str, object],
                                                    words: str) -> None:
    with pytest.raises(InputError) as err:
        load_study(study(tmp_path, **overrides))
    assert words in str(err.value)
    assert err.value.where is not None and "study.yaml" in err.value.where
