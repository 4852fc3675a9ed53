"""``cleanslate report`` on the command line: tables, the best configuration, input errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.report.conftest import StudyStore


def test_table_sorted_with_best_and_launch_command(cli: Any,
                                                   recorded_store: StudyStore) -> None:
    done = cli("report", "quickstart", "--store", recorded_store.url)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for header in ("output tok/s", "total tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                   "TPOT p99 ms", "best level", "mem-fraction-static"):
        assert header in out
    assert "infeasible (oom)" in out
    assert "best configuration (trial 4)" in out
    assert "launch: " in out and "--mem-fraction-static 0.88" in out
    assert "simulated engine" in out
    # Sorted by the objective: trial 4 (best) is listed before the others, the OOM one last.
    rows = [line for line in out.splitlines() if line.startswith("│")]
    numbers = [int(line.split("│")[1]) for line in rows]
    assert numbers[0] == 4 and numbers[-1] == 3


def test_compare_puts_studies_side_by_side(cli: Any, recorded_store: StudyStore) -> None:
    done = cli("report", "quickstart", "--store", recorded_store.url, "--compare",
               "report-tiny")
    assert done.returncode == 0, done.stderr
    assert "comparison" in done.stdout
    line = next(x for x in done.stdout.splitlines() if "best trial" in x)
    assert "#4" in line and "#0" in line


def test_unknown_study_exits_2_with_known_names(cli: Any, recorded_store: StudyStore) -> None:
    done = cli("report", "no-such-study", "--store", recorded_store.url)
    assert done.returncode == 2
    assert "no study 'no-such-study'" in done.stderr
    assert "quickstart" in done.stderr and "report-tiny" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("report", "quickstart", "--store", recorded_store.url, "--compare", "nope")
    assert done.returncode == 2 and "known studies" in done.stderr


def test_missing_store_file_is_an_input_error_and_not_created(cli: Any,
                                                             tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    done = cli("report", "quickstart", "--store", f"sqlite:///{path}")
    assert done.returncode == 2 and "no store at" in done.stderr
    assert not path.exists()
    done = cli("report", "quickstart", "--store", f"sqlite:///{path}", "--format", "xml")
    assert done.returncode == 2 and "csv or json" in done.stderr
