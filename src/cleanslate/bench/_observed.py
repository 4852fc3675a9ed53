"""What a level's observers found, as stored in :class:`~cleanslate.bench.LevelResult`: the
engine's own metrics (:class:`ServerMetrics`) and GPU telemetry (:class:`GpuTelemetry`, one
per GPU). Models only: reading a stored level needs none of the samplers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from cleanslate.bench._metric_names import GAUGES
from cleanslate.models import Frozen

#: A sample counts as at the window's max when it is at least this share of it: a running
#: count of 63 of 64 is at its cap between one request finishing and the next admitted.
AT_MAX_SHARE = 0.97


class GaugeStats(Frozen):
    """A gauge over a window: the mean and the largest of its scraped values, and
    ``share_at_max``: the share of the window's samples at the max (at least
    :data:`AT_MAX_SHARE` of it; ``None`` where not computed: a level stored before it was,
    telemetry)."""

    mean: float
    max: float
    share_at_max: float | None = Field(default=None, ge=0, le=1)

    @classmethod
    def of(cls, values: Sequence[float]) -> GaugeStats | None:
        """The stats of ``values`` (``None`` for none), with ``share_at_max``."""
        if not values:
            return None
        top = max(values)
        at_max = sum(1 for v in values if v >= top * AT_MAX_SHARE) if top > 0 else len(values)
        return cls(mean=sum(values) / len(values), max=top,
                   share_at_max=at_max / len(values))


class ServerMetrics(Frozen):
    """What the engine said about itself over a level's window (``docs/bench.md``, "Engine
    metrics").

    ``unreadable`` is why there is nothing (``None`` when there is); ``note`` is said once and
    is not a failure (``no engine metrics`` for an engine without an endpoint). Gauges are
    ``{mean, max}`` over the ``window_samples`` scrapes inside the level's steady window
    (``gauge_window``: ``steady``, or ``level`` when none fell inside it); counters are
    increases from the baseline scrape to the final one; ``counter_resets`` counts the times
    one went down (read as a restart from zero). ``per_rank`` keeps the gauges per rank
    series where labels carry ranks.
    """

    flavour: str | None = None
    url: str = ""
    samples: int = 0
    window_samples: int = 0
    gauge_window: Literal["steady", "level"] = "steady"
    merged: int = Field(default=1, description="measurements pooled (a level's repeats)")
    failed_scrapes: int = 0
    skipped_values: int = 0
    running: GaugeStats | None = None
    waiting: GaugeStats | None = None
    waiting_capacity: GaugeStats | None = None
    kv_usage: GaugeStats | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = Field(default=None, ge=0, le=1)
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    counter_resets: int = 0
    per_rank: dict[str, dict[str, GaugeStats]] = Field(default_factory=dict)
    unreadable: str | None = None
    note: str | None = None


class GpuTelemetry(Frozen):
    """One GPU over a level (``docs/bench.md``, "GPU telemetry"). Gauges are ``{mean, max}``
    over the samples inside the level's steady window (the whole level when none fell inside
    it); ``energy_j`` is the energy counter's increase over the level (or power integrated
    over time where the GPU has no counter) and ``joules_per_output_token`` divides it by the
    tokens the client received. ``clock_events`` are the active clock-event (throttle)
    reasons seen in any sample, with the share of samples each was active in; ``xid_events``
    the new Xid errors. ``unreadable``: why this GPU gave nothing, or why it stopped answering
    during the level (what was read before is kept); ``note``: what is approximate (energy
    integrated from power, samples that failed, values not believed). ``source``: ``nvml``,
    ``nvidia-smi``, ``sim``, or ``auto`` (the host sampler: NVML else ``nvidia-smi``)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    source: str = ""
    samples: int = 0
    window_samples: int = 0
    gauge_window: Literal["steady", "level"] = "steady"
    merged: int = 1
    utilization_pct: GaugeStats | None = None
    sm_active_pct: GaugeStats | None = None
    memory_used_mib: GaugeStats | None = None
    power_w: GaugeStats | None = None
    energy_j: float | None = None
    joules_per_output_token: float | None = None
    sm_clock_mhz: GaugeStats | None = None
    memory_clock_mhz: GaugeStats | None = None
    max_sm_clock_mhz: float | None = None
    clock_events: dict[str, float] = Field(default_factory=dict)
    pcie_rx_mib_s: GaugeStats | None = None
    pcie_tx_mib_s: GaugeStats | None = None
    temperature_c: GaugeStats | None = None
    xid_events: tuple[int, ...] = ()
    sampler_cpu_ms: float | None = Field(
        default=None, description="the sampler's CPU time per sample (all its GPUs), ms")
    unreadable: str | None = None
    note: str | None = None



def _merged_gauge(parts: Sequence[tuple[GaugeStats | None, int]]) -> GaugeStats | None:
    known = [(g, n) for g, n in parts if g is not None and n > 0]
    if not known:
        return None
    total = sum(n for _, n in known)
    top = max(g.max for g, _ in known)
    # the parts whose own max is at the pooled max keep their share at it; the others had
    # no sample there
    shares = [(g.share_at_max if g.max >= top * AT_MAX_SHARE else 0.0, n) for g, n in known]
    share = (sum(s * n for s, n in shares if s is not None) / total
             if all(s is not None for s, _ in shares) else None)
    return GaugeStats(mean=sum(g.mean * n for g, n in known) / total, max=top,
                      share_at_max=share)


def _summed(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def merge_server_metrics(parts: Sequence[ServerMetrics | None]) -> ServerMetrics | None:
    """The engine metrics of a level measured several times (its repeats, a probe's
    extensions): gauges pooled over every readable window sample (means weighted by samples,
    the largest max), counters summed, the hit rate weighted by samples. A
    part that is unreadable is left out and counted in ``failed_scrapes``; all unreadable
    gives the last one's reason."""
    given = [p for p in parts if p is not None]
    if not given:
        return None
    readable = [p for p in given if p.unreadable is None and p.note is None]
    if not readable:
        return given[-1]
    if len(given) == 1:
        return given[0]
    first = readable[0]
    weights = [max(1, p.window_samples) for p in readable]
    rates = [(p.prefix_cache_hit_rate, w) for p, w in zip(readable, weights, strict=True)
             if p.prefix_cache_hit_rate is not None]
    per_rank: dict[str, dict[str, GaugeStats]] = {}
    for key in GAUGES:
        series = {k for p in readable for k in p.per_rank.get(key, {})}
        for k in sorted(series):
            g = _merged_gauge([(p.per_rank.get(key, {}).get(k), w)
                               for p, w in zip(readable, weights, strict=True)])
            if g is not None:
                per_rank.setdefault(key, {})[k] = g

    def gauge(name: str) -> GaugeStats | None:
        return _merged_gauge([(getattr(p, name), w)
                              for p, w in zip(readable, weights, strict=True)])

    return ServerMetrics(
        flavour=first.flavour, url=first.url,
        samples=sum(p.samples for p in given),
        window_samples=sum(p.window_samples for p in readable),
        gauge_window="steady" if all(p.gauge_window == "steady" for p in readable)
        else "level",
        failed_scrapes=sum(p.failed_scrapes for p in given),
        skipped_values=sum(p.skipped_values for p in given),
        running=gauge("running"), waiting=gauge("waiting"),
        waiting_capacity=gauge("waiting_capacity"), kv_usage=gauge("kv_usage"),
        preemptions=_summed([p.preemptions for p in readable]),
        prefix_cache_hit_rate=(sum(r * w for r, w in rates) / sum(w for _, w in rates)
                               if rates else None),
        generation_tokens=_summed([p.generation_tokens for p in readable]),
        prompt_tokens=_summed([p.prompt_tokens for p in readable]),
        counter_resets=sum(p.counter_resets for p in readable),
        per_rank=per_rank,
        merged=len(given))


def merge_gpu(parts: Sequence[tuple[GpuTelemetry, ...] | None]
              ) -> tuple[GpuTelemetry, ...] | None:
    """The GPU telemetry of a level measured several times, per GPU index: gauges pooled
    (means weighted by samples, the largest max), energy summed, joules per token from the
    summed energy over the summed tokens, clock-event shares weighted by samples, Xid events
    joined."""
    given = [p for p in parts if p is not None]
    if not given:
        return None
    if len(given) == 1:
        return given[0]
    by_index: dict[int, list[GpuTelemetry]] = {}
    for part in given:
        for gpu in part:
            by_index.setdefault(gpu.index, []).append(gpu)
    merged: list[GpuTelemetry] = []
    for _index, gpus in sorted(by_index.items()):
        readable = [g for g in gpus if g.unreadable is None]
        if not readable:
            merged.append(gpus[-1])
            continue
        weights = [max(1, g.window_samples) for g in readable]

        def gauge(name: str, readable: list[GpuTelemetry] = readable,
                  weights: list[int] = weights) -> GaugeStats | None:
            return _merged_gauge([(getattr(g, name), w)
                                  for g, w in zip(readable, weights, strict=True)])

        energy = [g.energy_j for g in readable]
        tokens = [g.energy_j / g.joules_per_output_token for g in readable
                  if g.energy_j is not None and g.joules_per_output_token]
        total_energy = sum(e for e in energy if e is not None) if all(
            e is not None for e in energy) else None
        events: dict[str, float] = {}
        for g, w in zip(readable, weights, strict=True):
            for reason, share in g.clock_events.items():
                events[reason] = events.get(reason, 0.0) + share * w
        first = readable[0]
        merged.append(first.model_copy(update={
            "samples": sum(g.samples for g in gpus),
            "window_samples": sum(g.window_samples for g in readable),
            "gauge_window": "steady" if all(g.gauge_window == "steady" for g in readable)
            else "level",
            "merged": len(gpus),
            **{name: gauge(name) for name in (
                "utilization_pct", "sm_active_pct", "memory_used_mib", "power_w",
                "sm_clock_mhz", "memory_clock_mhz", "pcie_rx_mib_s", "pcie_tx_mib_s",
                "temperature_c")},
            "energy_j": total_energy,
            "joules_per_output_token": (total_energy / sum(tokens)
                                        if total_energy is not None and tokens
                                        and len(tokens) == len(readable) else None),
            "clock_events": {k: v / sum(weights) for k, v in sorted(events.items())},
            "xid_events": tuple(x for g in readable for x in g.xid_events),
            "sampler_cpu_ms": _mean([g.sampler_cpu_ms for g in readable]),
        }))
    return tuple(merged)


__all__ = ["GaugeStats", "GpuTelemetry", "ServerMetrics", "merge_gpu", "merge_server_metrics"]
