"""What the simulated engine tells about itself: SGLang-named ``/metrics`` and ``/server_info``.

Both are read from the running sim's own state at the moment they are asked for: the scheduler
(:class:`~cleanslate.sim.engine.Engine`, which runs in the launcher process beside the HTTP
server, so nothing crosses a process boundary), its memory plan, and what the API measured of
each finished request (:class:`RequestStats`). Nothing is invented; ``docs/sim-model.md``
("Metrics and server info") says what each name means in the model.

**Metrics** (only with ``--enable-metrics``, as SGLang: without it ``/metrics`` is 404). Names,
types and labels are SGLang's (``python/sglang/srt/metrics/collector.py``, 0.5.x):

- scheduler series, labels ``model_name``, ``engine_type="unified"``, ``tp_rank``, ``pp_rank``,
  ``moe_ep_rank`` (rank 0 only, or one series per TP rank with
  ``--enable-metrics-for-all-schedulers``; the ranks share one batch, so their values agree):
  gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:num_used_tokens``,
  ``sglang:token_usage``, ``sglang:max_total_num_tokens``, ``sglang:context_len``,
  ``sglang:gen_throughput``, ``sglang:cache_hit_rate``, ``sglang:num_retracted_reqs``,
  ``sglang:new_token_ratio``; counters ``sglang:num_retracted_requests_total``,
  ``sglang:num_retracted_input_tokens_total``, ``sglang:num_retracted_output_tokens_total``;
- request series, label ``model_name``: counters ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:cached_tokens_total``,
  ``sglang:num_requests_total``, ``sglang:num_aborted_requests_total``; histograms
  ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
  ``sglang:e2e_request_latency_seconds`` (SGLang's default buckets).

The text is written by ``prometheus_client`` (its exposition format 0.0.4) from a collector that
reads the state when scraped; a scrape costs well under a millisecond of the event loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from cleanslate.sim.engine import Engine

#: The content type of the text exposition format the endpoint writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# SGLang's default buckets (seconds).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)


class Histogram:
    """Observations counted into fixed buckets (upper bounds, seconds), plus their sum.

    Plain Python numbers on the event loop's thread: no lock, one ``bisect`` per observation."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1, total: float | None = None) -> None:
        """Count ``n`` observations of ``value`` (the sum grows by ``total``, default
        ``value * n``): SGLang counts a chunk of ``n`` tokens that took ``total`` seconds as
        ``n`` gaps of ``total / n``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.total += value * n if total is None else total

    def family(self, name: str, doc: str, labels: Mapping[str, str]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=list(labels))
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((repr(float(bound)), running))  # as Go writes them: 1.0, 0.1
        buckets.append(("+Inf", running + self.counts[-1]))
        fam.add_metric(list(labels.values()), buckets, self.total)
        return fam


class RequestStats:
    """What the API measured of the requests that ended (SGLang's tokenizer-side metrics).

    A request counts when it ends, finished or aborted (SGLang counts its tokens then):
    ``prompt_tokens`` as the usage reports them, ``generation_tokens`` the tokens it generated,
    ``cached_tokens`` the prompt tokens the prefix cache held. Times in seconds."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.requests = 0
        self.aborted = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def finished(self, prompt_tokens: int, generated: int, cached: int, e2e_s: float,
                 aborted: bool) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generated
        self.cached_tokens += cached
        if aborted:
            self.aborted += 1
        else:
            self.e2e.observe(e2e_s)


class SimCollector(Collector):
    """Reads the engine and the request stats when ``/metrics`` is scraped (module docstring)."""

    def __init__(self, engine: Engine, stats: RequestStats, *, model_name: str, tp_size: int,
                 all_schedulers: bool, context_len: int) -> None:
        self.engine = engine
        self.stats = stats
        self.model_name = model_name
        ranks = range(tp_size) if all_schedulers else range(1)
        self.rank_labels = [
            {"model_name": model_name, "engine_type": "unified", "tp_rank": str(r),
             "pp_rank": "0", "moe_ep_rank": "0"}
            for r in ranks
        ]
        self.context_len = context_len

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=list(self.rank_labels[0]))
        for labels in self.rank_labels:
            fam.add_metric(list(labels.values()), value)
        return fam

    def _counter(self, name: str, doc: str, value: float,
                 labels: list[dict[str, str]]) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=list(labels[0]))
        for one in labels:
            fam.add_metric(list(one.values()), value)
        return fam

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        used = e.num_used_tokens()
        capacity = e.kv_capacity
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.",
                          e.num_running())
        yield self._gauge("sglang:num_queue_reqs",
                          "The number of requests in the waiting queue.", len(e.waiting))
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield self._gauge("sglang:token_usage", "The token usage.",
                          used / capacity if capacity else 0.0)
        yield self._gauge("sglang:max_total_num_tokens",
                          "Maximum total number of tokens in the KV cache pool.", capacity)
        yield self._gauge("sglang:context_len", "The context length.", self.context_len)
        yield self._gauge("sglang:gen_throughput", "The generation throughput (token/s).",
                          e.gen_throughput)
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.",
                          e.cache_hit_rate)
        yield self._gauge("sglang:num_retracted_reqs", "The number of retracted requests.",
                          e.window_retracted)
        yield self._gauge("sglang:new_token_ratio", "The new token ratio.", e.new_token_ratio)
        ranks = self.rank_labels
        yield self._counter("sglang:num_retracted_requests_total",
                            "Total number of retracted requests.", e.retracted, ranks)
        yield self._counter("sglang:num_retracted_input_tokens_total",
                            "Total number of retracted input tokens.",
                            e.retracted_input_tokens, ranks)
        yield self._counter("sglang:num_retracted_output_tokens_total",
                            "Total number of retracted output tokens.",
                            e.retracted_output_tokens, ranks)
        s = self.stats
        model = [{"model_name": self.model_name}]
        yield self._counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                            s.prompt_tokens, model)
        yield self._counter("sglang:generation_tokens_total",
                            "Number of generation tokens processed.", s.generation_tokens, model)
        yield self._counter("sglang:cached_tokens_total", "Number of cached prompt tokens.",
                            s.cached_tokens, model)
        yield self._counter("sglang:num_requests_total", "Number of requests processed.",
                            s.requests, model)
        yield self._counter("sglang:num_aborted_requests_total", "Number of requests aborted.",
                            s.aborted, model)
        yield s.ttft.family("sglang:time_to_first_token_seconds",
                            "Histogram of time to first token in seconds.", model[0])
        yield s.itl.family("sglang:inter_token_latency_seconds",
                           "Histogram of inter-token latency in seconds.", model[0])
        yield s.e2e.family("sglang:e2e_request_latency_seconds",
                           "Histogram of End-to-end request latency in seconds", model[0])


def metrics_registry(collector: SimCollector) -> CollectorRegistry:
    """A private registry holding only ``collector`` (never the process-wide default one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
