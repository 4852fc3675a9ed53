"""Crash classification on real log lines: the engines' public issues and our own real runs."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from cleanslate.engines import CRASH_CAUSES, classify_log, get_engine, log_message
from cleanslate.errors import InputError

DATA = Path(__file__).parent / "data"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-cpu"
LOGS = sorted(DATA.glob("*.log"))


def _engine_of(path: Path) -> str:
    for engine in ("vllm", "sglang", "llamacpp"):
        if engine in path.name:
            return engine
    return "transformers"


def _load(path: Path) -> tuple[str, str, str]:
    """(log text without the '#' header, expected cause, expected root-line substring)."""
    text = path.read_text()
    expect = re.search(r"^# expect: (\w+) \| (.*)$", text, re.M)
    assert expect, f"{path.name} has no '# expect:' line"
    cited = re.search(r"^# .*https://github\.com/\S+", text, re.M)
    assert cited or "Real vLLM log" in text or "# A real run here:" in text
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return body, expect.group(1), expect.group(2)


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_real_log_lines_are_classified_with_their_root_cause(path: Path) -> None:
    body, cause, root = _load(path)
    crash = classify_log(_engine_of(path), body)
    assert crash is not None
    assert crash.cause == cause
    assert root in crash.line
    assert crash.line_number is not None
    assert body.splitlines()[crash.line_number - 1].strip() == crash.line


def test_every_cause_has_real_log_lines() -> None:
    causes = {_load(path)[1] for path in LOGS}
    assert causes == set(CRASH_CAUSES)


def test_vllm_enginedead_fixture_names_the_worker_runtime_error() -> None:
    text = (FIXTURES / "crash_enginedead_first_request.log").read_text()
    crash = classify_log("vllm", text)
    assert crash is not None
    assert crash.cause == "python_exception"
    assert crash.line.endswith(
        "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
    )
    assert crash.line.startswith("(Worker pid=16894)")
    assert "EngineDeadError" in text and "Worker failed with error" in text
    # the first of the worker's identical RuntimeError lines, before the EngineCore's wrappers
    assert text.splitlines()[crash.line_number - 1].startswith("(Worker pid=16894)")  # type: ignore[operator]
    assert crash.engine == "vllm"


def test_a_healthy_vllm_log_is_not_a_crash() -> None:
    text = (FIXTURES / "startup_ok_then_parent_sigkilled.log").read_text()
    assert classify_log("vllm", text) is None
    # after the API server's SIGKILL its log says nothing: the exit status does
    crash = classify_log("vllm", text, returncode=-signal.SIGKILL)
    assert crash is not None and crash.cause == "killed" and crash.line_number is None
    assert classify_log("vllm", text, returncode=-signal.SIGTERM) is None
    assert classify_log("vllm", text, returncode=1) is None


def test_partial_logs_and_empty_logs() -> None:
    text = (FIXTURES / "crash_enginedead_first_request.log").read_text()
    head = "\n".join(text.splitlines()[:100])  # while the server is still starting
    assert classify_log("vllm", head) is None
    assert classify_log("sglang", "") is None


def test_adapter_and_function_agree() -> None:
    text = (DATA / "oom_sglang_kv_pool.log").read_text()
    assert get_engine("sglang").classify_log(text) == classify_log("sglang", text)
    with pytest.raises(InputError):
        classify_log("no-such-engine", text)


def test_sim_fault_lines() -> None:
    # the simulated engine's faults print the same kind of lines as real engines
    oom = "[sim TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert classify_log("sim", oom).cause == "oom"  # type: ignore[union-attr]
    crash = "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"
    assert classify_log("sim", crash).cause == "python_exception"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("(Worker pid=1) ERROR 11-30 13:29:02 [x.py:1] RuntimeError: boom", "RuntimeError: boom"),
        ("(EngineCore_0 pid=5) (VllmWorker TP0 pid=7) INFO 08-25 11:01:23 [a.py:2] hi", "hi"),
        ("[2025-03-29 18:18:34 TP0] Scheduler hit an exception", "Scheduler hit an exception"),
        ("sglang-1  | torch.OutOfMemoryError: x", "torch.OutOfMemoryError: x"),
        ("ERROR 09-27 06:46:46 engine.py:157] RuntimeError: y", "RuntimeError: y"),
        ("INFO:     Started server process [1]", "Started server process [1]"),
        ("plain line", "plain line"),
    ],
)
def test_log_prefixes_are_stripped(line: str, message: str) -> None:
    assert log_message(line) == message
