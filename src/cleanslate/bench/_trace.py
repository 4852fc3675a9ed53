"""Trace replay: production request logs as a workload, sent at their own timestamps.

A trace is a file of requests, one per row: when it arrived, how long its prompt was (or the
prompt itself), how many tokens it asked for, and optionally the hashes of its prompt's prefix
blocks (two requests with the same block hash share that block's tokens, and everything before
it). Three formats are read, each with its columns mapped explicitly (:data:`COLUMNS`; a result
records the mapping it used, so a column is never read as something it is not):

``jsonl``
    cleanslate's own: one JSON object per line with ``timestamp`` (milliseconds from the trace's
    start, or an ISO 8601 time), ``input_length`` (tokens) or ``text`` (the prompt),
    ``output_length`` (tokens to ask for) and optionally ``hash_ids`` (a list of block hashes).
``mooncake``
    Mooncake's trace format (JSON Lines of ``timestamp`` in ms, ``input_length``,
    ``output_length`` and ``hash_ids`` of 512-token blocks).
``azure``
    Azure's public LLM inference trace (CSV with ``TIMESTAMP`` as an absolute time,
    ``ContextTokens`` and ``GeneratedTokens``); it has no block hashes.

Selection, in this order: ``start``/``duration`` (a window of the trace, seconds from its first
row), ``sample`` (a share of the rows, kept at random with a fixed seed; the time axis shrinks by
the same share so the request *rate* is the trace's: a rate-preserving sample), ``speedup`` (the
time axis divided by it). Requests are sent at the resulting offsets (an open loop); the level
reports how late each send was against its schedule (``schedule_lag_ms``) and warns when the
client fell behind.

Prompts are synthesized to the trace's lengths: each block hash becomes a block of random
tokens (with the tokenizer when given, else words counted one token each, as the random
workload's), the same hash the same block within a measurement, so a server's prefix cache
meets the trace's reuse. Each measurement (level, repeat) draws its blocks from its own seed:
the reuse is the trace's, never a cache warmed by the level before. :func:`expected_cached`
predicts the prompt tokens a prefix cache serves from the hashes, to compare with what the
server reports.

The server's context: a row whose prompt plus output exceeds it would be refused (HTTP 400), so
before anything is sent each row is fitted (``fit``): ``drop`` (the default) leaves it out,
``clip`` cuts its prompt to the context less its output (an output alone at or above the context
is cut to the context less one prompt token), ``off`` sends it as it is. The context is
``context=`` when given, else what the run's caller found (:mod:`cleanslate.bench._context`:
the run record, the server's answers, the tokenizer); unknown, nothing is fitted. Each prompt is
then cut, as synthesized and measured (by the tokenizer when given, else by the client's own
count), to at most ``max_input_len`` tokens and to the context less its output: a prompt
synthesized from token ids may re-encode to more tokens than its row asked for (a 1,900-token
row became 2,310).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import Field

from cleanslate.bench._limits import (
    MAX_DURATION_S,
    MAX_LEN,
    MAX_NUM_PROMPTS,
    MAX_PROMPT_TOKENS,
    MAX_REPLAY_SPEEDUP,
    MAX_TRACE_SPAN_S,
)
from cleanslate.bench._tokens import Tokenizer, approx_count, random_text
from cleanslate.bench._workloads import Prompt, Workload, register_workload
from cleanslate.errors import InputError
from cleanslate.inputs import interruptible, read_input
from cleanslate.models import FrozenStrict

TraceFormat = Literal["jsonl", "mooncake", "azure"]
#: What a row that does not fit the server's context becomes (see the module docstring).
FitMode = Literal["drop", "clip", "off"]

#: What each format's columns become, in the words a result records
#: (:attr:`TraceInfo.columns`).
COLUMNS: dict[str, dict[str, str]] = {
    "jsonl": {
        "timestamp": "send time: milliseconds from the trace's start, or an ISO 8601 time",
        "input_length": "prompt tokens (a prompt of random tokens of that length)",
        "text": "the prompt itself (instead of input_length)",
        "output_length": "output tokens asked for (max_tokens; exact with ignore_eos)",
        "hash_ids": "prefix blocks of block_size tokens: the same hash, the same tokens",
    },
    "mooncake": {
        "timestamp": "send time: milliseconds from the trace's start",
        "input_length": "prompt tokens",
        "output_length": "output tokens asked for (max_tokens; exact with ignore_eos)",
        "hash_ids": "prefix blocks of block_size tokens: the same hash, the same tokens",
    },
    "azure": {
        "TIMESTAMP": "send time: an absolute time, offset from the first row",
        "ContextTokens": "prompt tokens",
        "GeneratedTokens": "output tokens asked for (max_tokens; exact with ignore_eos)",
    },
}

#: The seed of a trace's ``sample``: the same rows in every level, trial and run.
SAMPLE_SEED = "cleanslate-trace-sample"


class TraceWorkload(Workload):
    """Requests of a trace file, replayed at their timestamps (see the module docstring)."""

    kind: Literal["trace"] = "trace"
    path: str
    format: TraceFormat = "jsonl"
    speedup: float = Field(default=1.0, gt=0, le=MAX_REPLAY_SPEEDUP)
    start: float = Field(default=0.0, ge=0, description="seconds from the trace's first row")
    duration: float | None = Field(default=None, gt=0, description="seconds of the trace")
    sample: float = Field(default=1.0, gt=0, le=1, description="share of the rows kept, at "
                          "the trace's rate")
    block_size: int = Field(default=512, ge=1, le=MAX_LEN, description="tokens per hash block")
    max_input_len: int = Field(default=131_072, ge=1, le=MAX_LEN)
    max_output_len: int = Field(default=16_384, ge=1, le=MAX_LEN)
    fit: FitMode = Field(default="drop", description="a row whose prompt plus output exceeds "
                         "the server's context: drop, clip (cut its prompt) or off (sent)")
    context: int | None = Field(default=None, ge=2, le=2 * MAX_LEN,
                                description="the server's context in tokens (prompt plus "
                                "output); None: found from the server (see bench._context)")

    def max_input_tokens(self) -> int:
        """The trace's longest prompt (``max_input_len`` while the file cannot be read: the
        error comes when the prompts are built)."""
        try:
            rows = read_trace(self).rows
        except InputError:
            return self.max_input_len
        return max(r.input_len if r.text is None else approx_count(r.text) for r in rows)

    def max_output_tokens(self) -> int:
        return self.max_output_len


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: seconds from the first row, lengths, block hashes or text."""

    t_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace file as read: its rows in time order, and what was adjusted on the way."""

    rows: tuple[TraceRow, ...]
    zero_output_rows: int  # rows that asked for 0 output tokens: sent asking for 1
    clipped_rows: int  # rows over max_input_len / max_output_len: dropped


class TraceFit(FrozenStrict):
    """How a run fitted the trace's rows to the server's context, said before the first level
    and recorded in :attr:`TraceInfo.fit`.

    ``context``: tokens a request (prompt plus output) may hold; ``None``: unknown (nothing
    fitted). ``source``: where it was read (``context= of the workload``, ``GET /v1/models
    max_model_len``, ...). ``rows``: the selected rows before the fit; ``dropped`` /
    ``clipped``: those left out or cut (``fit=off``: ``over`` counts those sent as they are).
    """

    mode: FitMode
    context: int | None = Field(description="tokens, prompt plus output; None: unknown")
    source: str | None = Field(description="where the context was read")
    rows: int
    dropped: int = 0
    clipped: int = 0
    over: int = Field(default=0, description="rows above the context (prompt plus output, "
                      "as the trace gives them)")

    def line(self) -> str:
        """What is printed before sending, e.g. ``dropped 31 of 47 rows: prompt + output
        above the server's 2,048-token context (read from GET /v1/models max_model_len)``."""
        if self.context is None:
            return ("the server's context is unknown: every row of the trace is sent as it is "
                    f"({self.source or 'nothing told it'}); give context=N to the trace "
                    "workload to fit its rows")
        ctx = f"the server's {self.context:,}-token context (read from {self.source})"
        if self.mode == "off" and self.over:
            return (f"fit=off: {self.over:,} of {self.rows:,} rows above {ctx} are sent as "
                    "they are")
        if self.dropped:
            return (f"dropped {self.dropped:,} of {self.rows:,} rows: prompt + output above "
                    f"{ctx}")
        if self.clipped:
            return (f"clipped {self.clipped:,} of {self.rows:,} rows to {ctx}: each prompt "
                    "cut to the context less its output")
        return f"all {self.rows:,} rows fit {ctx}"


class TraceInfo(FrozenStrict):
    """What a run replayed: the file, its format, how each column was read, the selection."""

    path: str
    format: TraceFormat
    columns: dict[str, str]
    rows_read: int
    rows_used: int
    span_s: float = Field(description="first to last selected request, in trace seconds")
    rate: float | None = Field(description="selected requests per second as sent (after "
                               "sample and speedup); None for one request")
    speedup: float
    start: float
    duration: float | None
    sample: float
    block_size: int
    zero_output_rows: int
    clipped_rows: int
    hashed_rows: int = Field(description="rows with prefix block hashes")
    expected_cached_share: float | None = Field(
        description="share of the selected prompts' tokens a prefix cache with room for "
        "everything serves, predicted from the hashes; None without hashes")
    fit: TraceFit | None = Field(default=None, description="the rows fitted to the server's "
                                 "context; None: not fitted (the workload used by itself)")


def _where(path: Path, line: int | None = None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def _int_field(value: object, key: str, path: Path, line: int, *, low: int = 0) -> int:
    # Errors say what is wrong, never the value: a trace may be any file the user can name.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{key} is not a number of tokens", where=_where(path, line))
    if value != int(value) or value < low:
        raise InputError(f"{key} is not a whole number at least {low}",
                         where=_where(path, line))
    return int(value)


def _parse_time(text: str, key: str, path: Path, line: int) -> float:
    """An absolute time (ISO 8601; more than 6 digits of a second are cut to microseconds, as
    Azure's trace writes 7) as POSIX seconds."""
    value = text.strip()
    head, dot, frac = value.partition(".")
    if dot:
        digits = "".join(ch for ch in frac if ch.isdigit())
        tail = frac[len(digits):]
        value = f"{head}.{digits[:6]}{tail}"
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise InputError(f"{key} is not a time (ISO 8601, e.g. 2023-11-16 18:15:46.68)",
                         where=_where(path, line)) from None
    if stamp.tzinfo is None:
        return (stamp - datetime(1970, 1, 1)).total_seconds()
    return stamp.timestamp()


def _read_text(path: Path, fmt: TraceFormat) -> str:
    """The trace's text: a regular file of at most ``MAX_BYTES["trace"]`` bytes and
    :data:`MAX_NUM_PROMPTS` rows (a header more for CSV), refused as soon as the read passes
    either (a FIFO, a device or a folder is refused before any read)."""
    rows = MAX_NUM_PROMPTS + (1 if fmt == "azure" else 0)
    raw = read_input(path, kind="trace", max_lines=rows, what="lines (one request each: at "
                     f"most {MAX_NUM_PROMPTS:,} requests)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})",
                         where=_where(path, line)) from None


def _json_rows(path: Path, text: str, fmt: TraceFormat) -> list[tuple[float, TraceRow, int]]:
    """``(time, row, line)`` of a JSON Lines trace; the row's ``t_s`` is filled in later."""
    out: list[tuple[float, TraceRow, int]] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not usable JSON"
            raise InputError(f"not JSON: {reason}", where=_where(path, line_no),
                             hint=f"one JSON object per line ({fmt} trace)") from None
        if not isinstance(item, dict):
            raise InputError("not a JSON object", where=_where(path, line_no))
        if "timestamp" not in item:
            raise InputError("no timestamp", where=_where(path, line_no),
                             hint="timestamp: milliseconds from the trace's start")
        stamp = item["timestamp"]
        if isinstance(stamp, str) and fmt == "jsonl":
            t = _parse_time(stamp, "timestamp", path, line_no)
        elif isinstance(stamp, int | float) and not isinstance(stamp, bool) \
                and math.isfinite(stamp):
            t = float(stamp) / 1000.0
        else:
            raise InputError("timestamp is not a number of milliseconds",
                             where=_where(path, line_no))
        prompt = item.get("text") if fmt == "jsonl" else None
        if prompt is not None and not isinstance(prompt, str):
            raise InputError("text is not a string", where=_where(path, line_no))
        if prompt is None and "input_length" not in item:
            raise InputError("no input_length" + (" or text" if fmt == "jsonl" else ""),
                             where=_where(path, line_no))
        input_len = (0 if prompt is not None
                     else _int_field(item["input_length"], "input_length", path, line_no, low=1))
        if "output_length" not in item:
            raise InputError("no output_length", where=_where(path, line_no),
                             hint="output_length: the output tokens the request asked for")
        output_len = _int_field(item["output_length"], "output_length", path, line_no)
        hashes = item.get("hash_ids", [])
        if not isinstance(hashes, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise InputError("hash_ids is not a list of integers", where=_where(path, line_no))
        out.append((t, TraceRow(0.0, input_len, output_len, tuple(hashes), prompt), line_no))
    return out


def _azure_rows(path: Path, text: str) -> list[tuple[float, TraceRow, int]]:
    reader = csv.reader(io.StringIO(text))
    try:
        return _azure_read(path, reader)
    except csv.Error as exc:  # a field over the csv module's limit, a NUL byte
        reason = ("a field is larger than the csv module reads" if "larger" in str(exc)
                  else "not a CSV row")
        raise InputError(reason, where=_where(path, max(1, reader.line_num)),
                         hint=f"fields of at most {csv.field_size_limit():,} characters "
                         "(Azure's trace: TIMESTAMP,ContextTokens,GeneratedTokens)") from None


def _azure_read(path: Path, reader: Iterator[list[str]]) -> list[tuple[float, TraceRow, int]]:
    header = next(reader, None)
    if header is None:
        raise InputError("empty file: no header", where=_where(path, 1))
    names = [h.strip() for h in header]
    need = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    missing = [n for n in need if n not in names]
    if missing:
        # The header is the file's first line: named by what it lacks, never quoted.
        raise InputError(f"the header (line 1) has no column {', '.join(missing)}",
                         where=_where(path, 1),
                         hint="Azure's LLM inference trace: TIMESTAMP,ContextTokens,"
                         "GeneratedTokens")
    at = {n: names.index(n) for n in need}
    out: list[tuple[float, TraceRow, int]] = []
    for line_no, row in enumerate(reader, 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < len(names):
            raise InputError(f"{len(row)} fields, the header has {len(names)}",
                             where=_where(path, line_no))
        t = _parse_time(row[at["TIMESTAMP"]], "TIMESTAMP", path, line_no)
        counts = []
        for key in ("ContextTokens", "GeneratedTokens"):
            try:
                value = float(row[at[key]])
            except ValueError:
                raise InputError(f"{key} is not a number", where=_where(path, line_no)) from None
            counts.append(_int_field(value, key, path, line_no,
                                     low=1 if key == "ContextTokens" else 0))
        out.append((t, TraceRow(0.0, counts[0], counts[1]), line_no))
    return out


@functools.lru_cache(maxsize=8)
def _read(path: str, fmt: TraceFormat, max_input: int, max_output: int, _stamp: tuple[int, int]
          ) -> Trace:
    file = Path(path)
    text = _read_text(file, fmt)
    rows = _azure_rows(file, text) if fmt == "azure" else _json_rows(file, text, fmt)
    del text
    if not rows:
        raise InputError("no request in the trace", where=str(file))
    if len(rows) > MAX_NUM_PROMPTS:
        raise InputError(f"{len(rows):,} requests: at most {MAX_NUM_PROMPTS:,}", where=str(file),
                         hint="cut the file to the requests to replay")
    rows.sort(key=lambda r: r[0])  # stable: rows of one time keep the file's order
    t0 = rows[0][0]
    span = rows[-1][0] - t0
    if span > MAX_TRACE_SPAN_S:
        raise InputError(f"the request at line {rows[-1][2]} comes {span / 86_400:,.0f} days "
                         f"after the first (line {rows[0][2]}): a trace spans at most "
                         f"{MAX_TRACE_SPAN_S / 86_400:g} days", where=_where(file, rows[-1][2]),
                         hint="timestamps are milliseconds from the trace's start (jsonl, "
                         "mooncake) or absolute times (azure)")
    kept: list[TraceRow] = []
    zero = clipped = 0
    for t, row, _line in rows:
        if row.input_len > max_input or row.output_len > max_output:
            clipped += 1
            continue
        output = row.output_len
        if output == 0:  # asked for nothing: still a request, of one token
            zero += 1
            output = 1
        kept.append(TraceRow(t - t0, row.input_len, output, row.hash_ids, row.text))
    if not kept:
        raise InputError(f"every request is longer than max_input_len {max_input} or "
                         f"max_output_len {max_output}", where=str(file))
    return Trace(tuple(kept), zero, clipped)


def read_trace(spec: TraceWorkload) -> Trace:
    """The trace file of ``spec``, read once per file version (InputError on bad input, with
    the file and line)."""
    file = Path(spec.path)
    try:
        st = file.stat()
    except OSError as exc:
        raise InputError(f"cannot read the trace: {exc.strerror}", where=spec.path) from None
    with interruptible():  # seconds for a large trace: SIGINT and SIGTERM still heard
        return _read(str(file), spec.format, spec.max_input_len, spec.max_output_len,
                     (st.st_mtime_ns, st.st_size))


def replay_span_s(spec: TraceWorkload, trace: Trace | None = None) -> float:
    """Seconds from the first to the last send of ``spec``'s selection at a level's speedup
    of 1 (after ``start``, ``duration``, ``sample`` and the workload's ``speedup``); a replay
    level at speedup ``x`` lasts this over ``x``."""
    rows = select(spec, trace if trace is not None else read_trace(spec))
    return rows[-1].t_s - rows[0].t_s if rows else 0.0


def check_replay(spec: TraceWorkload, speedups: Iterable[float], *,
                 where: str | None = None) -> None:
    """Refuse a replay level that would send for longer than :data:`MAX_DURATION_S`
    (InputError naming the level): checked before anything is sent."""
    span = replay_span_s(spec)
    for x in speedups:
        if span / x > MAX_DURATION_S:
            label = "replay" if x == 1 else f"replay={x:g}x"
            raise InputError(f"{label} would send for {span / x:,.0f} s: a level sends for at "
                             f"most {MAX_DURATION_S:,.0f} s", where=where or spec.path,
                             hint="replay a window of the trace (start=, duration=), a sample "
                             "(sample=) or faster (speedup=)")


def select(spec: TraceWorkload, trace: Trace) -> list[TraceRow]:
    """The rows of ``spec``'s window and sample, with ``t_s`` as they are sent (seconds from
    the level's start, after ``sample`` and ``speedup``)."""
    end = spec.start + spec.duration if spec.duration is not None else math.inf
    window = [r for r in trace.rows if spec.start <= r.t_s < end]
    if spec.sample < 1.0:
        rng = random.Random(SAMPLE_SEED)
        window = [r for r in window if rng.random() < spec.sample]
    scale = spec.sample / spec.speedup
    return [TraceRow((r.t_s - spec.start) * scale, r.input_len, r.output_len, r.hash_ids,
                     r.text) for r in window]


def row_tokens(row: TraceRow, tok: Tokenizer | None) -> int:
    """A row's prompt tokens as the trace gives them (its text's, counted as the client counts
    them: by the tokenizer when given, else :func:`approx_count`)."""
    if row.text is None:
        return row.input_len
    return tok.count(row.text) if tok is not None else approx_count(row.text)


@dataclass(frozen=True, slots=True)
class Fitted:
    """Rows fitted to a context (:func:`fit_rows`): those kept (clipped ones cut), and counts."""

    rows: list[TraceRow]
    dropped: int
    clipped: int
    over: int


def fit_rows(spec: TraceWorkload, rows: list[TraceRow], tok: Tokenizer | None) -> Fitted:
    """``rows`` fitted to ``spec.context`` by ``spec.fit`` (see the module docstring); all of
    them, unchanged, when the context is unknown or the fit is ``off`` (``over`` still
    counted)."""
    ctx = spec.context
    if ctx is None:
        return Fitted(list(rows), 0, 0, 0)
    kept: list[TraceRow] = []
    dropped = clipped = over = 0
    for row in rows:
        prompt = row_tokens(row, tok)
        if prompt + row.output_len <= ctx or spec.fit == "off":
            over += prompt + row.output_len > ctx
            kept.append(row)
            continue
        over += 1
        if spec.fit == "drop":
            dropped += 1
            continue
        clipped += 1
        output = min(row.output_len, ctx - 1)
        # a text row keeps its text: synthesize cuts it to the context less its output
        prompt_len = row.input_len if row.text is not None else min(prompt, ctx - output)
        kept.append(TraceRow(row.t_s, prompt_len, output, row.hash_ids, row.text))
    return Fitted(kept, dropped, clipped, over)


def prompt_bound(spec: TraceWorkload, output_len: int) -> int:
    """The most prompt tokens one request of ``spec`` sends: ``max_input_len``, and the
    context less the request's output when the context is known and fitted (at least 1)."""
    bound = spec.max_input_len
    if spec.context is not None and spec.fit != "off":
        bound = min(bound, spec.context - output_len)
    return max(1, bound)


def cut_text(text: str, bound: int, tok: Tokenizer | None) -> tuple[str, int]:
    """``text`` cut to at most ``bound`` tokens as measured: by the tokenizer (encoded, cut,
    decoded and counted again until the count is within the bound: decoding and encoding
    again may add tokens), else by :func:`approx_count` (4 characters a token)."""
    if tok is None:
        n = approx_count(text)
        if n <= bound:
            return text, n
        cut = text[: 4 * bound]
        return cut, approx_count(cut)
    n = tok.count(text)
    if n <= bound:
        return text, n
    ids = tok.encode(text)
    keep = min(bound, len(ids))
    while keep > 0:
        cut = tok.decode(ids[:keep])
        n = tok.count(cut)
        if n <= bound:
            return cut, n
        keep -= max(1, n - bound)
    return "", 0


def _block(seed: int, cycle: int, h: int, size: int, tok: Tokenizer | None
           ) -> list[str] | list[int]:
    """The tokens of block ``h`` in one measurement: words, or vocabulary ids with a
    tokenizer (the same for the same seed, cycle and hash)."""
    rng = random.Random(f"{seed}:{cycle}:block:{h}")
    if tok is None:
        from cleanslate.bench._tokens import WORDS

        return rng.choices(WORDS, k=size)
    return rng.choices(tok.vocab_ids, k=size)


def synthesize(row: TraceRow, index: int, cycle: int, spec: TraceWorkload, seed: int,
               tok: Tokenizer | None) -> Prompt:
    """The prompt of one trace row: its blocks' tokens, then unique random tokens up to its
    input length (or the row's own text); then cut, as measured, to :func:`prompt_bound`."""
    source: Literal["tokenizer", "approx"] = "tokenizer" if tok else "approx"
    at = row.t_s
    bound = prompt_bound(spec, row.output_len)
    if row.text is not None:
        text, count = cut_text(row.text, bound, tok)
        return Prompt(text, count, source, row.output_len, at_s=at)
    size = spec.block_size
    blocks: list[tuple[int, int]] = []
    parts: list[list[str] | list[int]] = []
    left = min(row.input_len, bound)
    length = left
    for h in row.hash_ids:
        if left <= 0:
            break
        n = min(size, left)
        parts.append(_block(seed, cycle, h, size, tok)[:n])
        blocks.append((h, n))
        left -= n
    rng = random.Random(f"{seed}:{cycle}:row:{index}")
    if tok is None:
        words = [w for part in parts for w in part]
        text = " ".join(str(w) for w in words)
        if left > 0:
            tail, _ = random_text(rng, left, None)
            text = f"{text} {tail}" if text else tail
        return Prompt(text, length, source, row.output_len, at_s=at, blocks=tuple(blocks))
    ids = [int(i) for part in parts for i in part]
    if left > 0:
        ids += rng.choices(tok.vocab_ids, k=left)
    # decoded and encoded again, the ids may be more tokens than the row asked for
    text, count = cut_text(tok.decode(ids), bound, tok)
    return Prompt(text, count, source, row.output_len, at_s=at, blocks=_within(blocks, count))


def _within(blocks: list[tuple[int, int]], tokens: int) -> tuple[tuple[int, int], ...]:
    """``blocks`` of a prompt cut to ``tokens``: those within it, the last one shortened."""
    out: list[tuple[int, int]] = []
    left = tokens
    for h, n in blocks:
        if left <= 0:
            break
        out.append((h, min(n, left)))
        left -= n
    return tuple(out)


def expected_cached(prompts: list[Prompt]) -> int:
    """Prompt tokens a prefix cache with room for everything serves to ``prompts`` sent in
    this order: per prompt, its leading blocks already seen (a block of the same hash at least
    as long), at most all its tokens but one (one token is always computed)."""
    seen: dict[int, int] = {}
    total = 0
    for p in prompts:
        cached = 0
        for h, n in p.blocks:
            if seen.get(h, 0) < n:
                break
            cached += n
        total += min(cached, max(0, p.input_tokens - 1))
        for h, n in p.blocks:
            if seen.get(h, 0) < n:
                seen[h] = n
    return total


@register_workload(TraceWorkload)
def _trace(spec: TraceWorkload, n: int, rng: random.Random, tok: Tokenizer | None
           ) -> list[Prompt]:
    """The first ``n`` selected rows (all of them when there are fewer), in time order; a
    closed loop asking for more than the trace holds gets it again, with new block tokens."""
    rows = select(spec, read_trace(spec))
    if not rows:
        raise InputError(f"no request in the window start={spec.start:g} s, duration="
                         f"{spec.duration:g} s" if spec.duration else
                         f"no request at or after start={spec.start:g} s", where=spec.path)
    fitted = fit_rows(spec, rows, tok)
    if not fitted.rows:
        raise nothing_fits(spec, len(rows))
    rows = fitted.rows
    seed = rng.randrange(1 << 62)
    count = min(n, len(rows)) if n >= MAX_NUM_PROMPTS else n
    out: list[Prompt] = []
    total = 0
    for i in range(count):
        cycle, index = divmod(i, len(rows))
        prompt = synthesize(rows[index], index, cycle, spec, seed, tok)
        if cycle:  # a second pass has no schedule of its own
            prompt = Prompt(prompt.text, prompt.input_tokens, prompt.input_source,
                            prompt.output_len, blocks=prompt.blocks)
        total += prompt.input_tokens
        if total > MAX_PROMPT_TOKENS:
            raise InputError(f"the first {i + 1:,} requests hold more than "
                             f"{MAX_PROMPT_TOKENS:,} prompt tokens", where=spec.path,
                             hint="replay a window of the trace (duration=) or a sample")
        out.append(prompt)
    return out


def nothing_fits(spec: TraceWorkload, rows: int) -> InputError:
    """The error of a selection none of whose ``rows`` fits ``spec.context``."""
    return InputError(f"every one of the {rows:,} selected rows asks for more than the "
                      f"server's {spec.context or 0:,}-token context (prompt + output)",
                      where=spec.path, hint="fit=clip cuts their prompts to fit; fit=off "
                      "sends them as they are (the server refuses them)")


def trace_info(spec: TraceWorkload, *, tokenizer: Tokenizer | None = None,
               fit: TraceFit | None = None) -> TraceInfo:
    """What :class:`TraceInfo` records of ``spec``'s trace and selection (the rows as
    ``spec.context`` fits them, recorded as ``fit`` says)."""
    trace = read_trace(spec)
    rows = select(spec, trace)
    rows = fit_rows(spec, rows, tokenizer).rows or rows
    span = rows[-1].t_s - rows[0].t_s if rows else 0.0
    hashed = [r for r in rows if r.hash_ids]
    share: float | None = None
    if hashed:
        prompts = [synthesize(r, i, 0, spec, 0, None) for i, r in enumerate(rows)]
        total = sum(p.input_tokens for p in prompts)
        share = expected_cached(prompts) / total if total else 0.0
    trace_span = span * spec.speedup / spec.sample
    return TraceInfo(
        path=spec.path, format=spec.format, columns=COLUMNS[spec.format],
        rows_read=len(trace.rows) + trace.clipped_rows, rows_used=len(rows),
        span_s=trace_span, rate=(len(rows) - 1) / span if len(rows) > 1 and span > 0 else None,
        speedup=spec.speedup, start=spec.start, duration=spec.duration, sample=spec.sample,
        block_size=spec.block_size, zero_output_rows=trace.zero_output_rows,
        clipped_rows=trace.clipped_rows, hashed_rows=len(hashed),
        expected_cached_share=share, fit=fit)


__all__ = ["COLUMNS", "FitMode", "Fitted", "Trace", "TraceFit", "TraceInfo", "TraceRow",
           "TraceWorkload", "check_replay", "cut_text", "expected_cached", "fit_rows",
           "nothing_fits", "prompt_bound", "read_trace", "replay_span_s", "row_tokens", "select",
           "synthesize", "trace_info"]
