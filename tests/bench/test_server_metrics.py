"""The engine's metrics read into one vocabulary (issue 36 item 2): the real captures of vLLM
0.32 and llama.cpp 11434 (``tests/fixtures/engine-metrics``), the flavour found from the names,
old and new vLLM names, counters across resets, a window, ranks, an engine without metrics and a
bare URL that finds TensorRT-LLM's path. The hostile answers are in
``test_server_metrics_hostile.py``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from cleanslate.bench import VOCABULARY, MetricMap, MetricsObserver, parse_scrape, summarize
from cleanslate.bench._server_metrics import MetricSample
from cleanslate.engines import engine_class, get_engine, metric_maps
from tests._kit import free_port, served

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine-metrics"
VLLM = engine_class("vllm").metric_map
LLAMACPP = engine_class("llamacpp").metric_map
SGLANG = engine_class("sglang").metric_map
assert VLLM is not None and LLAMACPP is not None and SGLANG is not None


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def scrapes(name: str, metric_map: MetricMap) -> list[MetricSample]:
    """The ``# t=<time>`` blocks of a samples capture, parsed, with their times."""
    out = []
    for block in re.split(r"^# t=", read(name), flags=re.M)[1:]:
        stamp, _, text = block.partition("\n")
        sample, chosen = parse_scrape(text, (metric_map,), float(stamp))
        assert chosen is metric_map and sample.error is None
        out.append(sample)
    return out


def test_vllm_capture_reads_into_the_vocabulary_and_is_found_among_all_engines() -> None:
    sample, chosen = parse_scrape(read("vllm-0.32-after.txt"), metric_maps())
    assert chosen is VLLM and sample.error is None and sample.skipped == 0
    assert sample.series["prefix_queries"] == {"engine=0": 16735.0}
    assert sample.total("prefix_hits") == 0.0
    assert sample.total("generation_tokens") == 3184.0
    assert sample.total("prompt_tokens") == 16735.0
    assert sample.total("preemptions") == 0.0
    for key in ("running", "waiting", "waiting_capacity", "kv_usage"):
        assert sample.total(key) == 0.0


def test_vllm_idle_to_after_counts_the_level_and_its_hit_rate() -> None:
    idle, _ = parse_scrape(read("vllm-0.32-idle.txt"), (VLLM,), 0.0)
    after, _ = parse_scrape(read("vllm-0.32-after.txt"), (VLLM,), 1.0)
    summary = summarize([idle, after], flavour="vllm", url="u")
    assert summary.generation_tokens == 3184.0 and summary.prompt_tokens == 16735.0
    assert summary.preemptions == 0.0 and summary.prefix_cache_hit_rate == 0.0
    assert summary.counter_resets == 0 and summary.samples == 2 and summary.unreadable is None


def test_vllm_samples_during_a_level_show_the_cap_and_the_queue() -> None:
    samples = scrapes("vllm-0.32-samples.txt", VLLM)
    summary = summarize(samples, flavour="vllm", url="u")
    assert summary.samples == 11
    assert summary.running is not None and summary.running.max == 2.0
    assert summary.waiting is not None and summary.waiting.max == 6.0
    assert summary.waiting_capacity is not None and summary.waiting_capacity.max == 6.0
    assert summary.kv_usage is not None
    assert summary.kv_usage.max == pytest.approx(0.0002441704309608106)
    assert summary.running.mean == pytest.approx(2 / 11)
    assert summary.per_rank["running"]["engine=0"].max == 2.0


def test_llamacpp_capture_has_slots_and_deferred_but_no_kv_gauge() -> None:
    sample, chosen = parse_scrape(read("llamacpp-11434-after.txt"), metric_maps())
    assert chosen is LLAMACPP and sample.error is None
    # prompt_tokens_total leaves out the 1,840 tokens taken from the prompt cache: received
    # are both, and the cached ones are the prefix cache's hits
    assert sample.total("generation_tokens") == 20992
    assert sample.total("prompt_tokens") == sample.total("prefix_queries") == 55419 + 1840
    assert sample.total("prefix_hits") == 1840
    assert sample.total("kv_usage") is None
    samples = scrapes("llamacpp-11434-samples.txt", LLAMACPP)
    summary = summarize(samples, flavour="llamacpp", url="u")
    assert summary.samples == 40
    assert summary.running is not None and summary.running.max == 2
    assert summary.waiting is not None and summary.waiting.max == 6
    assert summary.kv_usage is None and summary.preemptions is None
    assert summary.generation_tokens == 20992 and summary.prompt_tokens == 55419 + 1840
    assert summary.prefix_cache_hit_rate == pytest.approx(1840 / 57259)


def test_a_sum_is_read_only_when_every_part_is_served() -> None:
    """llama.cpp's prompt tokens received are two counters added: a build without the cached
    one (or a series one of them lacks) gives no reading, not half of one."""
    alone = "llamacpp:prompt_tokens_total 100\nllamacpp:requests_processing 1\n"
    sample, _ = parse_scrape(alone, (LLAMACPP,))
    assert sample.total("prompt_tokens") is None and sample.total("running") == 1
    both = alone + "llamacpp:prompt_tokens_cached_total 20\n"
    assert parse_scrape(both, (LLAMACPP,))[0].total("prompt_tokens") == 120
    other = alone + 'llamacpp:prompt_tokens_cached_total{slot="1"} 20\n'
    assert parse_scrape(other, (LLAMACPP,))[0].total("prompt_tokens") is None


def test_old_vllm_names_are_read_and_the_new_one_wins_when_both_are_served() -> None:
    old = 'vllm:gpu_cache_usage_perc{engine="0"} 0.25\nvllm:num_requests_running 3\n'
    sample, chosen = parse_scrape(old, metric_maps())
    assert chosen is VLLM and sample.total("kv_usage") == 0.25
    both = old + 'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    sample, _ = parse_scrape(both, metric_maps())
    assert sample.total("kv_usage") == 0.5
    prefix_v1 = ("vllm:gpu_prefix_cache_hits_total 5\nvllm:gpu_prefix_cache_queries_total 10\n")
    a, _ = parse_scrape(prefix_v1, (VLLM,), 0.0)
    b, _ = parse_scrape(prefix_v1.replace("5", "35").replace("10", "70"), (VLLM,), 1.0)
    assert summarize([a, b], flavour="vllm", url="u").prefix_cache_hit_rate == 0.5


def sglang_text(running: dict[tuple[int, int], float], generated: float) -> str:
    lines = [f'sglang:num_running_reqs{{dp_rank="{dp}",tp_rank="{tp}"}} {v}'
             for (dp, tp), v in running.items()]
    lines.append(f'sglang:generation_tokens_total{{model_name="m"}} {generated}')
    lines.append('sglang:cache_hit_rate{model_name="m"} 0.25')
    return "\n".join(lines) + "\n"


def test_ranks_add_up_across_data_parallel_and_not_across_tensor_parallel() -> None:
    text = sglang_text({(0, 0): 10, (0, 1): 10, (1, 0): 7, (1, 1): 6}, 100)
    sample, chosen = parse_scrape(text, metric_maps())
    assert chosen is SGLANG
    assert sample.total("running") == 17
    summary = summarize([sample], flavour="sglang", url="u")
    assert set(summary.per_rank["running"]) == {"dp_rank=0,tp_rank=0", "dp_rank=0,tp_rank=1",
                                                "dp_rank=1,tp_rank=0", "dp_rank=1,tp_rank=1"}
    assert summary.prefix_cache_hit_rate == 0.25


def test_a_counter_that_goes_down_is_a_restart_from_zero() -> None:
    values = [100, 200, 5, 50, 80]
    samples = [parse_scrape(sglang_text({(0, 0): 1}, v), (SGLANG,), float(i))[0]
               for i, v in enumerate(values)]
    summary = summarize(samples, flavour="sglang", url="u")
    assert summary.generation_tokens == 100 + 5 + 45 + 30
    assert summary.counter_resets == 1


def test_the_window_takes_gauges_inside_it_and_counters_over_the_whole_level() -> None:
    running = [50, 1, 2, 3, 90]
    generated = [0, 10, 20, 30, 1000]
    samples = [parse_scrape(sglang_text({(0, 0): r}, g), (SGLANG,), float(i))[0]
               for i, (r, g) in enumerate(zip(running, generated, strict=True))]
    summary = summarize(samples, flavour="sglang", url="u", window=(0.5, 3.0))
    assert (summary.samples, summary.window_samples) == (5, 3)
    assert summary.running is not None and summary.gauge_window == "steady"
    assert (summary.running.mean, summary.running.max) == (2.0, 3.0)
    # from the baseline (t=0) to the final scrape (t=4): what the level did, preemptions
    # and tokens after the steady window included
    assert summary.generation_tokens == 1000
    # no scrape inside the window: the gauges of the whole level, said so
    whole = summarize(samples, flavour="sglang", url="u", window=(10.0, 11.0))
    assert whole.gauge_window == "level" and whole.running is not None
    assert whole.running.max == 90 and whole.unreadable is None
    none = summarize([], flavour="sglang", url="u", window=(0.0, 1.0))
    assert none.unreadable == "no scrape answered"


def test_transformers_has_no_metrics_and_says_so_once_without_a_request() -> None:
    adapter = get_engine("transformers")
    assert adapter.metrics_path is None and adapter.metric_map is not None

    async def go() -> None:
        # A closed port: any request would fail; none is made.
        observer = MetricsObserver(f"http://127.0.0.1:{free_port()}", (adapter.metric_map,),
                                   interval_s=0.01)
        await observer.start()
        assert await observer.sample() is None
        observation = await observer.stop()
        assert observation.samples == ()
        assert observation.summary.note is not None
        assert observation.summary.note.startswith("no engine metrics")
        assert observation.summary.unreadable is None

    asyncio.run(go())


@asynccontextmanager
async def serve(routes: dict[str, str]) -> AsyncIterator[str]:
    """A tiny server on 127.0.0.1 answering ``routes[path]`` as Prometheus text, 404 else."""

    async def handle(request: web.Request) -> web.Response:
        body = routes.get(request.path)
        if body is None:
            return web.Response(status=404, text="not found")
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    async with served(app) as url:
        yield url


def test_a_bare_url_finds_trtllm_on_its_own_path_and_the_loop_samples() -> None:
    text = ("trtllm_num_requests_running 4\ntrtllm_num_requests_waiting 9\n"
            "trtllm_kv_cache_utilization 0.5\ntrtllm_generation_tokens_total 7\n")

    async def go() -> None:
        async with serve({"/prometheus/metrics": text}) as url:
            observer = MetricsObserver(url, metric_maps(), interval_s=0.02)
            await observer.start()
            await asyncio.sleep(0.15)
            observation = await observer.stop()
        summary = observation.summary
        assert summary.flavour == "trtllm" and summary.url == url + "/prometheus/metrics"
        assert summary.unreadable is None and summary.samples >= 4
        assert summary.running is not None and summary.running.max == 4
        assert summary.waiting is not None and summary.waiting.mean == 9
        assert summary.generation_tokens == 0

    asyncio.run(go())


def test_sglang_without_enable_metrics_is_unreadable_with_the_hint() -> None:
    async def go() -> None:
        async with serve({}) as url:
            observer = MetricsObserver(url, (SGLANG,))
            await observer.start(loop=False)
            observation = await observer.stop()
        reason = observation.summary.unreadable
        assert reason is not None and "HTTP 404" in reason and "--enable-metrics" in reason

    asyncio.run(go())


def test_a_map_with_a_word_outside_the_vocabulary_is_refused_and_every_adapter_fits() -> None:
    with pytest.raises(ValueError, match="not in the metrics vocabulary: queue_depth"):
        MetricMap.build("x", {"queue_depth": ("x:queue",)})
    for candidate in metric_maps():
        assert candidate.names and candidate.path and candidate.path.startswith("/")
        assert set(candidate.names) <= set(VOCABULARY)
        assert not set(candidate.names) & set(candidate.unmapped)
    assert {m.flavour for m in metric_maps()} == {"vllm", "sglang", "llamacpp", "trtllm"}
