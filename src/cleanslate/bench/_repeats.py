"""Repeated levels: their figures combined with intervals, and the checks of a measurement's
validity that need more than one request (``docs/bench.md``, "Repeats and intervals").

A level measured ``n`` times becomes one :class:`LevelResult` whose

* counts (requests, tokens, errors, ``duration``, the client's CPU seconds) are totals over
  the repeats;
* throughputs, rates, steady-window figures and latency means are the mean of the repeats'
  values, with a Student-t interval (:func:`cleanslate.stats.t_interval`) on those values;
* latency percentiles are taken over the pooled requests of all repeats, with a percentile
  bootstrap interval (:func:`percentile_bootstrap`, seeded); ``std``, ``min``, ``max`` are the
  pooled ones, without an interval;
* every interval key ``KEY`` has ``KEY_ci_low``, ``KEY_ci_high`` and ``KEY_cv`` (the repeats'
  own coefficient of variation) beside it, and ``repeats`` keeps each repeat's own result.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from cleanslate.bench._models import (
    LATENCY_METRICS,
    LevelResult,
    Stats,
)
from cleanslate.bench._observed import merge_gpu, merge_server_metrics
from cleanslate.stats import Interval, t_interval

#: A closed-loop level whose steady window is under this share of its duration is flagged
#: (``steady_ok: false``): most of it was ramp or drain, so its throughput is not the
#: server's at that concurrency.
STEADY_FLOOR = 0.5

#: Resamples of a percentile's bootstrap interval.
BOOTSTRAP_RESAMPLES = 2000

#: Metrics that are the mean of the repeats' values, with a Student-t interval.
MEAN_METRICS: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "achieved_request_rate",
    "client_cpu_util",
    "steady_share",
    "steady_output_throughput",
    "steady_request_throughput",
    "steady_median_ttft_ms",
    "steady_p99_ttft_ms",
    "steady_median_tpot_ms",
    "steady_p99_tpot_ms",
)

#: Counts that are the totals over the repeats.
SUM_METRICS: tuple[str, ...] = (
    "completed",
    "failed",
    "sent",
    "num_prompts",
    "total_input_tokens",
    "total_output_tokens",
    "malformed_sse_events",
    "connection_retries",
    "output_samples",
    "requested_output_tokens",
    "short_output_requests",
    "duration",
    "client_cpu_s",
    "client_wall_s",
)

_STATS_PERCENTILE = {"median": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def first_repeat_slow(values: Sequence[float], *, higher_is_better: bool = True,
                      confidence: float = 0.95) -> bool:
    """Whether the first of three or more repeats is significantly worse than the rest: below
    the low end of the rest's Student-t interval at ``confidence`` (above its high end when
    lower is better, for a latency). ``False`` below three values (the rest has no interval).

    The study discards such a first repeat: the first measurement after a server's start was
    the slowest on the H200 every time, warm-up requests notwithstanding (issue 24)."""
    if len(values) < 3:
        return False
    rest = t_interval(values[1:], confidence)
    assert rest.low is not None and rest.high is not None
    first = float(values[0])
    return first < rest.low if higher_is_better else first > rest.high


def target_reached(values: Sequence[float], target_pct: float, min_repeats: int = 3) -> bool:
    """Whether ``min_repeats`` or more values have a 95 % interval whose half-width is at most
    ``target_pct`` percent of their mean."""
    if len(values) < min_repeats:
        return False
    rel = t_interval(values).relative_half_width()
    return rel is not None and rel * 100 <= target_pct


def percentile_bootstrap(samples: np.ndarray | Sequence[float], q: float,
                         confidence: float = 0.95, *, resamples: int = BOOTSTRAP_RESAMPLES,
                         seed: int = 0) -> Interval:
    """The ``q``-th percentile of ``samples`` (linear interpolation, numpy's default) with
    the percentile-bootstrap interval :func:`cleanslate.stats.bootstrap_interval` gives it,
    drawn in O(resamples) instead of O(resamples x samples).

    A resample of ``n`` values with replacement is ``x[floor(U_i n)]`` of the sorted samples
    for ``n`` uniform ``U_i``, so its ``k``-th smallest value is ``x[floor(U_(k) n)]``, where
    ``U_(k)``, the ``k``-th of ``n`` sorted uniforms, is Beta(k, n + 1 - k), and the next one is
    ``U_(k) + (1 - U_(k)) W`` with ``W`` ~ Beta(1, n - k) (the least of the ``n - k`` uniforms
    above it). Drawing those two order statistics gives the resample's interpolated percentile
    exactly: the same bootstrap distribution, without building the resamples (a level's pooled
    inter-token gaps are 10^5 samples and more)."""
    data = np.sort(np.asarray(samples, dtype=np.float64))
    n = int(data.size)
    if n == 0:
        raise ValueError("no samples")
    point = float(np.percentile(data, q))
    if n < 2:
        return Interval(mean=point, low=None, high=None, n=n, confidence=confidence)
    pos = (n - 1) * q / 100.0
    lo = min(math.floor(pos), n - 1)
    frac = pos - lo
    rng = np.random.default_rng(seed)
    u_lo = rng.beta(lo + 1, n - lo, size=resamples)
    y_lo = data[np.minimum((u_lo * n).astype(np.int64), n - 1)]
    if lo + 1 < n and frac > 0:
        u_hi = u_lo + (1.0 - u_lo) * rng.beta(1, n - lo - 1, size=resamples)
        y_hi = data[np.minimum((u_hi * n).astype(np.int64), n - 1)]
        draws = np.sort(y_lo + frac * (y_hi - y_lo))
    else:
        draws = np.sort(y_lo)
    tail = (1 - confidence) / 2
    low = float(draws[max(0, math.floor(tail * resamples))])
    high = float(draws[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)])
    return Interval(mean=point, low=min(low, point), high=max(high, point), n=n,
                    confidence=confidence)


def validity(completed: int, failed: int, max_error_rate: float, partial_reason: str | None
             ) -> tuple[float, bool, str | None]:
    """``(error_rate, valid, invalid_reason)`` of a level: not a throughput result when more
    than ``max_error_rate`` of its requests failed, when it ended early, or when no request
    completed."""
    total = completed + failed
    rate = failed / total if total else 0.0
    if partial_reason is not None:
        return rate, False, f"the level ended early ({partial_reason})"
    if completed == 0:
        return rate, False, "no request completed"
    if rate > max_error_rate:
        return rate, False, (f"{rate:.1%} of requests failed ({failed} of {total}), above the "
                             f"error-rate gate of {max_error_rate:.1%} (--max-error-rate)")
    return rate, True, None


def steady_verdict(share: float | None) -> tuple[bool | None, str | None]:
    """``(steady_ok, warning)`` for a steady-window share (``None``: not a closed loop)."""
    if share is None:
        return None, None
    if share < STEADY_FLOOR:
        return False, (f"the steady window (requests in flight at least 95 % of the "
                       f"concurrency) is {share:.0%} of the level, under {STEADY_FLOOR:.0%}: "
                       "most of it was ramp-up or drain; use more requests per level "
                       "(steady_output_throughput is the figure inside the window)")
    return True, None


def _ci(interval: Interval, values: Sequence[float]) -> tuple[float | None, float | None,
                                                               float | None]:
    spread = t_interval(values) if len(values) > 1 else None
    return interval.low, interval.high, (spread.cv if spread is not None else None)


def _merge_warnings(repeats: Sequence[LevelResult]) -> list[str]:
    """Each distinct warning of the repeats once, with the repeats it came from when not all."""
    seen: dict[str, list[int]] = {}
    for i, rep in enumerate(repeats, 1):
        for w in rep.warnings:
            seen.setdefault(w, []).append(i)
    out = []
    for w, where in seen.items():
        if len(where) == len(repeats):
            out.append(w)
        else:
            out.append(f"{w} (repeat{'s' if len(where) > 1 else ''} "
                       f"{', '.join(map(str, where))} of {len(repeats)})")
    return out


def combine(repeats: Sequence[LevelResult], samples: Sequence[Mapping[str, np.ndarray]], *,
            max_error_rate: float, seed: int = 0, target_pct: float | None = None
            ) -> LevelResult:
    """One result for a level measured ``len(repeats)`` times (the module docstring says how
    each figure is combined). ``samples``: each repeat's per-request latency samples in ms
    (:func:`cleanslate.bench._metrics.samples_ms`); ``seed`` seeds the bootstrap. One repeat
    is returned as it is."""
    if not repeats:
        raise ValueError("no repeats")
    if len(repeats) == 1:
        return repeats[0]
    first = repeats[0]
    ci: dict[str, tuple[float | None, float | None, float | None]] = {}
    out: dict[str, object] = {}
    for key in SUM_METRICS:
        values = [getattr(r, key) for r in repeats]
        out[key] = math.fsum(values) if isinstance(values[0], float) else sum(values)
    for key in MEAN_METRICS:
        values = [getattr(r, key) for r in repeats]
        if any(v is None for v in values):
            out[key] = None
            continue
        interval = t_interval(values)
        out[key] = interval.mean
        ci[key] = _ci(interval, values)
    goods = [r.good_requests for r in repeats]
    out["good_requests"] = None if any(g is None for g in goods) else sum(g or 0 for g in goods)
    cached = [r.cached_prompt_tokens for r in repeats if r.cached_prompt_tokens is not None]
    out["cached_prompt_tokens"] = sum(cached) if cached else None
    expected = [r.expected_cached_prompt_tokens for r in repeats]
    out["expected_cached_prompt_tokens"] = (None if any(e is None for e in expected)
                                            else sum(e or 0 for e in expected))
    lags = [r.schedule_lag_ms for r in repeats if r.schedule_lag_ms is not None]
    # the repeat that kept its schedule worst (its turns and windows are each repeat's own,
    # under repeats; the combined level shows the first's)
    out["schedule_lag_ms"] = max(lags, key=lambda s: s.p99 or 0.0) if lags else None
    steady_req = [r.steady_requests for r in repeats]
    out["steady_requests"] = None if any(v is None for v in steady_req) else sum(
        v or 0 for v in steady_req)
    steady_dur = [r.steady_duration for r in repeats]
    out["steady_duration"] = None if any(v is None for v in steady_dur) else math.fsum(
        v or 0.0 for v in steady_dur)
    out["max_concurrent_requests"] = max(r.max_concurrent_requests for r in repeats)
    errors: Counter[str] = Counter()
    issues: Counter[str] = Counter()
    details: dict[str, str] = {}
    evidence: list[str] = []
    limits: dict[str, tuple[int, int]] = {}
    for r in repeats:
        errors.update(r.errors)
        issues.update(r.output_issues)
        for kind, detail in r.error_details.items():
            details.setdefault(kind, detail)
        evidence.extend(r.output_evidence)
        for key, (met, n) in r.limit_counts.items():
            m0, n0 = limits.get(key, (0, 0))
            limits[key] = (m0 + met, n0 + n)
    out["errors"] = dict(sorted(errors.items()))
    out["output_issues"] = dict(sorted(issues.items()))
    out["error_details"] = dict(sorted(details.items()))
    out["output_evidence"] = tuple(evidence[:3])
    out["limit_counts"] = limits
    out["bad_output"] = next((r.bad_output for r in repeats if r.bad_output), None)
    out["partial"] = any(r.partial for r in repeats)
    out["partial_reason"] = next((r.partial_reason for r in repeats if r.partial_reason), None)
    for metric in LATENCY_METRICS:
        out[f"{metric}_ms"] = _combined_stats(metric, repeats, samples, ci, seed)
    completed = int(out["completed"])  # type: ignore[call-overload]
    failed = int(out["failed"])  # type: ignore[call-overload]
    rate, valid, reason = validity(completed, failed, max_error_rate,
                                   out["partial_reason"])  # type: ignore[arg-type]
    out["error_rate"], out["valid"], out["invalid_reason"] = rate, valid, reason
    warnings = _merge_warnings(repeats)
    steady_ok, steady_warning = steady_verdict(out["steady_share"])  # type: ignore[arg-type]
    out["steady_ok"] = steady_ok
    if steady_warning is not None and steady_warning not in warnings:
        warnings.append(f"over the repeats: {steady_warning}")
    throughputs = [r.output_throughput for r in repeats]
    slow: bool | None = None
    if len(repeats) >= 3:
        slow = first_repeat_slow(throughputs)
        ttfts = [r.ttft_ms.median for r in repeats]
        slow_ttft = (all(v is not None for v in ttfts)
                     and first_repeat_slow([float(v or 0.0) for v in ttfts],
                                           higher_is_better=False))
        if slow or slow_ttft:
            rest = t_interval(throughputs[1:])
            rest_ttft = [float(v or 0.0) for v in ttfts[1:]]
            warnings.append(
                f"{first.label}: the first of {len(repeats)} repeats was significantly slower "
                "than the rest: "
                f"output throughput {throughputs[0]:,.1f} tok/s against {rest.text()} "
                f"(95 % interval of the others), median TTFT {ttfts[0] or 0:,.1f} ms against "
                f"{t_interval(rest_ttft).text()}; a study discards it (first_repeat_slow)")
        slow = slow or slow_ttft
    out["first_repeat_slow"] = slow
    if target_pct is not None:
        reached = target_reached(throughputs, target_pct)
        if not reached:
            rel = t_interval(throughputs).relative_half_width()
            got = "no interval" if rel is None else f"± {rel * 100:.1f} %"
            warnings.append(f"the target interval of ± {target_pct:g} % of the output "
                            f"throughput was not reached in {len(repeats)} repeats ({got})")
    out["warnings"] = tuple(warnings)
    out["server_metrics"] = merge_server_metrics([r.server_metrics for r in repeats])
    out["gpu"] = merge_gpu([r.gpu for r in repeats])
    out["seed"] = None
    out["n_repeats"] = len(repeats)
    out["ci"] = ci
    out["repeats"] = tuple(repeats)
    return first.model_copy(update=out)


def _combined_stats(metric: str, repeats: Sequence[LevelResult],
                    samples: Sequence[Mapping[str, np.ndarray]],
                    ci: dict[str, tuple[float | None, float | None, float | None]],
                    seed: int) -> Stats:
    """A latency distribution over the repeats: the mean of the repeats' means (Student-t),
    percentiles of the pooled samples (bootstrap), pooled std/min/max."""
    parts = [s[metric] for s in samples if s[metric].size]
    if not parts:
        return Stats()
    pooled = np.concatenate(parts)
    per_repeat: list[Stats] = [getattr(r, f"{metric}_ms") for r in repeats]
    means = [s.mean for s in per_repeat if s.mean is not None]
    fields: dict[str, float | int | None] = {
        "count": int(pooled.size),
        "std": float(pooled.std()),
        "min": float(pooled.min()),
        "max": float(pooled.max()),
    }
    mean_key = f"mean_{metric}_ms"
    if len(means) == len(per_repeat):
        interval = t_interval(means)
        fields["mean"] = interval.mean
        ci[mean_key] = _ci(interval, means)
    else:
        fields["mean"] = float(pooled.mean())
    word = {"median": "median", "p999": "p99.9"}
    for i, (name, q) in enumerate(_STATS_PERCENTILE.items()):
        boot = percentile_bootstrap(pooled, q, seed=seed + 7919 * i + hash_metric(metric))
        fields[name] = boot.mean
        values = [getattr(s, name) for s in per_repeat if getattr(s, name) is not None]
        spread = t_interval(values).cv if len(values) > 1 else None
        entry = (boot.low, boot.high, spread)
        keyword = word.get(name, name)
        ci[f"{keyword}_{metric}_ms"] = entry
        if name == "median":
            ci[f"p50_{metric}_ms"] = entry
    return Stats(**fields)  # type: ignore[arg-type]


def hash_metric(metric: str) -> int:
    """A fixed offset per distribution, so that each gets its own bootstrap draws."""
    return zlib.crc32(metric.encode()) % 100_003


__all__ = ["BOOTSTRAP_RESAMPLES", "MEAN_METRICS", "STEADY_FLOOR", "SUM_METRICS", "combine",
           "first_repeat_slow", "percentile_bootstrap", "steady_verdict", "target_reached",
           "validity"]
