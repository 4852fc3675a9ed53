"""The sim's prefix cache, and benchmarks that do not measure it by accident.

Every level gets prompts of its own (``bench._runner.level_seed``), so a server's prefix cache
serves nothing from one level to the next unless the workload shares prefixes on purpose
(``shared-prefix``). With the same prompts at two levels (what every level sent before), the
second level's prefill is served from the cache and its TTFT is not the server's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cleanslate.bench import BenchConfig, ClosedLoop, LevelResult, run_level
from cleanslate.bench._runner import level_seed
from cleanslate.bench._workloads import RandomWorkload, SharedPrefixWorkload, generate
from tests.sim._client import MODEL
from tests.sim.conftest import SimServers

RANDOM = RandomWorkload(input_len=2048, output_len=8)


def _levels(url: str, workload: object, *, same_prompts: bool = False) -> list[LevelResult]:
    config = BenchConfig(url=url, model=MODEL, workload=workload, num_prompts=16, seed=7)

    async def go() -> list[LevelResult]:
        prompts = generate(config.workload, 16, seed=7) if same_prompts else None
        out = []
        for c in (4, 8):
            out.append(await run_level(config, ClosedLoop(concurrency=c), prompts=prompts))
        return out

    return asyncio.run(go())


def test_each_level_has_prompts_of_its_own() -> None:
    assert level_seed(7, "c=4") != level_seed(7, "c=8") != level_seed(7, "warmup")
    assert level_seed(7, "c=4") == level_seed(7, "c=4")  # the same in every trial of a study


def test_two_levels_of_one_workload_get_no_cache_hits(sims: SimServers, figure: Any) -> None:
    server = sims.start("--tp-size", "1")
    one, two = _levels(server.url, RANDOM)
    assert one.failed == two.failed == 0
    assert one.cached_prompt_tokens == 0 and two.cached_prompt_tokens == 0
    assert one.ttft_ms.median is not None and two.ttft_ms.median is not None
    figure(f"sim TTFT p50 with distinct prompts: level 1 (c=4) {one.ttft_ms.median:.1f} ms, "
           f"level 2 (c=8) {two.ttft_ms.median:.1f} ms, cached tokens 0/0")
    # Level 2 queues more requests behind each prefill: it is not faster than level 1.
    assert two.ttft_ms.median >= 0.8 * one.ttft_ms.median


def test_the_same_prompts_at_two_levels_measure_the_cache(sims: SimServers,
                                                         figure: Any) -> None:
    server = sims.start("--tp-size", "1")
    one, two = _levels(server.url, RANDOM, same_prompts=True)
    assert one.cached_prompt_tokens == 0
    assert two.cached_prompt_tokens is not None and two.cached_prompt_tokens > 16 * 1900
    assert one.ttft_ms.median is not None and two.ttft_ms.median is not None
    figure(f"sim TTFT p50: level 1 {one.ttft_ms.median:.1f} ms, level 2 (cached) "
           f"{two.ttft_ms.median:.1f} ms")
    assert two.ttft_ms.median < one.ttft_ms.median


def test_shared_prefixes_hit_the_cache_when_the_workload_asks(sims: SimServers) -> None:
    server = sims.start("--tp-size", "1")
    workload = SharedPrefixWorkload(num_prefixes=2, prefix_len=512, suffix_len=64,
                                    output_len=8)
    one, _two = _levels(server.url, workload)
    assert one.cached_prompt_tokens is not None and one.cached_prompt_tokens >= 14 * 496


def test_without_the_radix_cache_nothing_is_reported(sims: SimServers) -> None:
    server = sims.start("--tp-size", "1", "--disable-radix-cache")
    one, two = _levels(server.url, RANDOM, same_prompts=True)
    assert one.cached_prompt_tokens is None and two.cached_prompt_tokens is None
