"""``bench`` records its result in the store (``docs/bench.md``, "Every bench is recorded").

The store is opened before the first request (a ``--store`` that cannot be opened is exit 2
before any load is sent); the bench's id is chosen then, so that the JSON document carries it
(``bench_id``, and ``run_id``: the run measured, ``None`` for a bare ``--url``). The result is
recorded after the JSON file is written: a store that refuses the write never loses the result
(it is in the ``--json`` file, or printed on standard output when there is none) and the error
says where it is, exit 2 as for any store error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from cleanslate.errors import InputError

if TYPE_CHECKING:
    from rich.console import Console

    from cleanslate.bench import BenchConfig
    from cleanslate.store import BenchKind, Store

#: The fields of a :class:`~cleanslate.bench.BenchConfig` kept as the bench's options: what
#: shaped the measurement (never ``api_key``, headers or a request body's extras).
RECORDED_OPTIONS = ("endpoint", "loads", "workload", "slo", "num_prompts", "duration_s",
                    "warmup", "seed", "tokenizer", "ignore_eos", "repeats", "target_ci_pct",
                    "max_error_rate")


class BenchRecorder:
    """Records one bench: :meth:`stamp` the document before it is written anywhere, then
    :meth:`record` it. With ``enabled`` False (``--no-store``) both do nothing: no store is
    opened and the document has no ``bench_id``."""

    def __init__(self, store_url: str | None, *, enabled: bool = True,
                 run_id: str | None = None, engine: str | None = None) -> None:
        self.enabled = enabled
        self.run_id = run_id
        self.engine = engine
        self.store: Store | None = None
        self.bench_id: str | None = None
        if not enabled:
            return
        from cleanslate.store import Store, new_bench_id

        self.store = Store(store_url)  # a bad --store is exit 2 before any request
        self.bench_id = new_bench_id()

    def stamp(self, document: str) -> str:
        """The JSON ``document`` with ``bench_id`` and ``run_id`` first (unchanged when the
        bench is not recorded)."""
        if not self.enabled:
            return document
        data = json.loads(document)
        rest = {k: v for k, v in data.items() if k not in ("bench_id", "run_id")}
        return json.dumps({"bench_id": self.bench_id, "run_id": self.run_id, **rest},
                          indent=2)

    def record(self, document: str, config: BenchConfig, *, kind: BenchKind,
               samples_dir: Path | None, written_to: str | None,
               extra: dict[str, Any] | None = None) -> str | None:
        """Save the (stamped) ``document``; returns the bench's id (``None`` when not
        recording). ``written_to``: where the document already is (a file, ``-`` for standard
        output, ``None``: nowhere; then a failed save prints it on standard output before the
        :class:`InputError`). The store is closed afterwards."""
        if self.store is None or self.bench_id is None:
            return None
        from cleanslate.store import BenchRecord, bench_url

        data = json.loads(document)
        url = bench_url(config.url)
        if isinstance(data.get("url"), str):
            data["url"] = url
        options = config.model_dump(mode="json", include=set(RECORDED_OPTIONS))
        options.update(extra or {})
        engine = self.engine
        server_config = data.get("server_config")
        if engine is None and isinstance(server_config, dict):
            found = server_config.get("engine")
            engine = found if isinstance(found, str) else None
        record = BenchRecord(id=self.bench_id, run_id=self.run_id, url=url,
                             model=config.model, engine=engine, kind=kind, options=options,
                             result=data,
                             samples_dir=str(samples_dir.absolute()) if samples_dir else None)
        try:
            self.store.save_bench(record)
        except InputError as exc:
            if written_to is None:
                sys.stdout.write(document + "\n")
                sys.stdout.flush()
            kept = ("it is printed on standard output" if written_to in (None, "-")
                    else f"it is in {written_to}")
            raise InputError(f"{exc.message}; the bench result was not recorded: {kept}",
                             where=exc.where, hint=exc.hint or "pass --store URL for a store "
                             "you can write, or --no-store") from None
        finally:
            self.store.close()
        return self.bench_id

    def said(self, console: Console) -> None:
        """``bench recorded: ID`` (nothing when not recording)."""
        if self.bench_id is not None:
            console.print(Text(f"bench recorded: {self.bench_id}"), highlight=False)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


__all__ = ["RECORDED_OPTIONS", "BenchRecorder"]
