"""The performance model's properties and the fault syntax (no processes)."""

from __future__ import annotations

import itertools

import pytest

from cleanslate.errors import InputError
from cleanslate.sim.faults import Faults, parse_faults
from cleanslate.sim.model import (
    QUICKSTART_CONCURRENCY,
    QUICKSTART_FIXED,
    QUICKSTART_SPACE,
    QUICKSTART_WORKLOAD,
    SimModel,
    SimSettings,
    settings_from_flags,
)


def _estimates() -> dict[tuple[object, ...], float]:
    out = {}
    c = max(QUICKSTART_CONCURRENCY)
    names = list(QUICKSTART_SPACE)
    for values in itertools.product(*QUICKSTART_SPACE.values()):
        flags = dict(zip(names, values, strict=True))
        model = SimModel(settings_from_flags({**QUICKSTART_FIXED, **flags}))
        plan = model.memory_plan()
        est = model.estimate(c, QUICKSTART_WORKLOAD["input_len"], QUICKSTART_WORKLOAD["output_len"])
        feasible = not plan.oom_at_start and not model.crashes_at_batch(int(est["batch"]))
        out[values] = est["output_throughput"] if feasible else 0.0
    return out


def test_quickstart_space_has_failures_of_each_kind() -> None:
    kinds: dict[str, list[tuple[object, ...]]] = {"oom": [], "no_kv": [], "crash": []}
    names = list(QUICKSTART_SPACE)
    for values in itertools.product(*QUICKSTART_SPACE.values()):
        flags = {**QUICKSTART_FIXED, **dict(zip(names, values, strict=True))}
        model = SimModel(settings_from_flags(flags))
        plan = model.memory_plan()
        if plan.oom_at_start:
            kinds["oom"].append(values)
        elif plan.not_enough_for_kv:
            kinds["no_kv"].append(values)
        elif model.crashes_at_batch(int(model.estimate(256, 1024, 128)["batch"])):
            kinds["crash"].append(values)
            assert not model.crashes_at_batch(int(model.estimate(64, 1024, 128)["batch"]))
    assert all(k[0] == 0.95 for k in kinds["oom"]) and len(kinds["oom"]) == 24
    assert kinds["no_kv"] and kinds["crash"]
    assert all(k[1] is False for k in kinds["crash"])  # only with CUDA graphs on


def test_quickstart_optimum_is_interior() -> None:
    est = _estimates()
    best = max(est, key=lambda k: est[k])
    for name, value in zip(QUICKSTART_SPACE, best, strict=True):
        values = QUICKSTART_SPACE[name]
        if isinstance(values[0], bool):
            continue
        assert value not in (min(values), max(values)), (name, best)
    # ... and clearly better than any corner of the space.
    corners = [
        k
        for k in est
        if all(
            isinstance(v, bool) or v in (min(vs), max(vs))
            for v, vs in zip(k, QUICKSTART_SPACE.values(), strict=True)
        )
    ]
    assert est[best] > 1.05 * max(est[k] for k in corners)


def test_oom_threshold_near_0_93() -> None:
    assert not SimModel(SimSettings(mem_fraction_static=0.92)).memory_plan().oom_at_start
    assert SimModel(SimSettings(mem_fraction_static=0.94)).memory_plan().oom_at_start
    eager = SimSettings(mem_fraction_static=0.94, disable_cuda_graph=True)
    assert not SimModel(eager).memory_plan().oom_at_start
    assert (
        SimModel(SimSettings(mem_fraction_static=0.95, disable_cuda_graph=True))
        .memory_plan()
        .oom_at_start
    )


def test_memory_and_time_respond_to_the_flags() -> None:
    base = SimModel(SimSettings())
    assert SimModel(SimSettings(tp_size=2)).memory_plan().kv_capacity_tokens > 2 * (
        base.memory_plan().kv_capacity_tokens
    )
    assert SimModel(SimSettings(max_running_requests=512)).memory_plan().kv_capacity_tokens < (
        base.memory_plan().kv_capacity_tokens
    )
    eager = SimModel(SimSettings(disable_cuda_graph=True))
    assert eager.decode_step_ms(8, 8000) > base.decode_step_ms(8, 8000) + 5
    assert base.decode_step_ms(200, 1000) > base.decode_step_ms(100, 1000)
    assert base.crashes_at_batch(161) and not eager.crashes_at_batch(161)
    assert SimModel(SimSettings(tp_size=4)).decode_step_ms(64, 64000) < base.decode_step_ms(
        64, 64000
    )


def test_noise_is_seeded() -> None:
    a = [SimModel(SimSettings(seed=3)).noisy_seconds(10) for _ in range(3)]
    b = [SimModel(SimSettings(seed=3)).noisy_seconds(10) for _ in range(3)]
    assert a == b
    m = SimModel(SimSettings(seed=3))
    assert len({m.noisy_seconds(10) for _ in range(5)}) == 5


def test_fault_syntax() -> None:
    f = parse_faults(
        ["crash-at-concurrency=8", "nan", "slow-release 3", "leave-port:9000", "orphan-grandchild"]
    )
    assert f == Faults(
        crash_at_concurrency=8, nan=0, slow_release=3.0, leave_port=9000, orphan_grandchild=2048
    )
    assert f.active() == [
        "crash-at-concurrency=8",
        "nan",
        "orphan-grandchild=2048",
        "slow-release=3.0",
        "leave-port=9000",
    ]
    for bad in ["bogus", "nan=x", "hang-after", "hang-after=x", "slow-start=-1"]:
        with pytest.raises(InputError):
            parse_faults([bad])
