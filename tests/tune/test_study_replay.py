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


def test_replay_time_scales_are_levels_in_rising_order(tmp_path: Path) -> None:
    spec, _ = load_study(study(tmp_path, workload=WORKLOAD, concurrency=OMIT,
                               replay=[4, 1, 2, 2], requests_per_level=OMIT,
                               objective={"minimize": "p99_ttft_ms"}))
    bench = spec.bench_config("http://127.0.0.1:1", ignore_eos=True)
    assert bench.loads == (ReplayLoad(), ReplayLoad(speedup=2), ReplayLoad(speedup=4))
    assert [load.label for load in bench.loads] == ["replay", "replay=2x", "replay=4x"]


@pytest.mark.parametrize(("value", "words"), [
    ([], "[] names no level"),
    ([0], "0 is not a time scale"),
    ([1, True], "True is not a time scale"),
    (2, "2 is not true, false or a list"),
    ([1e9], "at most 1e+06"),
])
def test_bad_replay_levels_name_their_line(tmp_path: Path, value: object, words: str) -> None:
    with pytest.raises(InputError) as err:
        load_study(study(tmp_path, workload=WORKLOAD, concurrency=OMIT, replay=value,
                         requests_per_level=OMIT, objective={"minimize": "p99_ttft_ms"}))
    assert words in str(err.value)
    assert err.value.where is not None and err.value.where.endswith(
        f"study.yaml:{line_of_key(tmp_path / 'study.yaml', 'replay')}")


def line_of_key(path: Path, key: str) -> int:
    """The 1-based line of the top-level ``key:`` in ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith(f"{key}:"))


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
