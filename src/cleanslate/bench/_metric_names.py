"""One engine-neutral vocabulary for what an inference server says about itself on Prometheus.

Every engine spells its scheduler state its own way (vLLM ``vllm:num_requests_running``,
SGLang ``sglang:num_running_reqs``, llama.cpp ``llamacpp:requests_processing``) and renames
things between releases (vLLM's ``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``). The
benchmark reads them through one vocabulary, :data:`GAUGES` and :data:`COUNTERS`; each engine
adapter (``cleanslate.engines``) fills a :class:`MetricMap` from its names, old and new, to that
vocabulary. This module is stdlib only and sits below the engines, so the adapters can import
it and ``bench`` never imports an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

#: Gauges, read as they are at each scrape.
#:
#: - ``running``: requests in the running batch (count);
#: - ``waiting``: requests queued behind it (count);
#: - ``waiting_capacity``: the part of ``waiting`` held back for lack of room (count; vLLM's
#:   ``num_requests_waiting_by_reason{reason="capacity"}``);
#: - ``kv_usage``: the fraction of the KV cache in use, 0 to 1;
#: - ``prefix_hit_rate``: the engine's own prefix-cache hit rate, 0 to 1 (used only when it
#:   offers no hit and query counters).
GAUGES: tuple[str, ...] = ("running", "waiting", "waiting_capacity", "kv_usage",
                           "prefix_hit_rate")

#: Counters, summarized as their increase over a window (resets handled).
#:
#: - ``preemptions``: requests preempted (vLLM) or retracted (SGLang) and put back in the queue;
#: - ``prefix_hits`` / ``prefix_queries``: prompt tokens found in the prefix cache / looked up;
#: - ``generation_tokens`` / ``prompt_tokens``: tokens generated / prompt tokens received.
COUNTERS: tuple[str, ...] = ("preemptions", "prefix_hits", "prefix_queries",
                             "generation_tokens", "prompt_tokens")

VOCABULARY: tuple[str, ...] = GAUGES + COUNTERS

#: Gauges whose values are fractions: a value above 1 is not a reading.
FRACTIONS: frozenset[str] = frozenset({"kv_usage", "prefix_hit_rate"})

#: Labels that tell ranks apart: their series are kept apart (``per_rank``).
RANK_LABELS: tuple[str, ...] = ("engine", "dp_rank", "tp_rank", "pp_rank", "moe_ep_rank")

#: Rank labels whose series are separate schedulers (their running counts add up); series
#: that differ only in the other rank labels describe one batch (the largest is taken).
SUM_LABELS: tuple[str, ...] = ("engine", "dp_rank")


@dataclass(frozen=True)
class Source:
    """One sample name that carries a vocabulary entry, and the label values a sample must
    have to count (``{"reason": "capacity"}``). ``plus``: names whose samples with the same
    labels are added to this one's; the source is read only when all of them are present
    (llama.cpp's prompt tokens received are ``prompt_tokens_total``, which leaves out the
    tokens taken from its prompt cache, plus ``prompt_tokens_cached_total``)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    plus: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.labels)

    @property
    def names(self) -> tuple[str, ...]:
        """Every sample name this source reads."""
        return (self.name, *self.plus)


def _frozen(names: dict[str, tuple[Source, ...]]) -> MappingProxyType[str, tuple[Source, ...]]:
    unknown = sorted(set(names) - set(VOCABULARY))
    if unknown:
        raise ValueError(f"not in the metrics vocabulary: {', '.join(unknown)}")
    return MappingProxyType(dict(names))


@dataclass(frozen=True)
class MetricMap:
    """How one engine's Prometheus endpoint maps onto the vocabulary.

    ``names[key]`` lists the sample names that carry ``key``, preferred first (the current name
    before the deprecated one): the first one present in a scrape is read, the others ignored,
    so a release that serves both names is not counted twice. ``path`` is where the endpoint is
    (``None``: the engine has none, which is reported once, not as a failure). ``hint`` says
    what to do when the endpoint is missing (SGLang: launch with ``--enable-metrics``).
    ``unmapped`` names the vocabulary entries this engine does not offer, with why.
    """

    flavour: str
    names: MappingProxyType[str, tuple[Source, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    path: str | None = "/metrics"
    hint: str = ""
    unmapped: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def build(cls, flavour: str, names: dict[str, tuple[str | Source, ...]], *,
              path: str | None = "/metrics", hint: str = "",
              unmapped: dict[str, str] | None = None) -> MetricMap:
        """A map from plain names (or :class:`Source` where labels must match); an unknown
        vocabulary key is a ``ValueError`` (a programming mistake in an adapter)."""
        sources = {key: tuple(s if isinstance(s, Source) else Source(s) for s in values)
                   for key, values in names.items()}
        return cls(flavour, _frozen(sources), path, hint,
                   MappingProxyType(dict(unmapped or {})))

    @property
    def sample_names(self) -> frozenset[str]:
        """Every sample name this map reads."""
        return frozenset(name for sources in self.names.values() for s in sources
                         for name in s.names)


#: The map of an engine without a metrics endpoint (``transformers serve``).
def no_metrics(flavour: str, why: str = "the engine serves no metrics endpoint") -> MetricMap:
    """A map that says the engine has no endpoint: the observer reports ``no engine metrics``
    once and scrapes nothing."""
    return MetricMap(flavour, path=None, hint=why)


Kind = Literal["gauge", "counter"]


def kind_of(key: str) -> Kind:
    """``gauge`` or ``counter`` for a vocabulary key."""
    return "counter" if key in COUNTERS else "gauge"


def engine_total(key: str, series: dict[str, float]) -> float | None:
    """The engine-wide value of vocabulary ``key`` from its rank series (``series_key`` ->
    value, as a sample keeps them: ``""`` or ``"dp_rank=0,tp_rank=1"``): series that are
    separate schedulers (:data:`SUM_LABELS`) add up, series that differ only in tensor or
    pipeline rank describe one batch (the largest counts); fractions (:data:`FRACTIONS`) are
    the mean over schedulers. ``None`` without a series."""
    if not series:
        return None
    groups: dict[str, float] = {}
    for series_key, value in series.items():
        group = ",".join(part for part in series_key.split(",")
                         if part.split("=", 1)[0] in SUM_LABELS)
        groups[group] = max(groups.get(group, value), value)
    if key in FRACTIONS:
        return sum(groups.values()) / len(groups)
    return sum(groups.values())


#: Each registered engine's map, by engine name (:func:`register_metric_map`). ``bench`` never
#: imports an engine: the engines register their maps when their package is imported (the
#: command line and ``tune`` import it; a program that runs the benchmark alone imports
#: ``cleanslate.engines`` to have them).
_REGISTERED: dict[str, MetricMap] = {}


def register_metric_map(engine: str, metric_map: MetricMap) -> None:
    """Make ``metric_map`` the metric names of engine ``engine`` (called by the engines'
    registry, :func:`cleanslate.engines.register_engine`)."""
    _REGISTERED[engine] = metric_map


def registered_maps(engine: str | None = None) -> tuple[MetricMap, ...]:
    """The map of ``engine`` when it registered one; otherwise (no engine, or one not known)
    every registered map that serves metrics, one per flavour: the candidates for a bare URL,
    whose flavour is found from the names it serves."""
    if engine is not None and engine in _REGISTERED:
        return (_REGISTERED[engine],)
    found: dict[str, MetricMap] = {}
    for metric_map in _REGISTERED.values():
        if metric_map.path is not None:
            found.setdefault(metric_map.flavour, metric_map)
    return tuple(found.values())

