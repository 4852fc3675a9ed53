"""The sim's ``/metrics`` and ``/server_info`` tell its own state (issue 36 item 5).

Real servers, loaded by the benchmark client; what they serve is parsed with
``prometheus_client``'s parser, as a scraper would.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cleanslate.bench import LevelResult
from cleanslate.sim.engine import SimRequest
from cleanslate.sim.metrics import RequestStats, SimCollector, metrics_registry
from cleanslate.sim.model import REQUEST_POOL_SIZE, SimSettings, auto_max_running_requests
from tests.sim._client import closed_level
from tests.sim.conftest import SimServers
from tests.sim.test_retraction import _run, _small_engine

GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
          "sglang:num_used_tokens", "sglang:max_total_num_tokens")
COUNTERS = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total",
            "sglang:num_requests_total", "sglang:num_retracted_requests_total")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _scrape(url: str) -> dict[str, float]:
    """One scrape: every sample's value by its name (one series each: rank 0, one model;
    histogram buckets left out)."""
    status, body = _get(url + "/metrics")
    assert status == 200
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                continue
            assert sample.name not in values, f"duplicate series {sample.name}"
            values[sample.name] = sample.value
    return values


def test_scrapes_under_load_show_the_cap_the_queue_and_the_tokens_sent(sims: SimServers) -> None:
    server = sims.start("--max-running-requests", "4", "--enable-metrics", "--time-scale", "0.2")
    result: list[LevelResult] = []
    load = threading.Thread(target=lambda: result.append(closed_level(server.url, 16, 16, 64, 24)))
    scrapes = [_scrape(server.url)]
    load.start()
    while load.is_alive():
        scrapes.append(_scrape(server.url))
        time.sleep(0.02)
    load.join()
    scrapes.append(_scrape(server.url))
    level = result[0]
    assert level.completed == 16 and level.failed == 0

    for s in scrapes:
        assert all(name in s for name in GAUGES + COUNTERS)
        assert 0 <= s["sglang:num_running_reqs"] <= 4
        assert 0.0 <= s["sglang:token_usage"] <= 1.0
        assert s["sglang:num_used_tokens"] <= s["sglang:max_total_num_tokens"]
    assert max(s["sglang:num_queue_reqs"] for s in scrapes) > 0
    assert max(s["sglang:num_running_reqs"] for s in scrapes) == 4
    for name in COUNTERS:
        series = [s[name] for s in scrapes]
        assert series == sorted(series), f"{name} went down: {series}"
    final = scrapes[-1]
    assert final["sglang:prompt_tokens_total"] == level.total_input_tokens == 16 * 64
    assert final["sglang:generation_tokens_total"] == level.total_output_tokens == 16 * 24
    assert final["sglang:num_requests_total"] == 16
    assert final["sglang:num_running_reqs"] == final["sglang:num_queue_reqs"] == 0
    assert final["sglang:time_to_first_token_seconds_count"] == 16
    assert final["sglang:e2e_request_latency_seconds_count"] == 16
    assert final["sglang:inter_token_latency_seconds_count"] == 16 * 23

    status, body = _get(server.url + "/server_info")
    assert status == 200
    info: dict[str, Any] = json.loads(body)
    assert info["max_running_requests"] == 4 and info["enable_metrics"] is True
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 4
    assert info["max_total_num_tokens"] == final["sglang:max_total_num_tokens"]


def test_without_enable_metrics_there_is_no_metrics_and_server_info_shows_the_chosen_limit(
        sims: SimServers) -> None:
    # 0.5575 of the GPU leaves 385 tokens of KV cache beside a request table of 256 slots: the
    # sim chooses half of them, 192, and its smaller table leaves 410 tokens.
    server = sims.start("--mem-fraction-static", "0.5575", "--tp-size", "1")
    status, _ = _get(server.url + "/metrics")
    assert status == 404
    for path in ("/server_info", "/get_server_info"):
        status, body = _get(server.url + path)
        assert status == 200
        info: dict[str, Any] = json.loads(body)
        assert info["max_running_requests"] is None  # not given ...
        state = info["internal_states"][0]
        assert state["effective_max_running_requests_per_dp"] == 192  # ... chosen by the sim
        assert info["max_total_num_tokens"] == state["memory_usage"]["token_capacity"] == 410
        assert info["enable_metrics"] is False and info["mem_fraction_static"] == 0.5575
        assert info["tp_size"] == 1 and info["chunked_prefill_size"] == 8192


def test_all_schedulers_gives_one_series_per_tp_rank(sims: SimServers) -> None:
    server = sims.start("--tp-size", "2", "--enable-metrics", "--enable-metrics-for-all-schedulers")
    status, body = _get(server.url + "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    ranks = sorted(s.labels["tp_rank"] for s in families["sglang:num_running_reqs"].samples)
    assert ranks == ["0", "1"]
    assert {s.labels["model_name"] for s in families["sglang:prompt_tokens"].samples} == {
        "cleanslate/sim-70b"}


def test_the_sim_chooses_half_its_kv_cache_at_most_its_request_pool() -> None:
    assert auto_max_running_requests(SimSettings()) == REQUEST_POOL_SIZE == 256
    assert auto_max_running_requests(SimSettings(mem_fraction_static=0.5575)) == 192


def test_retractions_are_counted_as_the_scheduler_made_them() -> None:
    log: list[str] = []
    engine = _small_engine(log)
    stats = RequestStats()
    registry = metrics_registry(SimCollector(engine, stats, model_name="m", tp_size=1,
                                             all_schedulers=False, context_len=32768))
    requests = [SimRequest(f"r{i}", 100, 500, 0, True, i + 1) for i in range(12)]
    _run(engine, requests)
    values = {s.name: s.value for f in text_string_to_metric_families(
        generate_latest(registry).decode()) for s in f.samples}
    logged = sum(int(line.split("#retracted_reqs: ")[1].split(",")[0]) for line in log
                 if "Retract requests" in line)
    assert values["sglang:num_retracted_requests_total"] == engine.retracted == logged > 0
    assert values["sglang:num_retracted_input_tokens_total"] == 100 * engine.retracted
    assert values["sglang:num_used_tokens"] == 0 and values["sglang:token_usage"] == 0.0
    assert values["sglang:max_total_num_tokens"] == 3193
