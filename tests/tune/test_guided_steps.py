"""The guided step's choice (``cleanslate.tune.guided``): the engines' relax tables as
registered, and the nearest value of the space in a row's direction. Pure: no server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cleanslate.engines import Relaxer, engine_class, engine_names
from cleanslate.sim.model import QUICKSTART_SPACE
from cleanslate.tune.factors import Scalar
from cleanslate.tune.guided import (
    Step,
    next_steps,
    not_guided,
    register_relaxers,
    relaxers,
    rule_tables,
    space_values,
)
from cleanslate.tune.study import StudySpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "study.md"

#: The quick start's space with the sim's flags as a study writes them.
SIM_SPACE: dict[str, list[Scalar]] = {k: list(v) for k, v in QUICKSTART_SPACE.items()}
#: The founding story's baseline: 64 running, CUDA graphs off.
SIM_BASE: dict[str, Scalar] = {"mem-fraction-static": 0.85, "disable-cuda-graph": True,
                               "max-running-requests": 64, "chunked-prefill-size": 4096}

VLLM_SPACE: dict[str, list[Scalar]] = {
    "max-num-seqs": [2, 8, 32, 128],
    "gpu-memory-utilization": [0.8, 0.9, 0.95],
    "kv-cache-dtype": ["auto", "fp8"],
    "enforce-eager": [True, False],
    "max-num-batched-tokens": [2048, 8192],
}
VLLM_BASE: dict[str, Scalar] = {"max-num-seqs": 8, "gpu-memory-utilization": 0.9,
                                "kv-cache-dtype": "auto", "enforce-eager": True,
                                "max-num-batched-tokens": 2048}


def first(verdict: str, space: dict[str, list[Scalar]], current: dict[str, Scalar],
          engine: str, cause: str | None = None) -> Step:
    steps = next_steps(verdict, cause, space, current, engine)
    assert steps, f"no step for {verdict} on {engine}"
    return steps[0]


@pytest.mark.parametrize(("verdict", "cause", "flag", "new"), [
    ("running_cap", None, "max-running-requests", 128),
    ("kv_capacity", None, "mem-fraction-static", 0.88),
    ("compute", None, "disable-cuda-graph", False),
    ("crashed", "oom", "mem-fraction-static", 0.80),
])
def test_each_verdicts_first_step_on_the_sims_quick_start_space(
        verdict: str, cause: str | None, flag: str, new: Scalar) -> None:
    step = first(verdict, SIM_SPACE, SIM_BASE, "sim", cause)
    assert (step.flag, step.old, step.new, step.verdict) == (flag, SIM_BASE[flag], new, verdict)


def test_the_founding_storys_step_says_the_cap_and_why() -> None:
    step = first("running_cap", SIM_SPACE, SIM_BASE, "sim")
    assert step.why == ("raise max-running-requests 64 -> 128: requests queue behind the cap "
                        "while the batch could grow")


def test_a_crash_with_cuda_graphs_turns_them_off_and_reads_the_flag_inverted() -> None:
    graphs_on = {**SIM_BASE, "disable-cuda-graph": False, "max-running-requests": 256}
    steps = next_steps("crashed", "python_exception", SIM_SPACE, graphs_on, "sim")
    assert [(s.flag, s.new) for s in steps] == [("disable-cuda-graph", True),
                                                 ("max-running-requests", 128)]
    assert steps[0].why.startswith("turn disable-cuda-graph on (false -> true: cuda-graph off)")


def test_compute_turns_cuda_graphs_on_saying_so() -> None:
    step = first("compute", SIM_SPACE, SIM_BASE, "sim")
    assert step.why.startswith("turn disable-cuda-graph off (true -> false: cuda-graph on): ")


def test_a_crash_row_answers_only_its_cause() -> None:
    assert next_steps("crashed", "nan", SIM_SPACE, SIM_BASE, "sim") == []
    assert next_steps("crashed", None, SIM_SPACE, SIM_BASE, "sim") == []


@pytest.mark.parametrize(("verdict", "cause", "flag", "new"), [
    ("running_cap", None, "max-num-seqs", 32),
    ("kv_capacity", None, "gpu-memory-utilization", 0.95),
    ("compute", None, "enforce-eager", False),
    ("crashed", "python_exception", "enforce-eager", True),
    ("crashed", "oom", "gpu-memory-utilization", 0.8),
])
def test_each_verdicts_first_step_on_a_vllm_space(
        verdict: str, cause: str | None, flag: str, new: Scalar) -> None:
    # a crash is met with CUDA graphs on, the others from the eager baseline
    current = {**VLLM_BASE, "enforce-eager": False} if verdict == "crashed" else VLLM_BASE
    step = first(verdict, VLLM_SPACE, current, "vllm", cause)
    assert (step.flag, step.old, step.new) == (flag, current[flag], new)


def test_vllms_kv_steps_come_in_the_tables_order() -> None:
    steps = next_steps("kv_capacity", None, VLLM_SPACE, VLLM_BASE, "vllm")
    assert [(s.flag, s.new) for s in steps] == [("gpu-memory-utilization", 0.95),
                                                 ("kv-cache-dtype", "fp8"),
                                                 ("max-num-seqs", 2)]


def test_the_ci_baseline_of_two_sequences_raises_the_cap() -> None:
    step = first("running_cap", {"max-num-seqs": [2, 4, 16]}, {"max-num-seqs": 2}, "vllm")
    assert (step.old, step.new) == (2, 4)


def test_the_nearest_value_is_taken_whatever_the_spaces_order() -> None:
    space: dict[str, list[Scalar]] = {"max-running-requests": [512, 64, 256, 128, 1024]}
    up = first("running_cap", space, {"max-running-requests": 128}, "sglang")
    down = first("kv_capacity", space, {"max-running-requests": 512}, "sglang")
    assert (up.new, down.new) == (256, 256)


def test_a_value_between_the_spaces_values_steps_to_the_next_one() -> None:
    step = first("kv_capacity", SIM_SPACE, {**SIM_BASE, "mem-fraction-static": 0.9}, "sim")
    assert step.new == 0.92


def test_tried_values_are_skipped() -> None:
    tried = [("max-running-requests", 128), ("max-running-requests", 256)]
    steps = next_steps("running_cap", None, SIM_SPACE, SIM_BASE, "sim", tried)
    assert [(s.flag, s.new) for s in steps] == [("max-running-requests", 512)]


def test_a_tried_value_of_another_type_is_not_the_same_value() -> None:
    # True is not 1 on a command line: trying 1 leaves the boolean untried
    steps = next_steps("compute", None, SIM_SPACE, SIM_BASE, "sim",
                       [("disable-cuda-graph", 0)])
    assert steps[0].new is False


def test_nothing_left_is_no_step() -> None:
    top = {**SIM_BASE, "max-running-requests": 512}
    assert next_steps("running_cap", None, SIM_SPACE, top, "sim") == []
    every = [("max-running-requests", v) for v in SIM_SPACE["max-running-requests"]]
    assert next_steps("running_cap", None, SIM_SPACE, SIM_BASE, "sim", every) == []
    done = [("disable-cuda-graph", False), ("chunked-prefill-size", 16384)]
    assert next_steps("compute", None, SIM_SPACE, SIM_BASE, "sim", done) == []


def test_a_flag_outside_the_space_or_without_a_value_gives_no_step() -> None:
    assert next_steps("running_cap", None, {"mem-fraction-static": [0.8, 0.9]},
                      {"mem-fraction-static": 0.8}, "sim") == []
    assert next_steps("running_cap", None, SIM_SPACE, {}, "sim") == []


def test_an_unset_boolean_is_off() -> None:
    steps = next_steps("compute", None, {"disable-cuda-graph": [True, False]}, {}, "sim")
    assert steps == []
    on = next_steps("crashed", "python_exception", {"disable-cuda-graph": [True, False]}, {},
                    "sim")
    assert [(s.old, s.new) for s in on] == [(None, True)]


def test_set_takes_the_value_only_when_the_space_lists_it() -> None:
    without = {"kv-cache-dtype": ["auto", "fp8_e4m3"]}
    steps = next_steps("kv_capacity", None, without, {"kv-cache-dtype": "auto"}, "sglang")
    assert [s.new for s in steps] == ["fp8_e4m3"]
    assert next_steps("kv_capacity", None, without, {"kv-cache-dtype": "fp8_e4m3"},
                      "sglang") == []


def test_a_flag_written_with_dashes_or_its_short_spelling_is_found() -> None:
    dashed = first("running_cap", {"--max-running-requests": [64, 128]},
                   {"--max-running-requests": 64}, "sglang")
    short = first("running_cap", {"np": [1, 2, 4]}, {"np": 2}, "llamacpp")
    assert (dashed.flag, dashed.new, short.flag, short.new) == (
        "--max-running-requests", 128, "np", 4)


def test_not_guided_lists_the_flags_no_row_maps() -> None:
    space: dict[str, list[Scalar]] = {**SIM_SPACE, "tp-size": [1, 2],
                                      "schedule-policy": ["lpm", "fcfs"]}
    assert not_guided(space, "sim") == ["tp-size", "schedule-policy"]
    assert not_guided(VLLM_SPACE, "vllm") == []


def test_an_unknown_engine_has_no_rows() -> None:
    assert relaxers("no-such-engine") == ()
    assert next_steps("running_cap", None, SIM_SPACE, SIM_BASE, "no-such-engine") == []
    assert not_guided(SIM_SPACE, "no-such-engine") == list(SIM_SPACE)


def test_every_adapter_with_a_table_has_it_registered_and_the_sim_shares_sglangs() -> None:
    for name in engine_names():
        assert relaxers(name) == engine_class(name).relaxers
    assert relaxers("sim") == relaxers("sglang")
    assert relaxers("command") == ()


def test_a_registration_replaces_the_table() -> None:
    rows = (Relaxer("running_cap", "slots", "up", "wait for a slot"),)
    register_relaxers("test-guided-engine", rows)
    assert relaxers("test-guided-engine") == rows
    register_relaxers("test-guided-engine", ())
    assert relaxers("test-guided-engine") == ()


@pytest.mark.parametrize(("row", "says"), [
    (dict(verdict="slow", flag="x", direction="up", why="w"), "not a bottleneck verdict"),
    (dict(verdict="compute", flag="--x", direction="up", why="w"), "without dashes"),
    (dict(verdict="compute", flag="x", direction="sideways", why="w"), "direction"),
    (dict(verdict="compute", flag="x", direction="set", why="w"), "a value goes with"),
    (dict(verdict="compute", flag="x", direction="up", why="w", value=2), "a value goes with"),
    (dict(verdict="compute", flag="x", direction="up", why="w", cause="oom"), "a cause"),
    (dict(verdict="crashed", flag="x", direction="up", why="w", cause="gremlins"), "a cause"),
    (dict(verdict="compute", flag="x", direction="up", why=""), "say why"),
])
def test_a_malformed_row_is_refused_when_built(row: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Relaxer(**row)  # type: ignore[arg-type]


def test_space_values_gives_a_ranges_points() -> None:
    spec = StudySpec.model_validate({
        "name": "s", "engine": "sim", "model": "sim", "concurrency": [4],
        "space": {"max-running-requests": {"int": [32, 512], "log": True, "points": 5},
                  "disable-cuda-graph": [True, False]}})
    assert space_values(spec) == {"max-running-requests": [32, 64, 128, 256, 512],
                                  "disable-cuda-graph": [True, False]}


def test_the_docs_rule_table_is_the_registry() -> None:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"<!-- guided-rule-table:start -->\n(.*)\n<!-- guided-rule-table:end -->",
                      text, re.S)
    assert found, "docs/study.md has no guided rule table"
    assert found.group(1).strip() == rule_tables(), (
        "docs/study.md's guided rule table is stale: paste "
        "cleanslate.tune.guided.rule_tables() between its markers")


def test_a_row_that_needs_a_flag_value_is_skipped_where_the_configuration_lacks_it() -> None:
    """The graph capture limit matters only with CUDA graphs on: with ``disable-cuda-graph``
    true, compute's ``cuda-graph-max-bs`` row gives no step (chunked prefill's does); with
    graphs on, or the flag not in the configuration (not known), it does."""
    space = {"disable-cuda-graph": [True, False], "cuda-graph-max-bs": [128, 256],
             "chunked-prefill-size": [4096, 8192]}
    off = {"disable-cuda-graph": True, "cuda-graph-max-bs": 128, "chunked-prefill-size": 4096}
    flags = [s.flag for s in next_steps("compute", None, space, off, "sglang",
                                        tried=[("disable-cuda-graph", False)])]
    assert flags == ["chunked-prefill-size"]
    on = {**off, "disable-cuda-graph": False}
    assert [s.flag for s in next_steps("compute", None, space, on, "sglang")] == [
        "cuda-graph-max-bs", "chunked-prefill-size"]
    unknown = {k: v for k, v in off.items() if k != "disable-cuda-graph"}
    assert "cuda-graph-max-bs" in [s.flag for s in next_steps(
        "compute", None, {k: space[k] for k in unknown}, unknown, "sglang")]
    with pytest.raises(ValueError, match="without dashes"):
        Relaxer("compute", "x", "up", "why", needs=(("--y", True),))


def test_a_batch_limit_the_batch_never_reached_is_not_raised() -> None:
    """``cuda-graph-max-bs`` 160 while the level ran at most 128 at once (the cap): raising the
    capture limit changes nothing, so compute's row gives no step; at 200 running it does."""
    space = {"cuda-graph-max-bs": [160, 256], "chunked-prefill-size": [4096, 8192]}
    on = {"disable-cuda-graph": False, "cuda-graph-max-bs": 160, "chunked-prefill-size": 4096}
    capped = next_steps("compute", None, space, on, "sglang", figures={"running_max": 128.0})
    assert [s.flag for s in capped] == ["chunked-prefill-size"]
    over = next_steps("compute", None, space, on, "sglang", figures={"running_max": 200.0})
    assert [s.flag for s in over] == ["cuda-graph-max-bs", "chunked-prefill-size"]
    # no figures (a crash, a level without the engine's metrics): not known, not held back
    assert "cuda-graph-max-bs" in [s.flag for s in next_steps("compute", None, space, on,
                                                              "sglang")]
