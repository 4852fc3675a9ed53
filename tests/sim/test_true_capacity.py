"""The sim's true boundary under a median-ITL SLO (cleanslate.sim.model.true_capacity), checked
against the step-time formula it is built from; the running sim is checked against it in
tests/bench/test_find_max_sim.py."""

from __future__ import annotations

import math

import pytest

from cleanslate.sim.model import (
    SimModel,
    SimSettings,
    median_itl_ms,
    true_capacity,
)

PROMPT, OUTPUT = 16_064, 32


def model(**kw: object) -> SimModel:
    return SimModel(SimSettings(**{"tp_size": 2, "drift": 0.0, "cold_start_steps": 0,
                                   "noise_seed": 1, **kw}))  # type: ignore[arg-type]


def test_median_itl_is_the_decode_step_of_the_batch_times_the_run_factor() -> None:
    m = model(time_scale=0.5)
    # tp 2, CUDA graphs: 1.5 + (14 + 0.08 b + 0.07 ctx / 1000) / 2 + 0.6 x log2(2), ctx = b x
    # (prompt + output / 2); x run factor x time scale.
    for b in (1, 10, 30):
        step = 1.5 + (14 + 0.08 * b + 0.07 * b * (PROMPT + OUTPUT / 2) / 1000) / 2 + 0.6
        assert median_itl_ms(m, b, PROMPT, OUTPUT) == pytest.approx(
            step * m.run_factor * 0.5, rel=1e-3)
    assert m.run_factor != 1.0


def test_the_boundary_is_the_largest_concurrency_within_the_limit() -> None:
    m = model()
    for limit in (12.0, 16.0, 25.0, 28.0):
        c = true_capacity(m, limit, PROMPT, OUTPUT)
        assert median_itl_ms(m, c, PROMPT, OUTPUT) <= limit < median_itl_ms(
            m, c + 1, PROMPT, OUTPUT)
        # The closed form of the line above: (limit / factor - 9.1) / 0.6028 per request.
        assert c == math.floor((limit / m.run_factor - 9.1) / (0.04 + 0.035 * 16.08))
    assert true_capacity(m, 5.0, PROMPT, OUTPUT) == 0  # not even one client


def test_the_run_factor_moves_the_boundary() -> None:
    slow, fast = model(noise_seed=2), model(noise_seed=5)  # run factors 1.058 and 0.972
    assert slow.run_factor > 1.05 and fast.run_factor < 0.98
    assert true_capacity(slow, 25.0, PROMPT, OUTPUT) < true_capacity(fast, 25.0, PROMPT, OUTPUT)


def test_beyond_the_batch_limit_every_concurrency_passes() -> None:
    m = model()
    limit = m.batch_limit(PROMPT, OUTPUT)
    assert limit == 34  # the KV cache holds 34 requests of 16,096 tokens
    at_limit = median_itl_ms(m, limit, PROMPT, OUTPUT)
    assert median_itl_ms(m, 200, PROMPT, OUTPUT) == at_limit  # queued clients add no step
    assert true_capacity(m, at_limit + 0.01, PROMPT, OUTPUT, max_concurrency=512) == 512
    assert true_capacity(m, at_limit - 0.01, PROMPT, OUTPUT) == limit - 1


def test_a_crashing_batch_is_never_within() -> None:
    # CUDA graphs up to 16: a batch of 17 crashes, whatever the limit.
    m = SimModel(SimSettings(cuda_graph_max_bs=16, drift=0.0, noise_seed=1))
    assert true_capacity(m, 1000.0, 256, 32) == 16
    eager = SimModel(SimSettings(cuda_graph_max_bs=16, disable_cuda_graph=True, noise_seed=1))
    assert true_capacity(eager, 1000.0, 256, 32, max_concurrency=100) == 100


def test_unknown_statistics_and_servers_that_do_not_start() -> None:
    with pytest.raises(ValueError, match="median_itl_ms"):
        true_capacity(model(), 25.0, PROMPT, OUTPUT, key="p99_tpot_ms")
    assert true_capacity(model(mem_fraction_static=0.99), 25.0, PROMPT, OUTPUT) == 0
