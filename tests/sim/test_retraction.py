"""The scheduler's optimistic admission and retraction (no processes: the engine in a loop)."""

from __future__ import annotations

import asyncio

from cleanslate.sim.engine import Engine, SimRequest
from cleanslate.sim.faults import Faults
from cleanslate.sim.model import INIT_NEW_TOKEN_RATIO, SimModel, SimSettings


def _small_engine(log: list[str]) -> Engine:
    # 998 MiB of KV cache: 3,193 tokens, five requests of 100 + 500 tokens at their end.
    settings = SimSettings(gpu_memory_mib=100_000, mem_fraction_static=0.81, time_scale=0.0005,
                           max_running_requests=16, chunked_prefill_size=2048, seed=1)
    return Engine(SimModel(settings), Faults(), on_crash=lambda batch: None, log=log.append)


def _run(engine: Engine, requests: list[SimRequest]) -> None:
    async def go() -> None:
        engine.start()
        for req in requests:
            engine.submit(req)
        while not all(r.finished for r in requests):
            assert engine.kv_free >= 0
            assert engine.kv_free + sum(r.held for r in requests) == engine.kv_capacity
            await asyncio.sleep(0.001)
        for req in requests:
            engine.finish(req)
        await engine.stop()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_optimistic_admission_retracts_and_every_request_still_finishes() -> None:
    log: list[str] = []
    engine = _small_engine(log)
    assert engine.kv_capacity == 3193
    requests = [SimRequest(f"r{i}", 100, 500, 0, True, i + 1) for i in range(12)]
    _run(engine, requests)
    # More were admitted than fit at their full length, so some had to be retracted ...
    assert engine.retracted > 0
    assert any("KV cache pool is full. Retract requests. #retracted_reqs:" in line
               for line in log)
    # ... and every request still wrote all its tokens, and the KV cache is all free again.
    assert all(r.generated == 500 and r.finish_reason == "length" for r in requests)
    assert engine.kv_free == engine.kv_capacity
    assert engine.completed == 12


def test_requests_that_fit_at_their_full_length_are_never_retracted() -> None:
    log: list[str] = []
    engine = _small_engine(log)
    requests = [SimRequest(f"r{i}", 500, 100, 0, True, i + 1) for i in range(5)]
    _run(engine, requests)
    assert engine.retracted == 0 and engine.new_token_ratio < INIT_NEW_TOKEN_RATIO
    assert all(r.generated == 100 for r in requests)
