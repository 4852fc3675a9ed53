"""Benchmark runs as the store keeps them (``cs_benches``).

Every ``cleanslate bench`` is recorded (``docs/bench.md``, "Every bench is recorded"): its
result document as ``--json`` writes it (a list of levels, or a ``--find-max`` search with
its probes), the options that shaped it, and the run it measured (``run_id``; ``None`` for a
bench of a bare ``--url``). ``cleanslate runs`` lists them under their runs and ``cleanslate
report BENCH_ID`` renders them.
"""

from __future__ import annotations

import math
import secrets
import time
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from cleanslate.redact import redact_text
from cleanslate.store._records import Record

#: What a recorded bench measured: levels (``bench --concurrency/--rate/...``) or a capacity
#: search (``bench --find-max``).
BenchKind = Literal["levels", "find_max"]


def new_bench_id() -> str:
    """``b-YYYYMMDD-HHMMSS-xxxx``: when (UTC) and 4 random hex digits, like a run's id."""
    return datetime.now(UTC).strftime("b-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def bench_url(url: str) -> str:
    """A server URL fit to store and print: no user or password, no query or fragment (a
    token passed as ``?key=...``), what is left redacted (:func:`cleanslate.redact.redact_text`).
    Never raises: a text that does not parse is redacted as text."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address goes back into brackets
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
        shown = urlunsplit((parts.scheme, host + port, parts.path, "", ""))
    except ValueError:
        shown = url.split("?", 1)[0]
    return redact_text(shown)


class BenchRecord(Record):
    """One ``cleanslate bench`` as the store keeps it. ``created_at`` is epoch seconds (when
    it finished); ``url`` is :func:`bench_url` of the server; ``engine`` the ``--engine`` given
    or the run's (``None``: not said); ``options`` the command's options that shaped the
    measurement (``loads``, ``workload``, ``slo``, ``num_prompts`` ..., secrets left out);
    ``result`` the whole JSON document ``bench --json`` writes (a ``find_max`` one for
    ``kind`` ``find_max``); ``samples_dir`` where the observers' raw samples were written
    (``None``: nowhere)."""

    id: str
    created_at: float = Field(default_factory=time.time)
    run_id: str | None = None
    url: str
    model: str
    engine: str | None = None
    kind: BenchKind = "levels"
    options: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any]
    samples_dir: str | None = None

    def levels(self) -> list[dict[str, Any]]:
        """The measured levels' documents in order (a search's probes' levels, in probe
        order); those that are not objects are skipped."""
        if self.kind == "find_max":
            search = self.result.get("find_max")
            probes = search.get("probes") if isinstance(search, dict) else None
            return [p["level"] for p in probes or []
                    if isinstance(p, dict) and isinstance(p.get("level"), dict)]
        levels = self.result.get("levels")
        return [lv for lv in levels or [] if isinstance(lv, dict)]

    def labels(self) -> list[str]:
        """The labels of :meth:`levels` (``c=8``, ``rate=4``)."""
        return [str(lv.get("label", "?")) for lv in self.levels()]

    def best_output_throughput(self) -> float | None:
        """The most output tokens/s of any level that completed a request (``None``: none
        did)."""
        best: float | None = None
        for lv in self.levels():
            value = lv.get("output_throughput")
            completed = lv.get("completed")
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value) or not completed:
                continue
            best = float(value) if best is None else max(best, float(value))
        return best

    def failed(self) -> bool:
        """Whether the bench ended early or any level failed requests or is not a result."""
        if self.result.get("partial"):
            return True
        return any(lv.get("failed") or lv.get("valid") is False for lv in self.levels())


__all__ = ["BenchKind", "BenchRecord", "bench_url", "new_bench_id"]
