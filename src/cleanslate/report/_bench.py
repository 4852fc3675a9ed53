"""What a level's observers saw, read back for a report: one benchmark run (``cleanslate
report --bench OUT.json``: its levels, the flat rows of its exports) and a study trial's kept
samples (:func:`trial_sample_files`), as :class:`Timeline` series. The panels are drawn by
:func:`cleanslate.report._plots.level_figure`, the bench page by
:func:`cleanslate.report._html.render_bench_html`; this module draws nothing.

Inputs: the ``bench --json`` result and the observers' raw samples written beside it
(``OUT.json.observed/``, :mod:`cleanslate.bench._sample_files`; another folder with
``--observed DIR``). The summaries (``server_metrics``, ``gpu``) come from the result; the
panels from the samples. A missing samples folder is said, not failed: the table and exports
still come from the result.

A level's panel (``_plots.level_figure``), against seconds since the level's first sample (the
observers' baseline, taken just before the first request):

1. output tokens/s: the increase of the engine's own ``generation_tokens`` counter over a
   trailing window (:func:`rate_window`: 10 % of the level, at least 1 s and twice the
   counter's median step; :func:`trailing_rate`), a counter that went down read as a
   restart;
2. running and waiting requests (the engine's totals over its schedulers), with the cap on the
   running batch drawn when the configuration in effect says it (:func:`running_cap`);
3. KV-cache usage, percent;
4. GPU utilization (percent, the mean over the GPUs) and power (watts, their sum), from the
   GPU observer's samples.

A panel part without samples says so in words instead of an empty axis.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cleanslate.bench import (
    MAX_SAMPLE_FILE_BYTES,
    BenchResult,
    LevelResult,
    SampleFile,
    engine_total,
    observed_folder,
    read_sample_files,
)
from cleanslate.errors import InputError
from cleanslate.report._data import safe_url

if TYPE_CHECKING:
    from cleanslate.store import BenchRecord

#: Keys of the configuration in effect that cap the running batch, by engine: SGLang and the
#: sim ``max_running_requests``, vLLM ``max_num_seqs``, llama.cpp ``parallel`` (its slots).
CAP_KEYS = ("max_running_requests", "effective_max_running_requests_per_dp", "max_num_seqs",
            "parallel", "n_parallel", "total_slots")

_GAUGE_FIELDS = ("running", "waiting", "waiting_capacity", "kv_usage")
_SERVER_FIELDS = ("preemptions", "prefix_cache_hit_rate", "generation_tokens",
                  "prompt_tokens", "counter_resets", "samples", "window_samples",
                  "failed_scrapes", "skipped_values")
_GPU_GAUGES = ("utilization_pct", "sm_active_pct", "memory_used_mib", "power_w",
               "sm_clock_mhz", "memory_clock_mhz", "pcie_rx_mib_s", "pcie_tx_mib_s",
               "temperature_c")


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def observed_fields(level: LevelResult) -> dict[str, object]:
    """A level's observer summaries flattened into columns: ``server_metrics.<gauge>_mean``
    / ``_max`` (``running``, ``waiting``, ``waiting_capacity``, ``kv_usage``), its counters and
    counts, ``flavour``, ``unreadable``, ``note``; per GPU ``gpu<index>.<gauge>_mean`` /
    ``_max``, ``energy_j``, ``joules_per_output_token``, ``unreadable``. Empty when the
    level was not observed."""
    row: dict[str, object] = {}
    sm = level.server_metrics
    if sm is not None:
        p = "server_metrics."
        row[p + "flavour"] = sm.flavour
        for name in _GAUGE_FIELDS:
            g = getattr(sm, name)
            row[f"{p}{name}_mean"] = g.mean if g is not None else None
            row[f"{p}{name}_max"] = g.max if g is not None else None
        for name in _SERVER_FIELDS:
            row[p + name] = getattr(sm, name)
        row[p + "unreadable"] = sm.unreadable
        row[p + "note"] = sm.note
    for gpu in level.gpu or ():
        p = f"gpu{gpu.index}."
        row[p + "name"] = gpu.name
        for name in _GPU_GAUGES:
            g = getattr(gpu, name)
            row[f"{p}{name}_mean"] = g.mean if g is not None else None
            row[f"{p}{name}_max"] = g.max if g is not None else None
        row[p + "energy_j"] = gpu.energy_j
        row[p + "joules_per_output_token"] = gpu.joules_per_output_token
        row[p + "unreadable"] = gpu.unreadable
    return row


@dataclass
class Timeline:
    """One measurement's samples as series against seconds since its first sample."""

    label: str
    metrics_t: list[float] = field(default_factory=list)
    running: list[float | None] = field(default_factory=list)
    waiting: list[float | None] = field(default_factory=list)
    kv_pct: list[float | None] = field(default_factory=list)
    throughput: list[tuple[float, float]] = field(default_factory=list)
    gpu_t: list[float] = field(default_factory=list)
    gpu_util: list[float | None] = field(default_factory=list)
    gpu_power: list[float | None] = field(default_factory=list)
    failed_scrapes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def has_metrics(self) -> bool:
        return any(v is not None for v in (*self.running, *self.waiting, *self.kv_pct))

    @property
    def has_gpu(self) -> bool:
        return any(v is not None for v in (*self.gpu_util, *self.gpu_power))


def _series(sample: Mapping[str, Any], key: str) -> dict[str, float]:
    series = sample.get("series")
    values = series.get(key) if isinstance(series, Mapping) else None
    if not isinstance(values, Mapping):
        return {}
    out: dict[str, float] = {}
    for k, raw in values.items():
        value = _num(raw)
        if value is not None and value >= 0:
            out[str(k)] = value
    return out


#: A GPU reading's names in the samples file: the GPU observer's short ones first
#: (``bench._gpu``: ``util``, ``pw``), then the summary's.
_UTIL_NAMES = ("util", "utilization_pct")
_POWER_NAMES = ("pw", "power_w")


def _gpu_rows(sample: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A GPU sample's per-GPU readings: its ``gpus`` list, or the sample itself (the GPU
    observer writes one line per GPU and reading, ``{"gpu": index, "t": ..., ...}``)."""
    gpus = sample.get("gpus")
    if isinstance(gpus, list):
        return [g for g in gpus if isinstance(g, Mapping)]
    return [sample]


def _reading(row: Mapping[str, Any], names: Sequence[str]) -> float | None:
    for name in names:
        value = _num(row.get(name))
        if value is not None:
            return value
    return None


def timelines(files: Sequence[SampleFile]) -> list[Timeline]:
    """One :class:`Timeline` per measured label, in the order the files were written; each
    label's time starts at its earliest sample of any observer."""
    by_label: dict[str, list[SampleFile]] = {}
    for f in files:
        by_label.setdefault(f.label, []).append(f)
    out: list[Timeline] = []
    for label, group in by_label.items():
        line = Timeline(label)
        times = [s["t"] for f in group for s in f.samples]
        t0 = min(times) if times else 0.0
        for f in group:
            if f.problem is not None:
                line.problems.append(f"{f.key}: {f.problem}")
            if f.key == "server_metrics":
                _add_metrics(line, f.samples, t0)
            elif f.key == "gpu":
                _add_gpu(line, f.samples, t0)
        out.append(line)
    return out


#: The throughput line is the counter's increase over a trailing window of this share of the
#: level (at least :data:`MIN_RATE_WINDOW_S`): engines count a request's tokens in steps
#: (the sim when it finishes), so scrape-to-scrape increases are spikes, not a rate.
RATE_WINDOW_SHARE = 0.1
MIN_RATE_WINDOW_S = 1.0


def trailing_rate(points: Sequence[tuple[float, float]],
                  window_s: float) -> list[tuple[float, float]]:
    """``(t, rate)`` of a counter's ``(t, value)`` points: at each point, its increase since
    the earliest point at most ``window_s`` before it over the time between them. A value
    lower than the one before is a restart: the points before it are not used past it."""
    out: list[tuple[float, float]] = []
    start = 0
    for i, (t, value) in enumerate(points):
        if i and value < points[i - 1][1]:
            start = i
        j = start
        while j < i and points[j][0] < t - window_s:
            j += 1
        if j == i and j > start:
            j -= 1
        if j < i and t > points[j][0]:
            out.append((t, (value - points[j][1]) / (t - points[j][0])))
    return out


def rate_window(points: Sequence[tuple[float, float]]) -> float:
    """The trailing window of the throughput line, in seconds: :data:`RATE_WINDOW_SHARE` of
    the points' span, at least :data:`MIN_RATE_WINDOW_S`, and at least twice the median time
    between the counter's steps (a batch of equal requests finishing together steps it every
    few seconds: a shorter window would show the steps, not the rate)."""
    span = points[-1][0] - points[0][0] if points else 0.0
    steps = [t for (_, before), (t, v) in itertools.pairwise(points) if v > before]
    gaps = sorted(b - a for a, b in itertools.pairwise(steps))
    step = gaps[len(gaps) // 2] if gaps else 0.0
    return max(MIN_RATE_WINDOW_S, RATE_WINDOW_SHARE * span, 2 * step)


def _add_metrics(line: Timeline, samples: Sequence[Mapping[str, Any]], t0: float) -> None:
    counter: list[tuple[float, float]] = []
    for s in samples:
        if s.get("error") is not None:
            line.failed_scrapes += 1
            continue
        t = float(s["t"]) - t0
        line.metrics_t.append(t)
        line.running.append(engine_total("running", _series(s, "running")))
        line.waiting.append(engine_total("waiting", _series(s, "waiting")))
        kv = engine_total("kv_usage", _series(s, "kv_usage"))
        line.kv_pct.append(None if kv is None else 100 * kv)
        generated = engine_total("generation_tokens", _series(s, "generation_tokens"))
        if generated is not None:
            counter.append((t, generated))
    if counter:
        line.throughput = trailing_rate(counter, rate_window(counter))


def _add_gpu(line: Timeline, samples: Sequence[Mapping[str, Any]], t0: float) -> None:
    """GPU readings taken at one time (one line per GPU, the same ``t``) become one point:
    the mean utilization and the summed power of the GPUs that gave them."""
    ticks: dict[float, tuple[list[float], list[float]]] = {}
    for s in samples:
        utils, powers = ticks.setdefault(float(s["t"]), ([], []))
        for row in _gpu_rows(s):
            if row.get("err") is not None:
                continue
            util, power = _reading(row, _UTIL_NAMES), _reading(row, _POWER_NAMES)
            if util is not None:
                utils.append(util)
            if power is not None:
                powers.append(power)
    for t, (utils, powers) in sorted(ticks.items()):
        line.gpu_t.append(t - t0)
        line.gpu_util.append(sum(utils) / len(utils) if utils else None)
        line.gpu_power.append(sum(powers) if powers else None)


def trial_sample_files(artifacts: Path, run_id: str) -> list[SampleFile]:
    """The samples a local run kept in ``<artifacts>/<run id>/observed/``
    (:func:`cleanslate.tune.trial.trial_samples`), each file read with
    :func:`cleanslate.hosts.files.read_under`: below the store's artifacts folder, no
    symbolic link followed, a regular file of one link owned by this user or root, at most
    16 MiB (a run record cannot make the report read another file). Empty when the run kept
    none (a remote run; a run from before samples were kept) or the index cannot be read."""
    from cleanslate.hosts.files import read_under

    folder = artifacts / run_id / "observed"
    if run_id in ("", ".", "..") or "/" in run_id:
        return []

    def read(name: str) -> bytes:
        data = read_under(str(artifacts), str(folder / name), max_bytes=MAX_SAMPLE_FILE_BYTES + 1)
        if len(data) > MAX_SAMPLE_FILE_BYTES:
            raise InputError(f"larger than {MAX_SAMPLE_FILE_BYTES >> 20} MiB")
        return data

    try:
        return read_sample_files(folder, read)
    except (InputError, OSError):
        return []


def running_cap(document: Mapping[str, Any]) -> tuple[float, str] | None:
    """The cap on the running batch from the configuration in effect recorded with the run
    (``server_config.in_effect``, ``docs/bench.md``), with the key it came from; ``None`` when
    the run has none (then no line is drawn: the client's concurrency is not the server's
    cap)."""
    config = document.get("server_config")
    if not isinstance(config, Mapping):
        return None
    in_effect = config.get("in_effect")
    if not isinstance(in_effect, Mapping):
        return None
    for key in CAP_KEYS:
        value = _num(in_effect.get(key))
        if value is not None and value > 0:
            return value, key
    return None


@dataclass
class BenchReport:
    """A bench result and its observers' samples, as :func:`load_bench_report` read them
    from a file or :func:`stored_bench_report` from the store (``bench_id`` set; ``path`` is
    then the id). ``samples_note``: why there are no samples (no folder, an unreadable
    index)."""

    path: Path
    result: BenchResult
    document: dict[str, Any]
    folder: Path
    files: list[SampleFile] = field(default_factory=list)
    samples_note: str | None = None
    bench_id: str | None = None

    @property
    def name(self) -> str:
        """How the report names the bench: its id in the store, else its file's name."""
        return self.bench_id or self.path.name

    @property
    def cap(self) -> tuple[float, str] | None:
        return running_cap(self.document)

    def timelines(self) -> list[Timeline]:
        return timelines(self.files)


def _search_as_bench(document: dict[str, Any]) -> dict[str, Any]:
    """A ``bench --find-max --json`` document as a bench result's: its probes' measured
    levels in probe order, the configuration in effect the search read; the client's CPU is
    not in it (0). Anything else is returned as it is (and refused by the caller)."""
    search = document.get("find_max")
    if not isinstance(search, dict) or not isinstance(search.get("probes"), list):
        return document
    probes = sorted((p for p in search["probes"] if isinstance(p, dict)
                     and isinstance(p.get("level"), dict)),
                    key=lambda p: p.get("index", 0) if isinstance(p.get("index"), int) else 0)
    endpoint = document.get("endpoint")
    return {**{k: document.get(k) for k in ("version", "started_at", "finished_at", "url",
                                            "model", "endpoint", "workload", "seed",
                                            "warmup")},
            "backend": "openai" if endpoint == "completions" else "openai-chat",
            "tokenizer": None, "slo": {}, "num_prompts": None, "duration_s": None,
            "levels": [p["level"] for p in probes], "partial": False,
            "client_cpu_s": 0.0, "client_wall_s": 0.0,
            "server_config": search.get("server_config")}


def load_bench_report(path: Path, observed: Path | None = None) -> BenchReport:
    """Read a ``bench --json`` result, or a ``bench --find-max --json`` search (its probes'
    levels), an :class:`InputError` naming the file when it is neither, and the samples in
    ``observed`` (default: beside it, ``OUT.json.observed``)."""
    from cleanslate.inputs import read_input

    raw = read_input(path, kind="other", where="--bench")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"{path} is not JSON", where="--bench",
                         hint="give the file `cleanslate bench --json FILE` wrote") from None
    document, result = _bench_result(document, str(path), "--bench")
    folder = observed if observed is not None else observed_folder(path)
    return _with_samples(BenchReport(path, result, document, folder))


def _bench_result(document: Any, name: str, where: str) -> tuple[dict[str, Any], BenchResult]:
    """A bench's JSON document (a ``--find-max`` one as its probes' levels) and the
    :class:`BenchResult` in it; an :class:`InputError` naming ``name`` when it is not one."""
    from pydantic import ValidationError

    if isinstance(document, dict) and "levels" not in document:
        document = _search_as_bench(document)
    if not isinstance(document, dict) or "levels" not in document:
        raise InputError(f"{name} is not a bench result (it has no levels)", where=where,
                         hint="give the file `cleanslate bench --json FILE` wrote")
    known = {k: v for k, v in document.items() if k in BenchResult.model_fields}
    try:
        result = BenchResult.model_validate(known)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first.get("loc", ()))
        raise InputError(f"{name} is not a bench result this cleanslate reads: {at}: "
                         f"{first.get('msg', 'invalid')}", where=where) from None
    return document, result


def stored_bench_report(record: BenchRecord) -> BenchReport:
    """A bench the store recorded (:class:`~cleanslate.store.BenchRecord`) as a report: its
    result document, and the observers' samples where ``bench`` wrote them when that folder
    is still there (said in ``samples_note`` otherwise)."""
    document, result = _bench_result(record.result, f"bench {record.id}", "BENCH_ID")
    folder = Path(record.samples_dir) if record.samples_dir else Path(record.id + ".observed")
    report = BenchReport(Path(record.id), result, document, folder, bench_id=record.id)
    if not record.samples_dir:
        report.samples_note = ("no samples recorded: the panels need the observers' samples "
                               "(bench --json FILE writes them beside it)")
        return report
    return _with_samples(report)


def _with_samples(report: BenchReport) -> BenchReport:
    """``report`` with the samples of its folder read (or why there are none)."""
    folder = report.folder
    if not folder.exists():
        report.samples_note = (f"no samples folder {folder.name}: the panels need the "
                               "observers' samples (bench --json FILE writes them beside it)")
        return report
    try:
        report.files = read_sample_files(folder)
    except InputError as exc:
        report.samples_note = f"samples not read: {exc.message}"
    return report


# -- exports -----------------------------------------------------------------------------------

LEVEL_HEAD = ("label", "completed", "failed", "duration", "request_throughput",
               "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
               "p99_tpot_ms")


def level_row(level: LevelResult) -> dict[str, object]:
    """One level as a flat row: its headline figures, then :func:`observed_fields`, then what
    bound it (``bound_by``: the verdict, ``?`` when likely; ``bound_confidence``;
    ``bound_evidence``: the evidence and the first advice; empty for a level not diagnosed)."""
    from cleanslate.bench import bound_by, bound_evidence

    row: dict[str, object] = {
        "label": level.label, "completed": level.completed, "failed": level.failed,
        "duration": level.duration, "request_throughput": level.request_throughput,
        "output_throughput": level.output_throughput,
        "median_ttft_ms": level.ttft_ms.median, "p99_ttft_ms": level.ttft_ms.p99,
        "median_tpot_ms": level.tpot_ms.median, "p99_tpot_ms": level.tpot_ms.p99}
    row.update(observed_fields(level))
    b = level.bottleneck
    row.update({"bound_by": bound_by(b) if b is not None else None,
                "bound_confidence": b.confidence if b is not None else None,
                "bound_evidence": bound_evidence(b) if b is not None else None})
    return row


def bench_json(report: BenchReport) -> str:
    """``{"bench", "url", "model", "cap", "levels": [flat rows], "samples": [files]}``."""
    cap = report.cap
    doc = {"bench": report.bench_id or str(report.path), "url": safe_url(report.result.url),
           "model": report.result.model,
           "running_cap": {"value": cap[0], "key": cap[1]} if cap else None,
           "levels": [level_row(lv) for lv in report.result.levels],
           "samples": [{"label": f.label, "key": f.key, "file": f.file,
                        "samples": len(f.samples), "problem": f.problem}
                       for f in report.files],
           "samples_note": report.samples_note}
    return json.dumps(doc, indent=2, default=str) + "\n"


__all__ = [
    "LEVEL_HEAD",
    "BenchReport",
    "Timeline",
    "bench_json",
    "level_row",
    "load_bench_report",
    "observed_fields",
    "running_cap",
    "stored_bench_report",
    "timelines",
    "trial_sample_files",
]
