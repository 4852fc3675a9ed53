"""Metric math on hand-computed cases (the definitions: ``docs/bench.md``)."""

from __future__ import annotations

import pytest

from cleanslate.bench import SLO, BenchConfig, ClosedLoop, LevelResult
from cleanslate.bench import _metrics as m
from cleanslate.bench._client import RequestRecord
from cleanslate.bench._summary import LevelRun, level_result


def rec(
    send: float, content: list[float], tokens: int, *, error: str | None = None, end: float = 0.0
) -> RequestRecord:
    r = RequestRecord(t_send=send, input_tokens=10, input_source="server", requested_output=tokens)
    r.content_times = list(content)
    if content:
        r.t_first, r.t_last = content[0], content[-1]
    r.t_end = end or (content[-1] if content else send)
    r.output_tokens = tokens
    r.output_source = "server"
    r.error = error
    return r


def test_ttft_e2e_tpot_of_one_request() -> None:
    r = rec(10.0, [10.5, 10.6, 10.8, 11.1], 4)
    assert m.ttft_s(r) == pytest.approx(0.5)
    assert m.e2e_s(r) == pytest.approx(1.1)
    # (E2E - TTFT) / (out - 1) = 0.6 / 3
    assert m.tpot_s(r) == pytest.approx(0.2)
    assert m.tpot_s(rec(0.0, [1.0], 1)) is None


def test_tpot_uses_token_count_not_chunk_count() -> None:
    # 3 content chunks carrying 7 tokens (server usage): TPOT over tokens, ITL over chunks
    r = rec(0.0, [1.0, 1.3, 1.6], 7)
    assert m.tpot_s(r) == pytest.approx(0.6 / 6)
    assert list(m.pooled_itls([r])) == pytest.approx([0.3, 0.3])


def test_itl_is_pooled_over_requests_and_skips_failures() -> None:
    a = rec(0.0, [1.0, 1.1, 1.3], 3)
    b = rec(0.0, [2.0, 2.5], 2)
    bad = rec(0.0, [3.0, 9.0], 2, error="connection_reset")
    assert sorted(m.pooled_itls([a, b, bad])) == pytest.approx([0.1, 0.2, 0.5])


def test_stats_percentiles_and_units() -> None:
    s = m.stats_ms([0.001 * x for x in range(1, 101)])  # 1..100 ms
    assert s.count == 100
    assert s.mean == pytest.approx(50.5)
    assert s.min == pytest.approx(1.0) and s.max == pytest.approx(100.0)
    assert s.median == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert s.p999 == pytest.approx(99.901)
    assert s.std == pytest.approx(28.866, rel=1e-3)
    assert m.stats_ms([]).mean is None


def test_goodput_rules() -> None:
    slo = SLO(ttft_ms=600, tpot_ms=150)
    assert m.is_good(rec(0.0, [0.5, 0.6, 0.7], 3), slo)
    assert not m.is_good(rec(0.0, [0.7, 0.8], 2), slo)  # TTFT 700 ms
    assert not m.is_good(rec(0.0, [0.5, 0.7], 2), slo)  # TPOT 200 ms
    assert m.is_good(rec(0.0, [0.5], 1), slo)  # one token: TPOT not checked
    assert not m.is_good(rec(0.0, [0.1, 0.2], 2, error="http_500"), slo)


def test_max_in_flight() -> None:
    rs = [rec(0.0, [1.0], 1, end=1.0), rec(0.5, [2.0], 1, end=2.0), rec(1.5, [3.0], 1, end=3.0)]
    assert m.max_in_flight(rs) == 2


def level_of(records: list[RequestRecord], slo: SLO, reason: str | None = None) -> LevelResult:
    config = BenchConfig(url="http://127.0.0.1:1", model="m", slo=slo)
    run = LevelRun(config=config, records=records, abort_reason=reason)
    return level_result(run, ClosedLoop(concurrency=2), 0.5, 2.0, len(records))


def test_level_totals_throughputs_and_goodput_by_hand() -> None:
    records = [
        rec(0.0, [0.2, 0.4, 0.6, 0.8, 1.0], 5),  # TTFT 200, E2E 1000, TPOT 200
        rec(0.0, [0.4, 0.5, 0.6], 3, end=1.2),  # TTFT 400, E2E 600, TPOT 100, last byte 1.2
        rec(1.0, [], 0, error="http_503", end=1.5),
        rec(1.5, [2.5, 3.5], 2, end=4.0),  # TTFT 1000, E2E 2000, TPOT 1000; window ends 4.0
    ]
    lv = level_of(records, SLO(ttft_ms=500))
    assert lv.completed == 3 and lv.failed == 1
    assert lv.errors == {"http_503": 1}
    assert lv.duration == pytest.approx(4.0)  # first send 0.0 -> last receive 4.0
    assert lv.total_output_tokens == 10 and lv.total_input_tokens == 30
    assert lv.request_throughput == pytest.approx(3 / 4.0)
    assert lv.output_throughput == pytest.approx(10 / 4.0)
    assert lv.total_token_throughput == pytest.approx(40 / 4.0)
    assert lv.good_requests == 2
    assert lv.request_goodput == pytest.approx(2 / 4.0)
    assert lv.ttft_ms.mean == pytest.approx((200 + 400 + 1000) / 3)
    assert lv.tpot_ms.median == pytest.approx(200)
    assert lv.e2el_ms.max == pytest.approx(2000)
    assert lv.itl_ms.count == 4 + 2 + 1
    assert lv.client_cpu_util == pytest.approx(0.25)
    assert not lv.partial


def test_level_json_uses_vllm_names_at_the_top_and_round_trips() -> None:
    lv = level_of([rec(0.0, [0.2, 0.4], 2)], SLO(), reason="server unreachable")
    data = lv.model_dump(mode="json")
    keys = list(data)
    assert keys[:4] == ["completed", "failed", "num_prompts", "duration"]
    for key in (
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
        "max_concurrency",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "p99.9_ttft_ms",
        "mean_tpot_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "median_e2el_ms",
    ):
        assert key in data, key
    assert keys.index("mean_ttft_ms") < keys.index("errors")
    assert data["partial"] is True and data["partial_reason"] == "server unreachable"
    assert data["request_goodput"] is None
    again = LevelResult.model_validate(data)
    assert again == lv
    assert lv.metric("p99_ttft_ms") == lv.ttft_ms.p99
