"""The sim's known truth for bottleneck verdicts: which constraint binds a configuration at a
workload and concurrency (:func:`cleanslate.sim.model.binding_constraint`; no processes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import get_args

import pytest

from cleanslate.bench import BOTTLENECK_KINDS
from cleanslate.sim.model import (
    SATURATION_GAIN,
    SimModel,
    SimSettings,
    TruthKind,
    binding_constraint,
    cycle_throughput,
    marginal_gain,
    settings_from_flags,
)

#: The quick start's workload: 1,024 prompt tokens, 128 out.
IN, OUT = 1024, 128


def truth(flags: Mapping[str, object], c: int, input_len: int = IN,
          output_len: int = OUT) -> str:
    return binding_constraint(settings_from_flags(flags), input_len, output_len, c).verdict


def test_the_verdicts_are_spelled_as_the_bench_spells_them() -> None:
    assert set(get_args(TruthKind)) <= set(BOTTLENECK_KINDS)


def test_a_cap_of_64_at_256_clients_is_the_running_cap() -> None:
    b = binding_constraint(settings_from_flags({"max-running-requests": 64}), IN, OUT, 256)
    assert b.verdict == "running_cap" and b.borderline is None
    assert b.batch == 64 and b.running_cap == 64 and b.kv_limit == 129
    assert "192 wait behind the cap" in b.reason


def test_eight_clients_are_the_offered_load() -> None:
    b = binding_constraint(SimSettings(), IN, OUT, 8)
    assert b.verdict == "offered_load" and b.batch == 8
    assert b.marginal_gain > SATURATION_GAIN


def test_a_tiny_memory_fraction_with_long_requests_is_kv_capacity() -> None:
    b = binding_constraint(settings_from_flags({"mem-fraction-static": 0.6}), 4096, 512, 32)
    assert b.verdict == "kv_capacity" and b.kv_limit == 4 and b.batch == 4
    # the same 32 clients with short requests all fit: nothing waits for memory
    assert truth({"mem-fraction-static": 0.6}, 32, 64, 16) == "offered_load"


def test_kv_below_the_cap_binds_before_the_cap() -> None:
    flags = {"mem-fraction-static": 0.65, "max-running-requests": 256}
    assert truth(flags, 192, 1024, 32) == "kv_capacity"
    # now the cap is below the KV limit (40)
    assert truth({**flags, "max-running-requests": 16}, 192, 1024, 32) == "running_cap"


def test_a_batch_above_the_cuda_graph_size_crashes_and_eager_does_not() -> None:
    flags: dict[str, object] = {"max-running-requests": 256, "cuda-graph-max-bs": 32}
    assert truth(flags, 128, 64, 16) == "crashed"
    assert truth(flags, 16, 64, 16) == "offered_load"
    assert truth({**flags, "disable-cuda-graph": True}, 128, 64, 16) != "crashed"
    # a cap at the graph size holds the batch below it: the cap binds, no crash
    assert truth({"max-running-requests": 32, "cuda-graph-max-bs": 32}, 128, 64, 16) == (
        "running_cap")


def test_a_server_that_does_not_start_or_a_request_that_never_fits() -> None:
    assert truth({"mem-fraction-static": 0.95}, 8) == "crashed"  # OOM at start
    b = binding_constraint(settings_from_flags({"mem-fraction-static": 0.57}), 8000, 128, 1)
    assert b.verdict == "errors" and "exceeds" in b.reason


def test_prefill_heavy_requests_saturate_the_step_model() -> None:
    flags = {"max-running-requests": 128, "chunked-prefill-size": 2048}
    b = binding_constraint(settings_from_flags(flags), 2048, 16, 32)
    assert b.verdict == "compute" and b.borderline is None
    assert b.marginal_gain < SATURATION_GAIN and b.saturation_batch <= 8
    # short requests at the same batch still gain from every sequence added
    assert truth(flags, 32, 64, 16) == "offered_load"


def test_the_marginal_gain_is_the_throughput_elasticity() -> None:
    model = SimModel(SimSettings(cuda_graph_max_bs=512, max_running_requests=512))
    gains = [marginal_gain(model, b, IN, OUT) for b in (1, 8, 32, 64, 128)]
    assert gains == sorted(gains, reverse=True) and gains[0] > 0.9 and gains[-1] < 0.4
    # doubling the batch to 2b multiplies throughput by about 1 + the gain at 2b
    for b in (16, 64):
        ratio = cycle_throughput(model, 2 * b, IN, OUT) / cycle_throughput(model, b, IN, OUT)
        assert ratio == pytest.approx(1 + marginal_gain(model, 2 * b, IN, OUT), abs=0.02)
    # a cached prefix is not prefilled again: the same batch is further from saturation
    assert marginal_gain(model, 32, 2112, 16, prefix_share=0.97) > marginal_gain(
        model, 32, 2112, 16)


def test_the_throttle_fault_is_throttled_over_what_binds_beneath() -> None:
    flags = {"max-running-requests": 32}
    b = binding_constraint(settings_from_flags(flags), 64, 16, 128, throttle_mhz=900)
    assert b.verdict == "throttled" and b.beneath == "running_cap"
    assert "900 of 1980 MHz" in b.reason and "x2.20" in b.reason
    low = binding_constraint(settings_from_flags(flags), 64, 16, 4, throttle_mhz=900)
    assert low.verdict == "throttled" and low.beneath == "offered_load"


def test_a_cell_near_a_boundary_is_borderline() -> None:
    s = settings_from_flags({"max-running-requests": 64})
    assert binding_constraint(s, IN, OUT, 70).borderline is not None  # c just above the cap
    assert binding_constraint(s, IN, OUT, 60).borderline is not None  # just below it
    assert binding_constraint(s, IN, OUT, 128).borderline is None
    # a cap just above the KV limit (39 requests): the optimistic admission takes 41, and
    # which of the two holds the batch changes as it goes
    for cap in (41, 44):
        b = binding_constraint(replace(s, mem_fraction_static=0.65, max_running_requests=cap),
                               1024, 64, 192)
        assert b.verdict == "kv_capacity" and b.kv_limit == 39 and b.borderline is not None
    far = replace(s, mem_fraction_static=0.65, max_running_requests=128)
    assert binding_constraint(far, 1024, 64, 192).borderline is None
