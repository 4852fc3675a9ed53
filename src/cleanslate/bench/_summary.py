"""A measured level's result: the figures aggregated from its request records
(:func:`level_result`), and its warnings, one rule each (:data:`WARNING_RULES`), every rule a
function of the level's :class:`Facts` that returns its sentence or ``None``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cleanslate.bench import _metrics as m
from cleanslate.bench._client import DETAIL_CHARS, RequestRecord, printable
from cleanslate.bench._conversation import turn_results
from cleanslate.bench._limits import MAX_NUM_PROMPTS
from cleanslate.bench._models import (
    AnyLoad,
    BenchConfig,
    ClosedLoop,
    LevelResult,
    OpenLoop,
    ReplayLoad,
    Stats,
)
from cleanslate.bench._ramp import RampLoad, WindowResult
from cleanslate.bench._repeats import steady_verdict, validity
from cleanslate.bench._trace import TraceWorkload
from cleanslate.bench._workloads import RandomWorkload
from cleanslate.outputs import has_nan_marker, judge_text, level_verdict

#: Client CPU use (CPU seconds / wall seconds) above which a level warns that the client may
#: itself be the bottleneck. The event loop runs on one core.
CPU_SATURATION = 0.9

#: On the chat endpoint a chat template's head is the same for every request and an engine
#: may serve it from its prefix cache: a random workload warns about cached prompt tokens
#: there only above this share of its input tokens (on completions, above none).
CHAT_CACHED_SHARE = 0.10

#: Lateness of a scheduled send (open loops, replays, rate ramps), p99 in ms, above which a
#: level warns that the client did not keep the schedule.
MAX_SCHEDULE_LAG_MS = 10.0

#: The error class of a request the level sent and has no record of (a fault of the client).
LOST = "lost"

#: How far (share of the input tokens) the cached prompt tokens a server reports may be from a
#: trace's prediction before a level warns.
CACHE_SHARE_TOLERANCE = 0.05


@dataclass(frozen=True)
class LevelRun:
    """What a measured level leaves for its summary: its records, whether it hit the request
    cap, whether a tokenizer counted tokens, the run's first level (``reference``, whose
    sampled outputs tell whether this level's went bad under load) and why it ended early."""

    config: BenchConfig
    records: list[RequestRecord]
    capped: bool = False
    tokenized: bool = False
    reference: LevelResult | None = None
    abort_reason: str | None = None
    t0: float = 0.0  # when the level started (perf_counter seconds): a ramp's time zero
    expected_cached: int | None = None  # a trace's prediction for the requests sent
    #: requests the level sent, counted as each was sent (``None``: one per record); a
    #: request sent without a record is counted as failed (``lost``), never dropped
    sent: int | None = None


def output_checks(records: list[RequestRecord], ignore_eos: bool
                  ) -> tuple[int, dict[str, int], list[str]]:
    """(samples, issue counts, evidence) of a level's sampled requests: their text judged by
    :func:`cleanslate.outputs.judge_text`, error finishes, short outputs under ``ignore_eos``,
    and error payloads (HTTP 200 streams whose ``error`` names NaN)."""
    issues: dict[str, int] = {}
    evidence: list[str] = []
    samples = 0

    def note(issue: str, text: str) -> None:
        issues[issue] = issues.get(issue, 0) + 1
        if len(evidence) < 3:
            evidence.append(f"{issue}: {printable(text, 200)}")

    for r in records:
        if r.text is None:
            continue
        samples += 1
        if r.error == "server_error" and has_nan_marker(r.error_detail or ""):
            note("nan", f"error event: {r.error_detail}")
            continue
        if r.error is not None:
            continue  # counted as a failed request already
        judged = judge_text(r.text)
        if judged is not None:
            note(judged[0], judged[1])
        elif r.error_finish:
            note("error_finish", f"finish_reason error after {r.text[:120]!r}")
        elif ignore_eos and r.output_source != "approx" and r.output_tokens < r.requested_output:
            note("short", f"{r.output_tokens} of {r.requested_output} tokens: {r.text[:120]!r}")
    return samples, dict(sorted(issues.items())), evidence


@dataclass(frozen=True)
class Facts:
    """What a level's warnings are judged on, read once from its records."""

    run: LevelRun
    ok: list[RequestRecord]
    details: dict[str, str]  # the first error detail of each error kind
    short: list[RequestRecord]  # completed with fewer output tokens than asked for
    out_sources: Counter[str]
    malformed: int
    retried: int
    cpu_util: float
    cached: int | None
    total_in: int
    samples: int
    issues: dict[str, int]
    evidence: list[str]
    bad: str | None  # the output issue that makes the level's output bad
    steady_warning: str | None
    load: AnyLoad
    lag: Stats | None  # how late the sends were against their schedule


def rejected_ignore_eos(f: Facts) -> str | None:
    """The server refused ``ignore_eos``/``min_tokens`` (HTTP 422 or 400 naming them)."""
    if not f.run.config.ignore_eos:
        return None
    for kind in ("http_422", "http_400"):
        body = f.details.get(kind, "")
        if "ignore_eos" in body or "min_tokens" in body:
            return (f"the server rejected requests with {kind} naming ignore_eos/min_tokens "
                    f"({body[:120]}): it does not accept them; run again with --no-ignore-eos "
                    "(output lengths are then up to the model)")
    return None


def capped(f: Facts) -> str | None:
    if not f.run.capped:
        return None
    return (f"the level stopped sending after {MAX_NUM_PROMPTS:,} requests (the cap per level) "
            "before its duration ended")


def short_outputs(f: Facts) -> str | None:
    if not (f.short and f.run.config.ignore_eos):
        return None
    return (f"{len(f.short)} of {len(f.ok)} requests got fewer output tokens than requested "
            f"(e.g. {f.short[0].output_tokens} < {f.short[0].requested_output}): the server may "
            "ignore ignore_eos/min_tokens, so output lengths are not controlled")


def no_usage(f: Facts) -> str | None:
    if not f.ok or f.out_sources.get("server", 0) >= len(f.ok):
        return None
    return ("the server sent no usage for some requests: their output tokens were counted "
            + ("with the tokenizer" if f.run.tokenized
               else "as one per content event (approx)"))


def malformed(f: Facts) -> str | None:
    return f"{f.malformed} malformed SSE events/lines were skipped" if f.malformed else None


def bad_output(f: Facts) -> str | None:
    if f.bad is None:
        return None
    return (f"bad output: {f.issues[f.bad]} of {f.samples} sampled responses show "
            f"{f.bad} (e.g. {f.evidence[0] if f.evidence else '-'})")


def retried(f: Facts) -> str | None:
    if not f.retried:
        return None
    return (f"the server closed kept-alive connections without saying so: {f.retried} requests "
            "were sent again on a new connection, and later ones did not reuse connections")


def cpu_bound(f: Facts) -> str | None:
    if f.cpu_util <= CPU_SATURATION:
        return None
    return (f"the client used {f.cpu_util:.0%} of a CPU core: it may be the bottleneck; "
            "measure with fewer concurrent requests per client or several clients")


def prefix_cached(f: Facts) -> str | None:
    """Prompt tokens served from the prefix cache on a workload that shares no prefix."""
    config = f.run.config
    prefix_free = isinstance(config.workload, RandomWorkload) and config.workload.prefix_len == 0
    if not f.cached or not prefix_free:
        return None
    share = f.cached / f.total_in if f.total_in else 1.0
    if config.endpoint != "completions" and share <= CHAT_CACHED_SHARE:
        return None
    return (f"the server served {f.cached:,} prompt tokens ({share:.1%} of the input) from "
            "its prefix cache on a random workload without a shared prefix: the prompts "
            "were seen before (a level or repeat with the same seed, or another client), "
            "so prefill was not measured in full")


def behind_schedule(f: Facts) -> str | None:
    """The client sent later than the load's schedule: the arrivals were not the ones asked
    for (a trace compressed, a rate not reached)."""
    lag = f.lag
    if lag is None or lag.p99 is None or lag.p99 <= MAX_SCHEDULE_LAG_MS:
        return None
    what = "the trace's" if isinstance(f.load, ReplayLoad) else "the arrival"
    return (f"the client fell behind {what} schedule: sends were {lag.median or 0:.1f} ms late "
            f"at the median, {lag.p99:.1f} ms at p99 and {lag.max or 0:.1f} ms at worst "
            f"(bound {MAX_SCHEDULE_LAG_MS:g} ms): the load measured is not the one asked for; "
            "a cap on requests in flight, a busy client or a slow server connection delays "
            "sends")


def trace_times_unused(f: Facts) -> str | None:
    """A trace sent by a closed loop or a ramp: its prompts, not its times."""
    if not isinstance(f.run.config.workload, TraceWorkload) or isinstance(f.load, ReplayLoad):
        return None
    return (f"{f.load.label} sends the trace's prompts in order as it has room: the trace's "
            "timestamps are not used (a replay level sends them at their times)")


def cache_differs(f: Facts) -> str | None:
    """The prefix cache served a share of the prompt tokens far from what the trace's block
    hashes predict."""
    expected = f.run.expected_cached
    if expected is None or f.cached is None or not f.total_in:
        return None
    got, want = f.cached / f.total_in, expected / f.total_in
    if abs(got - want) <= CACHE_SHARE_TOLERANCE:
        return None
    why = ("the server's cache holds less than the trace reuses, evicts it, or caches in "
           "larger blocks" if got < want else
           "prompts were cached before this level (another client, or the same seed)")
    return (f"the server served {got:.1%} of the prompt tokens from its prefix cache; the "
            f"trace's block hashes predict {want:.1%} for a cache with room for everything: "
            f"{why}")


def ended_early(f: Facts) -> str | None:
    reason = f.run.abort_reason
    return f"level ended early: {reason}" if reason is not None else None


def unsteady(f: Facts) -> str | None:
    return f.steady_warning


#: The warning rules, in the order a level lists their sentences.
WARNING_RULES: tuple[Callable[[Facts], str | None], ...] = (
    rejected_ignore_eos, capped, short_outputs, no_usage, malformed, bad_output, retried,
    cpu_bound, prefix_cached, behind_schedule, trace_times_unused, cache_differs, ended_early,
    unsteady,
)


def level_result(
    run: LevelRun, load: AnyLoad, cpu_s: float, wall_s: float, num_prompts: int,
    latency: dict[str, np.ndarray] | None = None,
) -> LevelResult:
    """The level's result from its records; ``latency``: their samples
    (:func:`cleanslate.bench._metrics.samples_ms`), computed here when not given."""
    config = run.config
    records = run.records
    ok = [r for r in records if r.ok]
    sent = max(len(records), len(records) if run.sent is None else run.sent)
    lost = sent - len(records)
    failed = sent - len(ok)  # the invariant: sent == completed + failed
    if records:
        start, end = m.window(records)
        duration = max(end - start, 1e-9)
    else:
        duration = 0.0
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    good: int | None = None
    goodput: float | None = None
    if not config.slo.is_empty():
        good = sum(1 for r in records if m.is_good(r, config.slo))
        goodput = per_s(good)
    errors = Counter(r.error for r in records if r.error is not None)
    details: dict[str, str] = {}
    for r in records:
        if r.error is not None and r.error not in details:
            details[r.error] = (r.error_detail or "")[:DETAIL_CHARS]
    if lost:
        errors[LOST] = lost
        details[LOST] = (f"{lost} of {sent} requests sent ended without a record: a fault of "
                         "the client, please report it")
    out_sources: Counter[str] = Counter(r.output_source for r in ok)
    in_sources: Counter[str] = Counter(r.input_source for r in ok)
    short = [r for r in ok if r.output_source != "approx" and r.output_tokens < r.requested_output]
    samples, issues, evidence = output_checks(records, config.ignore_eos)
    reference = run.reference
    bad = level_verdict(samples, issues,
                        dict(reference.output_issues) if reference is not None else None,
                        reference.output_samples if reference is not None else 0)
    reported = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    cached = sum(reported) if reported else None
    cpu_util = cpu_s / wall_s if wall_s > 0 else 0.0
    sends = sorted(r.t_send for r in records)
    achieved = ((len(sends) - 1) / (sends[-1] - sends[0])
                if len(sends) > 1 and sends[-1] > sends[0] else 0.0)
    error_rate, valid, invalid_reason = validity(
        len(ok), failed, config.max_error_rate, run.abort_reason)
    if lost:
        valid, invalid_reason = False, details[LOST]
    window = (m.steady(records, load.concurrency, duration)
              if isinstance(load, ClosedLoop) and records else None)
    steady_share: float | None = None
    if isinstance(load, ClosedLoop):
        steady_share = window.share if window is not None else 0.0
    steady_ok, steady_warning = steady_verdict(steady_share)
    lags = [r.lag_s for r in records if r.lag_s is not None]
    lag = m.stats_ms(lags) if lags else None
    facts = Facts(run=run, ok=ok, details=details, short=short, out_sources=out_sources,
                  malformed=sum(r.malformed for r in records),
                  retried=sum(r.retried for r in records), cpu_util=cpu_util, cached=cached,
                  total_in=total_in, samples=samples, issues=issues, evidence=evidence, bad=bad,
                  steady_warning=steady_warning, load=load, lag=lag)
    warnings = tuple(text for rule in WARNING_RULES if (text := rule(facts)) is not None)
    steady_ttft = m.stats_ms(window.ttft_s) if window is not None else None
    steady_tpot = m.stats_ms(window.tpot_s) if window is not None else None
    if latency is None:
        latency = m.samples_ms(records)
    return LevelResult(
        label=load.label,
        load=load,
        completed=len(ok),
        failed=failed,
        sent=sent,
        num_prompts=num_prompts,
        duration=duration,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out),
        request_goodput=goodput,
        good_requests=good,
        max_concurrency=load.concurrency if isinstance(load, ClosedLoop) else load.max_concurrency,
        max_concurrent_requests=m.max_in_flight(records) if records else 0,
        request_rate=(load.rate if isinstance(load, OpenLoop) and not math.isinf(load.rate)
                      else None),
        burstiness=load.burstiness if isinstance(load, OpenLoop) else None,
        achieved_request_rate=achieved,
        ttft_ms=m.stats_ms([m.ttft_s(r) for r in ok]),
        tpot_ms=m.stats_ms([t for t in (m.tpot_s(r) for r in ok) if t is not None]),
        itl_ms=m.stats_ms(m.pooled_itls(ok)),
        e2el_ms=m.stats_ms([m.e2e_s(r) for r in ok]),
        errors=dict(sorted(errors.items())),
        error_details=dict(sorted(details.items())),
        malformed_sse_events=facts.malformed,
        connection_retries=facts.retried,
        cached_prompt_tokens=cached,
        output_samples=samples,
        output_issues=issues,
        output_evidence=tuple(evidence),
        bad_output=bad,
        output_tokens_source=m.source_of(out_sources),
        input_tokens_source=m.source_of(in_sources),
        requested_output_tokens=sum(r.requested_output for r in ok),
        short_output_requests=len(short),
        partial=run.abort_reason is not None,
        partial_reason=run.abort_reason,
        client_cpu_s=cpu_s,
        client_wall_s=wall_s,
        client_cpu_util=cpu_util,
        warnings=warnings,
        seed=config.seed,
        error_rate=error_rate,
        valid=valid,
        invalid_reason=invalid_reason,
        steady_share=steady_share,
        steady_duration=(window.end - window.start) if window is not None else None,
        steady_output_throughput=window.output_throughput if window is not None else None,
        steady_request_throughput=window.request_throughput if window is not None else None,
        steady_requests=window.requests if window is not None else None,
        steady_median_ttft_ms=steady_ttft.median if steady_ttft is not None else None,
        steady_p99_ttft_ms=steady_ttft.p99 if steady_ttft is not None else None,
        steady_median_tpot_ms=steady_tpot.median if steady_tpot is not None else None,
        steady_p99_tpot_ms=steady_tpot.p99 if steady_tpot is not None else None,
        steady_ok=steady_ok,
        limit_counts=m.limit_counts(latency, config.limits),
        schedule_lag_ms=lag,
        expected_cached_prompt_tokens=run.expected_cached,
        turns=turn_results([(r.turn, r.ok, r.input_tokens, _ms(m.ttft_s(r)) if r.ok else None,
                             _ms(m.e2e_s(r)) if r.ok else None, r.cached_tokens)
                            for r in records if r.turn]),
        windows=(ramp_windows(load, records, run.t0) if isinstance(load, RampLoad) else ()),
    )


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def ramp_windows(load: RampLoad, records: list[RequestRecord], t0: float
                 ) -> tuple[WindowResult, ...]:
    """A ramp's records cut into its windows (:class:`~cleanslate.bench._ramp.WindowResult`):
    requests by when they were sent (every request in one window: the windows' ``sent`` add up
    to the level's), output tokens by when they arrived."""
    out = []
    spans = load.windows()
    for i, (start, end) in enumerate(spans):
        lo, hi = t0 + start, t0 + end
        span = max(hi - lo, 1e-9)
        # Every request sent is in one window: one whose send was decided inside the ramp
        # and stamped a moment past its end counts in the last.
        after = -math.inf if i == 0 else lo
        before = math.inf if i == len(spans) - 1 else hi
        sent = [r for r in records if after <= r.t_send < before]
        ok = [r for r in sent if r.ok]
        ended = sum(1 for r in records if r.ok and lo <= r.t_end < hi)
        tokens = 0.0
        busy = 0.0
        for r in records:
            busy += max(0.0, min(r.t_end, hi) - max(r.t_send, lo))
            if r.ok and r.content_times:
                per_event = r.output_tokens / len(r.content_times)
                tokens += per_event * sum(1 for t in r.content_times if lo <= t < hi)
        ttft = m.stats_ms([m.ttft_s(r) for r in ok])
        tpot = m.stats_ms([t for t in (m.tpot_s(r) for r in ok) if t is not None])
        out.append(WindowResult(
            start_s=start, end_s=end, target=load.target((start + end) / 2), sent=len(sent),
            completed=len(ok), failed=len(sent) - len(ok), in_flight=busy / span,
            request_throughput=ended / span, output_throughput=tokens / span,
            median_ttft_ms=ttft.median, p99_ttft_ms=ttft.p99, median_tpot_ms=tpot.median,
            p99_tpot_ms=tpot.p99))
    return tuple(out)


__all__ = ["CACHE_SHARE_TOLERANCE", "CHAT_CACHED_SHARE", "CPU_SATURATION", "LOST",
           "MAX_SCHEDULE_LAG_MS", "WARNING_RULES", "Facts", "LevelRun", "level_result",
           "output_checks", "ramp_windows"]
