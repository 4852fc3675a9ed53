"""Metric math of a level, computed after the level from the request records (``docs/bench.md``).

* TTFT: send -> first event with non-empty content. E2E (``e2el``): send -> last content event.
* TPOT: ``(E2E - TTFT) / (output_tokens - 1)`` per successful request with more than one token.
* ITL: gaps between consecutive content events of a request, pooled over all requests.
* Throughputs: totals of the successful requests / ``duration``, where ``duration`` is first send
  -> last receive of the level (failed requests included in the window).
* Goodput: successful requests that meet every SLO, per second of the same window; failed
  requests are never good.
* Percentiles: linear interpolation between order statistics (numpy's default, as vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
