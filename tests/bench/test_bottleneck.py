"""The bottleneck verdict (``cleanslate.bench._bottleneck``): each rule from levels that carry
the figures a real level carries (the sim's, vLLM's, an H100's telemetry), the rules' order,
``unknown`` with what was missing, each engine's advice naming its own flag, and the sim capped
at 64 end to end: the load it is sent at c=16, the cap at c=256."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cleanslate.engines  # noqa: F401  (registers the adapters' advice books)
from cleanslate.bench import (
    BenchConfig,
    Bottleneck,
    CapacitySearch,
    CapacitySLO,
    ClosedLoop,
    GaugeStats,
    GpuTelemetry,
    LevelResult,
    ObserveOptions,
    OpenLoop,
    RandomWorkload,
    ServerConfig,
    ServerMetrics,
    SharedPrefixWorkload,
    Stats,
    diagnose,
    find_max,
    run_benchmark,
)
from cleanslate.bench._bottleneck import (
    BOTTLENECK_KINDS,
    RULES,
    AdviceEntry,
    advice_book,
    diagnosed,
)
from cleanslate.bench._observed import AT_MAX_SHARE, merge_server_metrics
from cleanslate.engines import get_engine
from tests.sim._client import MODEL
from tests.sim.conftest import SimServer, SimServers


def gauge(mean: float, top: float, share: float | None = None) -> GaugeStats:
    return GaugeStats(mean=mean, max=top, share_at_max=share)


def metrics(running: GaugeStats, waiting: GaugeStats, *, kv: GaugeStats | None = None,
            flavour: str = "sglang", **more: Any) -> ServerMetrics:
    return ServerMetrics(flavour=flavour, url="http://127.0.0.1:30000/metrics", samples=40,
                         window_samples=30, running=running, waiting=waiting,
                         kv_usage=kv if kv is not None else gauge(0.02, 0.03), **more)


def level(c: int, *, tput: float, ttft: float, tpot: float, server: ServerMetrics | None = None,
          gpu: tuple[GpuTelemetry, ...] | None = None, in_flight: int | None = None,
          failed: int = 0, partial: bool = False, cpu: float = 0.2, prompts: int = 512,
          load: ClosedLoop | OpenLoop | None = None, in_tokens: int = 32, out_tokens: int = 8,
          **more: Any) -> LevelResult:
    """A closed-loop level of ``prompts`` requests of ``in_tokens`` prompt and ``out_tokens``
    output tokens, its figures as ``run_benchmark`` computes them: throughputs, latency
    medians, Little's law in flight."""
    e2e = ttft + tpot * (out_tokens - 1)
    completed = prompts - failed
    req_tput = tput / out_tokens
    duration = completed / req_tput
    return LevelResult(
        label=f"c={c}", load=load or ClosedLoop(concurrency=c), completed=completed,
        failed=failed, sent=prompts, num_prompts=prompts, duration=duration,
        total_input_tokens=in_tokens * completed, total_output_tokens=out_tokens * completed,
        request_throughput=req_tput, output_throughput=tput,
        total_token_throughput=tput * 5, request_goodput=None, good_requests=None,
        max_concurrency=c, max_concurrent_requests=in_flight if in_flight is not None else c,
        request_rate=getattr(load, "rate", None), burstiness=None,
        achieved_request_rate=req_tput,
        ttft_ms=Stats(count=completed, mean=ttft, median=ttft),
        tpot_ms=Stats(count=completed, mean=tpot, median=tpot),
        itl_ms=Stats(count=completed, mean=tpot, median=tpot),
        e2el_ms=Stats(count=completed, mean=e2e, median=e2e),
        errors={"http_503": failed} if failed else {},
        output_tokens_source="server", input_tokens_source="server",
        partial=partial, partial_reason="the server stopped answering" if partial else None,
        client_cpu_s=cpu * duration, client_wall_s=duration, client_cpu_util=cpu,
        error_rate=failed / prompts, valid=not partial and failed / prompts <= 0.01,
        server_metrics=server, gpu=gpu, **more)


def observed(lv: LevelResult, **update: Any) -> LevelResult:
    """``lv`` with its engine metrics changed by ``update``."""
    assert lv.server_metrics is not None
    return lv.model_copy(update={"server_metrics": lv.server_metrics.model_copy(update=update)})


SIM_CONFIG = ServerConfig(
    url="http://127.0.0.1:30000", engine="sim", flavour="sglang",
    in_effect={"max_running_requests": 64, "cuda_graph_max_bs": 160,
               "mem_fraction_static": 0.88, "chunked_prefill_size": 8192, "dp_size": 1},
    sources={"max_running_requests": "GET /server_info "
             "internal_states[0].effective_max_running_requests_per_dp"})

#: The sim capped at 64 (test_observe_sim's run): c=16 runs what it is sent, c=256 queues.
C16 = level(16, tput=2437, ttft=17.1, tpot=4.54,
            server=metrics(gauge(13.7, 16, 0.81), gauge(2.3, 15, 0.13)))
C256 = level(256, tput=5291, ttft=247.5, tpot=7.75,
             server=metrics(gauge(64, 64, 1.0), gauge(189.3, 192, 0.83)))


def h100(*, util: float = 98, clock: float = 1980, events: dict[str, float] | None = None
         ) -> GpuTelemetry:
    return GpuTelemetry(index=0, name="NVIDIA H100 80GB HBM3", source="nvml", samples=40,
                        window_samples=30, utilization_pct=gauge(util, 100),
                        power_w=gauge(610, 700), sm_clock_mhz=gauge(clock, clock),
                        max_sm_clock_mhz=1980, clock_events=events or {})


# -- each rule -------------------------------------------------------------------------------


def test_the_cap_is_clear_when_running_sits_at_the_configured_cap_with_a_queue() -> None:
    b = diagnose(C256, [C16], SIM_CONFIG)
    assert (b.verdict, b.confidence, b.rule) == ("running_cap", "clear", "running_cap")
    assert b.figures["cap"] == 64 and b.figures["waiting_mean"] == pytest.approx(189.3)
    assert b.figures["ttft_growth"] == pytest.approx(247.5 / 17.1)
    assert "running 64 of cap 64 (max_running_requests in effect) for 100% of the window" \
        in b.evidence[0]
    assert b.advice[0].flag == "--max-running-requests" and b.advice[0].direction == "raise"
    assert b.advice[0].text.startswith("raise --max-running-requests above 64")


def test_without_the_configuration_the_plateau_is_the_cap() -> None:
    b = diagnose(C256, [C16], None, "sglang")
    assert (b.verdict, b.confidence) == ("running_cap", "clear")  # KV 3 %: not a full cache
    assert "the plateau 64" in b.evidence[0] and "the request cap in effect" in b.missing
    no_kv = observed(C256, kv_usage=None)
    assert diagnose(no_kv, [C16]).confidence == "likely"
    # the advice names the flag without a value it does not know
    assert b.advice[0].text.startswith("raise --max-running-requests: ")


def test_a_cap_touched_now_and_then_does_not_hold_the_level() -> None:
    brushed = level(256, tput=5291, ttft=247.5, tpot=7.75,
                    server=metrics(gauge(40, 64, 0.1), gauge(30, 120, 0.1)))
    assert diagnose(brushed, [C16], SIM_CONFIG).verdict != "running_cap"


VLLM_CAP2 = ServerConfig(
    url="http://127.0.0.1:8000", engine="vllm", flavour="vllm", in_effect={"max_num_seqs": 2},
    sources={"max_num_seqs": "the log's non-default args"})


def test_the_cap_binds_when_the_queue_is_held_before_the_engine_s_scheduler() -> None:
    """vLLM's CPU build with --max-num-seqs 2 at c=16 on 2 loaded cores: its API server,
    starved, held most of the 16 before the scheduler, which counted under one waiting. The
    cap configured, pinned, and the client's 16 in flight are the queue: running_cap."""
    def at16(waiting: float) -> LevelResult:
        # 16 in flight by Little's law: 2.5 requests/s x 6.4 s end to end
        return level(16, tput=640, ttft=2600, tpot=15, out_tokens=256, prompts=40,
                     server=metrics(gauge(2, 2, 1.0), gauge(waiting, 1, 0.4), flavour="vllm",
                                    kv=gauge(0.0, 0.0)))
    b = diagnose(at16(0.4), [], VLLM_CAP2, "vllm")
    assert (b.verdict, b.confidence) == ("running_cap", "clear"), b
    assert b.evidence[0].startswith("running 2 of cap 2 (max_num_seqs in effect) for 100% "
                                    "of the window, 0 waiting on average"), b.evidence
    assert b.evidence[1].startswith("the client kept 16.0 in flight on average: 13.6 more "
                                    "than ran or waited in the engine"), b.evidence
    assert b.figures["held_before_engine"] == pytest.approx(13.6)
    assert b.advice[0].flag == "--max-num-seqs"
    # with the queue in the engine's own count the line is not needed, nor the figure
    seen = diagnose(at16(13.5), [], VLLM_CAP2, "vllm")
    assert seen.verdict == "running_cap" and "held_before_engine" not in seen.figures
    assert len(seen.evidence) == 1, seen.evidence
    # at the cap's own load (2 of 2) nothing is held back: not the cap
    at2 = level(2, tput=80, ttft=100, tpot=25, out_tokens=256, prompts=40,
                server=metrics(gauge(2, 2, 1.0), gauge(0.0, 0.0, 1.0), flavour="vllm",
                               kv=gauge(0.0, 0.0)))
    assert diagnose(at2, [], VLLM_CAP2, "vllm").verdict != "running_cap"
    # without the cap configured a plateau with nothing waiting is not read as one
    assert diagnose(at16(0.4), [], None, "vllm").verdict != "running_cap"


def test_the_cap_is_likely_from_the_client_alone_when_the_load_is_above_it() -> None:
    blind = C256.model_copy(update={"server_metrics": None})
    b = diagnose(blind, [C16.model_copy(update={"server_metrics": None})], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("running_cap", "likely")
    assert "256 requests asked to be in flight, the engine runs at most 64" in b.evidence[0]
    assert "engine metrics (running, waiting)" in b.missing


def test_the_load_the_server_is_sent_is_the_limit_below_the_cap() -> None:
    """Clear once a level before shows that more load still adds throughput; at the first
    level likely: a batch already saturated also runs everything it is sent."""
    c8 = level(8, tput=1300, ttft=15, tpot=4.3,
               server=metrics(gauge(7.5, 8, 0.8), gauge(0.4, 6, 0.05)))
    b = diagnose(C16, [c8], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("offered_load", "clear")
    assert b.figures["running_mean"] == pytest.approx(13.7) and b.figures["target"] == 16
    # step 4.3 -> 4.54 ms for a batch 7.5 -> 13.7: its fixed part is 88 % of the step
    assert b.figures["marginal_gain"] == pytest.approx(0.88, abs=0.01)
    assert b.advice[0].flag == "--concurrency" and b.advice[0].direction == "raise"
    first = diagnose(C16, [], SIM_CONFIG)
    assert (first.verdict, first.confidence) == ("offered_load", "likely")
    assert "a level before with a smaller batch" in first.missing


def test_a_queue_beside_a_batch_at_the_whole_load_is_the_offered_load() -> None:
    """CI's run of the sim capped at 64, c=16, on 2 busy cores: 16 ran for 56 % of the window,
    and waves of up to 16 waited between steps (4.1 on average, above a quarter of the
    batch). The closed loop sent no more than 16: that is what held it, not the GPU's work."""
    late = observed(C16, running=gauge(11.9, 16, 0.56), waiting=gauge(4.1, 16, 0.05))
    b = diagnose(late, [], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("offered_load", "likely"), b
    assert b.evidence[1] == ("all 16 ran for 56% of the window; the waiting were sent between "
                             "a finish and the step that admits them")
    assert "what holds the running count at its plateau" not in b.missing
    # below the whole load for most of the window, the same queue waits for prefill
    short = observed(C16, running=gauge(11.9, 16, 0.3), waiting=gauge(4.1, 16, 0.05))
    assert diagnose(short, [], SIM_CONFIG).verdict == "compute"
    # more in the engine than the loop sends is another client's load: no longer this case
    shared = observed(C16, running=gauge(11.9, 16, 0.56), waiting=gauge(9.0, 16, 0.05))
    assert diagnose(shared, [], SIM_CONFIG).verdict == "unknown"


def test_an_open_loop_the_server_keeps_up_with_is_the_offered_load() -> None:
    paced = level(8, tput=800, ttft=20, tpot=5, load=OpenLoop(rate=100.0),
                  server=metrics(gauge(5.2, 9, 0.1), gauge(0.1, 2)),
                  schedule_lag_ms=Stats(count=500, median=0.4, p99=2.1, max=4))
    b = diagnose(paced, [], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("offered_load", "clear")
    assert b.figures["target"] == pytest.approx(100 * 0.055)  # Little's law: 100/s x 55 ms
    blind = paced.model_copy(update={"server_metrics": None})
    assert (diagnose(blind).verdict, diagnose(blind).confidence) == ("offered_load", "likely")


def test_a_full_kv_cache_with_requests_held_for_room_is_kv_capacity() -> None:
    vllm = ServerConfig(engine="vllm", flavour="vllm",
                        in_effect={"max_num_seqs": 256, "gpu_memory_utilization": 0.9})
    full = level(128, tput=3100, ttft=900, tpot=30, server=metrics(
        gauge(96, 118, 0.2), gauge(32, 60, 0.1), kv=gauge(0.97, 1.0, 0.6), flavour="vllm",
        waiting_capacity=gauge(30, 58), preemptions=41))
    b = diagnose(full, [], vllm)
    assert (b.verdict, b.confidence) == ("kv_capacity", "clear")
    assert b.evidence[0].startswith("KV cache 100% full; 30 waiting for room, 41 preempted")
    assert [a.flag for a in b.advice][:2] == ["--gpu-memory-utilization", "--kv-cache-dtype"]
    assert b.advice[0].text.startswith("raise --gpu-memory-utilization above 0.9")
    # retractions without a usage figure: likely
    blind = observed(full, kv_usage=None)
    assert (diagnose(blind, [], vllm).verdict, diagnose(blind, [], vllm).confidence) == (
        "kv_capacity", "likely")


def test_a_cache_without_room_for_one_more_request_is_kv_capacity_below_90_percent() -> None:
    """The sim's figures with 8,000-token prompts in a 19,835-token cache: two run at 81 %,
    the rest wait, far below the cap of 512."""
    config = SIM_CONFIG.model_copy(update={"in_effect": {
        "max_running_requests": 512, "max_total_num_tokens": 19835,
        "mem_fraction_static": 0.6}})
    long = level(8, tput=2782, ttft=135.4, tpot=0.5, prompts=16, in_tokens=8000, out_tokens=64,
                 server=metrics(gauge(2, 2, 1.0), gauge(6, 6, 1.0), kv=gauge(0.81, 0.811, 1.0)))
    b = diagnose(long, [], config)
    assert (b.verdict, b.confidence) == ("kv_capacity", "clear")
    assert b.figures["kv_free_tokens"] == pytest.approx(0.189 * 19835)
    assert b.evidence[0].startswith("KV cache 81% full: 3,749 tokens free, a request needs "
                                    "8,064; 6 waiting while the batch runs below its cap")
    # the same usage with room for one more request is not the cache
    roomy = config.model_copy(update={"in_effect": {**config.in_effect,
                                                    "max_total_num_tokens": 60000}})
    unknown = diagnose(long, [], roomy)
    assert unknown.verdict == "unknown"
    assert unknown.evidence[1] == "running 2.0 on average (max 2), 6.0 waiting, KV 81%"


def test_a_flat_throughput_on_a_half_busy_gpu_is_not_compute_and_says_so() -> None:
    # transformers serve on an H100 (docs/validation/h100-observe.md, call 3): no engine
    # metrics, throughput x1.05 for a batch x3.9, the GPU busy 58 %
    small = level(64, tput=992, ttft=300, tpot=60, gpu=(h100(util=53),))
    big = level(256, tput=1040, ttft=900, tpot=230, gpu=(h100(util=58),))
    b = diagnose(big, [small], None, "transformers")
    assert b.verdict == "unknown"
    assert any("while the GPU was busy 58 % (below 90 %): not the GPU's compute" in line
               for line in b.evidence)
    assert b.figures["gpu_util_pct"] == 58 and b.figures["marginal_gain"] < 0.5
    # a busy GPU with the same figures is compute (likely)
    busy = big.model_copy(update={"gpu": (h100(util=97),)})
    assert diagnose(busy, [small], None, "transformers").verdict == "compute"


def test_a_step_time_growing_with_the_batch_is_compute() -> None:
    vllm = ServerConfig(engine="vllm", flavour="vllm", in_effect={"max_num_seqs": 256})
    small = level(32, tput=3200, ttft=60, tpot=10, server=metrics(
        gauge(31.5, 32, 0.9), gauge(0.2, 2), flavour="vllm"), gpu=(h100(util=70),))
    big = level(128, tput=4300, ttft=140, tpot=29.8, server=metrics(
        gauge(126, 128, 0.9), gauge(1.2, 6), flavour="vllm"), gpu=(h100(util=99),))
    b = diagnose(big, [small], vllm)
    assert (b.verdict, b.confidence) == ("compute", "clear")
    assert b.figures["step_growth"] == pytest.approx(2.98)
    assert b.figures["marginal_gain"] < 0.5 and b.figures["gpu_util_pct"] == 99
    assert b.advice[0].flag == "--max-num-batched-tokens"
    # the client's figures alone: likely
    blind = [lv.model_copy(update={"server_metrics": None}) for lv in (small, big)]
    assert (diagnose(blind[1], blind[:1], vllm).verdict,
            diagnose(blind[1], blind[:1], vllm).confidence) == ("compute", "likely")


def test_a_queue_below_the_cap_with_room_in_the_cache_is_compute() -> None:
    """The sim with 1,024-token prefill chunks at c=16 (benchmarks/diagnosis.py, chunk1024):
    5 wait on average beside 11 running under a cap of 128 with the cache 11 % full: they wait
    for their prefill."""
    config = SIM_CONFIG.model_copy(update={"in_effect": {"max_running_requests": 128,
                                                         "chunked_prefill_size": 1024}})
    prefill = level(16, tput=822, ttft=180, tpot=11.6, prompts=80, in_tokens=2048,
                    out_tokens=64, server=metrics(gauge(11.06, 16, 0.3), gauge(4.94, 15, 0.1),
                                                  kv=gauge(0.08, 0.11, 0.2)))
    b = diagnose(prefill, [], config)
    assert (b.verdict, b.confidence) == ("compute", "clear")
    assert b.evidence[0] == ("4.9 waiting while running 11.1 on average (max 16) below cap 128, "
                             "KV 11%: the requests wait for the GPU's work (prefill), not for "
                             "room")
    assert "--chunked-prefill-size" in [a.flag for a in b.advice]


def test_requests_in_flight_that_queue_are_not_compute_without_the_engines_figures() -> None:
    """The sim capped at 64, c=16 then c=256, seen by the client alone and without the
    configuration: in flight x16, TPOT x1.7, throughput x2.2: most of the 256 wait, which the
    client cannot tell from a cap or a full cache."""
    blind = [lv.model_copy(update={"server_metrics": None}) for lv in (C16, C256)]
    b = diagnose(blind[1], blind[:1])
    assert b.verdict == "unknown" and "engine metrics (running, waiting)" in b.missing


def test_a_batch_that_still_scales_is_the_offered_load_not_compute() -> None:
    small = level(32, tput=3200, ttft=60, tpot=10)
    big = level(128, tput=11500, ttft=70, tpot=11)
    b = diagnose(big, [small])
    assert (b.verdict, b.confidence) == ("offered_load", "likely")
    assert b.figures["marginal_gain"] > 0.5


def test_a_client_that_did_not_hold_its_load_is_client() -> None:
    short = level(256, tput=5000, ttft=40, tpot=5, in_flight=180, cpu=0.97)
    b = diagnose(short, [], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("client", "likely")
    assert b.evidence == ("the client had at most 180 requests in flight of the 256 asked",
                          "the client used 97% of a CPU core (bound 90%)")
    late = level(64, tput=4000, ttft=40, tpot=5, load=OpenLoop(rate=500.0),
                 schedule_lag_ms=Stats(count=100, median=8, p99=35, max=60))
    assert diagnose(late).verdict == "client"
    # late because its own cap was full: the load's doing, not the client's
    capped = level(64, tput=4000, ttft=40, tpot=5,
                   load=OpenLoop(rate=500.0, max_concurrency=64),
                   schedule_lag_ms=Stats(count=100, median=8, p99=35, max=60))
    assert diagnose(capped).verdict != "client"


def test_a_gpu_that_slowed_its_clock_is_throttled_and_says_what_else_held() -> None:
    hot = C256.model_copy(update={"gpu": (h100(clock=1100,
                                               events={"hw_thermal_slowdown": 0.8}),)})
    b = diagnose(hot, [C16], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("throttled", "likely")
    assert b.evidence == ("GPU 0: hw_thermal_slowdown 80% of samples; SM clock 1100 of "
                          "1980 MHz",)
    assert b.also == ("running_cap",)
    # the power cap at full clocks is a busy GPU, not a throttled one
    busy = C256.model_copy(update={"gpu": (h100(events={"sw_power_cap": 0.9}),)})
    assert diagnose(busy, [C16], SIM_CONFIG).verdict == "running_cap"
    # a clock well below max while busy, without an event
    slow = C256.model_copy(update={"gpu": (h100(clock=1400),)})
    assert diagnose(slow, [C16], SIM_CONFIG).verdict == "throttled"


def test_a_hit_rate_far_above_the_workload_design_is_cache_inflated() -> None:
    seen_before = observed(C16, prefix_cache_hit_rate=0.62)
    b = diagnose(seen_before, [], SIM_CONFIG, workload=RandomWorkload(input_len=32))
    assert (b.verdict, b.confidence) == ("cache_inflated", "clear")
    assert b.figures == {"prefix_cache_hit_rate": 0.62, "designed_share": 0.0}
    assert [a.flag for a in b.advice] == ["--disable-radix-cache", "--seed"]
    # a shared-prefix workload is built to reuse its prefix: 89 % is its design
    shared = SharedPrefixWorkload(prefix_len=1024, suffix_len=128)
    by_design = observed(C16, prefix_cache_hit_rate=0.88)
    assert diagnose(by_design, [], SIM_CONFIG, workload=shared).verdict == "offered_load"


def test_dp_ranks_far_apart_are_dp_imbalance() -> None:
    ranks = {"running": {"dp_rank=0": gauge(60, 64), "dp_rank=1": gauge(9, 14)}}
    uneven = level(96, tput=6000, ttft=80, tpot=9, server=metrics(
        gauge(69, 78), gauge(4, 20), per_rank=ranks))
    b = diagnose(uneven, [], None, "sglang")
    assert (b.verdict, b.confidence) == ("dp_imbalance", "clear")
    assert b.evidence == ("running 60.0 on dp_rank=0 but 9.0 on dp_rank=1 (2 ranks)",)
    assert b.advice[0].flag == "--load-balance-method"


def test_a_level_that_ended_early_is_crashed_before_its_errors() -> None:
    lost = level(512, tput=300, ttft=900, tpot=30, failed=200, partial=True, prompts=600)
    b = diagnose(lost, [C16], SIM_CONFIG)
    assert (b.verdict, b.confidence) == ("crashed", "clear")
    assert b.also[0] == "errors"
    assert "the server stopped answering" in b.evidence[0]


def test_failed_requests_above_the_run_allowance_are_errors() -> None:
    failing = level(64, tput=4000, ttft=40, tpot=5, failed=26)
    b = diagnose(failing, [], SIM_CONFIG, max_error_rate=0.01)
    assert (b.verdict, b.rule) == ("errors", "errors")
    assert b.evidence == ("26 of 512 requests failed (5.1%, allowed 1.0%): http_503 26",)
    assert diagnose(failing, [], SIM_CONFIG, max_error_rate=0.1).verdict != "errors"


def test_nothing_to_read_is_unknown_and_says_what_was_missing() -> None:
    bare = C16.model_copy(update={"server_metrics": None})
    b = diagnose(bare)
    assert (b.verdict, b.confidence, b.rule) == ("unknown", "unknown", "unknown")
    assert b.missing == ("GPU telemetry", "engine metrics (running, waiting)",
                         "the request cap in effect", "a level before with a smaller batch")
    assert b.summary().startswith("unknown (unknown): missing: GPU telemetry")
    assert [a.flag for a in b.advice] == ["--concurrency"]  # measure more, with metrics
    # an engine without an endpoint ("no engine metrics") reads as no metrics
    noted = C16.model_copy(update={"server_metrics": ServerMetrics(note="no engine metrics")})
    assert diagnose(noted).verdict == "unknown"
    # the general advice names SGLang's and llama.cpp's switches; an engine without an
    # endpoint says what it can give instead
    assert "SGLang" in b.advice[0].text
    own = diagnose(noted, engine="transformers").advice[0].text
    assert "no metrics endpoint" in own and "SGLang" not in own


def test_the_rules_run_in_the_documented_order() -> None:
    assert [name for name, _ in RULES] == [
        "crashed", "errors", "client", "throttled", "cache_inflated", "dp_imbalance",
        "running_cap", "kv_capacity", "compute", "offered_load"]
    assert set(BOTTLENECK_KINDS) == {name for name, _ in RULES} | {"unknown"}


# -- advice ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "config", "verdict", "flag", "text"), [
    ("sglang", {"max_running_requests": 64}, "running_cap", "--max-running-requests",
     "raise --max-running-requests above 64"),
    ("sim", {"mem_fraction_static": 0.88}, "kv_capacity", "--mem-fraction-static",
     "raise --mem-fraction-static above 0.88"),
    ("vllm", {"max_num_seqs": 2}, "running_cap", "--max-num-seqs",
     "raise --max-num-seqs above 2"),
    ("llamacpp", {"total_slots": 2}, "running_cap", "--parallel", "raise --parallel above 2"),
    ("llamacpp", {}, "kv_capacity", "--ctx-size", "raise --ctx-size: "),
    ("trtllm", {}, "running_cap", "--max_batch_size", "raise --max_batch_size: "),
    ("transformers", {}, "running_cap", "--continuous-batching",
     "enable --continuous-batching: "),
])
def test_each_engine_advises_its_own_flag(engine: str, config: dict[str, Any], verdict: str,
                                          flag: str, text: str) -> None:
    book = get_engine(engine).advice
    assert book is not None
    advice = book[verdict][0].render(ServerConfig(in_effect=config))
    assert advice.flag == flag and advice.text.startswith(text)


def test_an_advice_book_refuses_a_verdict_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="not a bottleneck verdict: capped"):
        advice_book({"capped": (AdviceEntry("--x", "raise", "why"),)})


# -- stored --------------------------------------------------------------------------------


def test_a_diagnosed_level_round_trips_and_an_older_one_reads_without() -> None:
    done = diagnosed(C256, [C16], SIM_CONFIG)
    back = LevelResult.model_validate(json.loads(done.model_dump_json()))
    assert back.bottleneck == done.bottleneck and isinstance(back.bottleneck, Bottleneck)
    old = json.loads(C256.model_dump_json())
    del old["bottleneck"]
    for g in ("running", "waiting", "kv_usage"):
        old["server_metrics"][g].pop("share_at_max")
    read = LevelResult.model_validate(old)
    assert read.bottleneck is None and read.server_metrics is not None
    assert read.server_metrics.running is not None and read.server_metrics.running.share_at_max \
        is None
    # a level stored before share_at_max: the mean at the max stands for it
    assert diagnose(read, [C16], SIM_CONFIG).verdict == "running_cap"


def test_share_at_max_pools_over_repeats() -> None:
    a = metrics(gauge(64, 64, 1.0), gauge(180, 192, 0.5))
    b = metrics(gauge(60, 63, 0.5), gauge(150, 170, 0.5))
    pooled = merge_server_metrics([a, b])
    assert pooled is not None and pooled.running is not None
    # 63 is within AT_MAX_SHARE of 64: the second repeat's samples at its max count at 64
    assert 64 * AT_MAX_SHARE <= 63
    assert pooled.running.share_at_max == pytest.approx(0.75)
    assert pooled.waiting is not None and pooled.waiting.share_at_max == pytest.approx(0.25)


# -- the sim, end to end ---------------------------------------------------------------------

CAP = 64
FAST = ["--time-scale", "0.25", "--drift", "0", "--cold-start", "1", "--cold-start-decode", "1",
        "--noise-seed", "1", "--decode-log-interval", "1000"]


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    argv = get_engine("sim").build_argv(MODEL, 1, {"max-running-requests": CAP})
    servers = SimServers(tmp_path_factory.mktemp("capped"))
    try:
        yield servers.start("--model-path", MODEL, *argv[argv.index("--port") + 2:], *FAST)
    finally:
        servers.end_all()


@pytest.mark.slow  # about 3 s: 640 requests
def test_the_sim_capped_at_64_is_bound_by_its_load_at_16_and_by_its_cap_at_256(
        capped: SimServer, figure: Any) -> None:
    config = BenchConfig(url=capped.url, model=MODEL,
                         workload=RandomWorkload(input_len=32, output_len=8), num_prompts=320,
                         loads=(ClosedLoop(concurrency=16), ClosedLoop(concurrency=256)),
                         observe=ObserveOptions(interval_s=0.05))
    low, high = asyncio.run(run_benchmark(config)).levels
    assert low.bottleneck is not None and high.bottleneck is not None
    assert low.bottleneck.verdict in ("offered_load", "compute"), low.bottleneck
    assert (high.bottleneck.verdict, high.bottleneck.confidence) == ("running_cap", "clear"), \
        high.bottleneck
    assert high.bottleneck.figures["cap"] == CAP
    assert high.bottleneck.advice[0].flag == "--max-running-requests"
    assert high.bottleneck.advice[0].text.startswith("raise --max-running-requests above 64")
    figure(f"c=16: {low.bottleneck.summary()}")
    figure(f"c=256: {high.bottleneck.summary()}")


@pytest.mark.slow  # about 2 s: three probes
def test_each_find_max_probe_carries_its_verdict(capped: SimServer, figure: Any) -> None:
    """A capacity search from c=32 under an SLO every probe meets (median TTFT 10 s): it
    doubles to 64 and 128; above the cap of 64 requests queue behind it."""
    config = BenchConfig(url=capped.url, model=MODEL, num_prompts=256,
                         workload=RandomWorkload(input_len=32, output_len=8),
                         observe=ObserveOptions(interval_s=0.05))
    search = CapacitySearch("concurrency", CapacitySLO(limits={"median_ttft_ms": 10_000}),
                            start=32, max_load=256, max_probes=3)
    result = asyncio.run(find_max(config, search))
    verdicts = {p.label: p.level.bottleneck for p in result.probes if p.level is not None}
    assert list(verdicts) == ["c=32", "c=64", "c=128"]
    assert all(b is not None for b in verdicts.values())
    above = [(label, b) for label, b in verdicts.items() if int(label[2:]) > CAP]
    assert above and all(b is not None and (b.verdict, b.confidence) == ("running_cap", "clear")
                         for _, b in above), verdicts
    figure("; ".join(f"{label} {b.summary()[:220]}" for label, b in verdicts.items()
                     if b is not None))


@pytest.mark.slow  # about 2 s: its own server
def test_the_sim_whose_cache_holds_two_long_prompts_is_bound_by_kv_capacity(
        tmp_path: Path, figure: Any) -> None:
    """8,000-token prompts in a cache of 19,835 tokens (``--mem-fraction-static 0.6``): two
    run, the rest wait at 81 % usage, far below the cap of 512."""
    servers = SimServers(tmp_path)
    try:
        argv = get_engine("sim").build_argv(MODEL, 1, {"max-running-requests": 512,
                                                       "mem-fraction-static": 0.6})
        server = servers.start("--model-path", MODEL, *argv[argv.index("--port") + 2:],
                               *FAST, "--time-scale", "0.02")
        config = BenchConfig(url=server.url, model=MODEL, num_prompts=16,
                             workload=RandomWorkload(input_len=8000, output_len=64),
                             loads=(ClosedLoop(concurrency=8),),
                             observe=ObserveOptions(interval_s=0.05))
        (only,) = asyncio.run(run_benchmark(config)).levels
    finally:
        servers.end_all()
    b = only.bottleneck
    assert b is not None and (b.verdict, b.confidence) == ("kv_capacity", "clear"), b
    assert b.figures["tokens_per_request"] == 8064 and b.figures["kv_free_tokens"] < 8064
    assert b.advice[0].text.startswith("raise --mem-fraction-static above 0.6")
    figure(f"c=8: {b.summary()}")
