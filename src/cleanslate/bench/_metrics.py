"""Metric math of a level, computed after the level from the request records (``docs/bench.md``).

* TTFT: send -> first event with non-empty content. E2E (``e2el``): send -> last content event.
* TPOT: ``(E2E - TTFT) / (output_tokens - 1)`` per successful request with more than one token.
* ITL: gaps between consecutive content events of a request, pooled over all requests.
* Throughputs: totals of the successful requests / ``duration``, where ``duration`` is first send
  -> last receive of the level (failed requests included in the window).
* Goodput: successful requests that meet every SLO, per second of the same window; failed
  requests are never good.
* Percentiles: linear interpolation between order statistics (numpy's default, as vLLM).
* Steady window (closed loops): the span where requests in flight are at least 95 % of the
  concurrency; throughput and latencies inside it (:func:`steady`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cleanslate.bench._client import RequestRecord
from cleanslate.bench._models import SLO, Stats, TokenSource


def stats_ms(values_s: Sequence[float] | np.ndarray) -> Stats:
    """Summary of a distribution given in seconds, reported in milliseconds."""
    arr = np.asarray(values_s, dtype=np.float64) * 1000.0
    if arr.size == 0:
        return Stats()
    p50, p90, p95, p99, p999 = np.percentile(arr, [50, 90, 95, 99, 99.9])
    return Stats(
        count=int(arr.size),
        mean=float(arr.mean()),
        std=float(arr.std()),
        min=float(arr.min()),
        median=float(p50),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
        p999=float(p999),
        max=float(arr.max()),
    )


def ttft_s(rec: RequestRecord) -> float:
    return rec.t_first - rec.t_send


def e2e_s(rec: RequestRecord) -> float:
    return rec.t_last - rec.t_send


def tpot_s(rec: RequestRecord) -> float | None:
    """Time per output token after the first, or None for a single-token request."""
    if rec.output_tokens <= 1:
        return None
    return (rec.t_last - rec.t_first) / (rec.output_tokens - 1)


def is_good(rec: RequestRecord, slo: SLO) -> bool:
    """A successful request that meets every SLO that is set."""
    if not rec.ok:
        return False
    if slo.ttft_ms is not None and ttft_s(rec) * 1000.0 > slo.ttft_ms:
        return False
    if slo.e2e_ms is not None and e2e_s(rec) * 1000.0 > slo.e2e_ms:
        return False
    tpot = tpot_s(rec)
    return not (slo.tpot_ms is not None and tpot is not None and tpot * 1000.0 > slo.tpot_ms)


def pooled_itls(records: Sequence[RequestRecord]) -> np.ndarray:
    """All gaps between consecutive content events of successful requests, in seconds."""
    parts = [
        np.diff(np.asarray(r.content_times)) for r in records if r.ok and len(r.content_times) > 1
    ]
    return np.concatenate(parts) if parts else np.empty(0)


def source_of(sources: Mapping[str, int]) -> TokenSource:
    """The token-count source of a level: the one used by most requests (``none`` if none)."""
    if not sources:
        return "none"
    name = max(sources, key=lambda k: sources[k])
    return name if name in ("server", "tokenizer", "approx") else "none"  # type: ignore[return-value]


def window(records: Sequence[RequestRecord]) -> tuple[float, float]:
    """First send and last receive of the records (``perf_counter`` seconds)."""
    start = min(r.t_send for r in records)
    end = max(max(r.t_end, r.t_last) for r in records)
    return start, end


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """The largest number of requests in flight at once (send -> end intervals)."""
    events = sorted([(r.t_send, 1) for r in records] + [(r.t_end, -1) for r in records])
    peak = cur = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


#: Requests in flight, as a share of a closed loop's concurrency, that count as steady.
STEADY_IN_FLIGHT = 0.95


@dataclass(frozen=True)
class Steady:
    """The steady window of a closed-loop level and what was measured inside it."""

    start: float
    end: float
    share: float
    output_throughput: float
    request_throughput: float
    requests: int
    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]


def steady_window(records: Sequence[RequestRecord], concurrency: int,
                  share: float = STEADY_IN_FLIGHT) -> tuple[float, float] | None:
    """The span from the first moment the requests in flight reach ``ceil(share x
    concurrency)`` to the last moment they fall below it again (``perf_counter`` seconds);
    ``None`` when they never reach it. Failed requests hold a slot while in flight and count.
    A dip inside the span (a request's end and the next send, microseconds apart) stays in it:
    the window is one span, not a union."""
    threshold = max(1, math.ceil(share * concurrency - 1e-9))
    # at equal times an end is taken before a send: a slot is free before it is reused
    events = sorted([(r.t_send, 1) for r in records] + [(max(r.t_end, r.t_send), -1)
                                                       for r in records])
    start: float | None = None
    end: float | None = None
    cur = 0
    for t, d in events:
        before = cur
        cur += d
        if before < threshold <= cur and start is None:
            start = t
        elif cur < threshold <= before:
            end = t
    if start is None or end is None or end <= start:
        return None
    return start, end


def steady(records: Sequence[RequestRecord], concurrency: int, duration: float) -> Steady | None:
    """The steady window of a closed loop (:func:`steady_window`) and, inside it: output
    tokens received per second (each completed request's tokens spread evenly over its content
    events, the events inside the window counted), requests completed per second, and the
    TTFT and TPOT of the completed requests sent and ended inside it."""
    span = steady_window(records, concurrency)
    if span is None or duration <= 0:
        return None
    a, b = span
    width = b - a
    tokens = 0.0
    done = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    for r in records:
        if not r.ok:
            continue
        times = r.content_times
        if times and r.output_tokens:
            inside = bisect.bisect_right(times, b) - bisect.bisect_left(times, a)
            tokens += r.output_tokens * inside / len(times)
        if a <= r.t_end <= b:
            done += 1
        if r.t_send >= a and r.t_end <= b:
            ttfts.append(ttft_s(r))
            tpot = tpot_s(r)
            if tpot is not None:
                tpots.append(tpot)
    return Steady(start=a, end=b, share=min(1.0, width / duration),
                  output_throughput=tokens / width, request_throughput=done / width,
                  requests=len(ttfts), ttft_s=tuple(ttfts), tpot_s=tuple(tpots))


def samples_ms(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """The per-request samples of each latency distribution of a level's completed requests,
    in milliseconds, keyed ``ttft``, ``tpot``, ``itl``, ``e2el`` (ITL: every gap, pooled)."""
    ok = [r for r in records if r.ok]
    tpots = [t for t in (tpot_s(r) for r in ok) if t is not None]
    return {
        "ttft": np.asarray([ttft_s(r) for r in ok], dtype=np.float64) * 1000.0,
        "tpot": np.asarray(tpots, dtype=np.float64) * 1000.0,
        "itl": pooled_itls(ok) * 1000.0,
        "e2el": np.asarray([e2e_s(r) for r in ok], dtype=np.float64) * 1000.0,
    }


def limit_counts(samples: Mapping[str, np.ndarray],
                 limits: Mapping[str, float]) -> dict[str, tuple[int, int]]:
    """Per limit key (``p99_ttft_ms``): ``(samples at or under the limit, samples)`` of the
    key's distribution (``ttft``), whatever statistic the key names: the share that met it."""
    out: dict[str, tuple[int, int]] = {}
    for key, limit in limits.items():
        metric = key.split("_")[-2]
        values = samples[metric]
        out[key] = (int(np.count_nonzero(values <= limit)), int(values.size))
    return out
