"""Probe one host: the collector and a GPU backend, concurrently, each with its own timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from cleanslate.hosts.base import Executor
from cleanslate.probe.collect import run_collector
from cleanslate.probe.gpu.base import GpuBackend
from cleanslate.probe.snapshot import GpuReading, Snapshot, SourceStatus

#: Default seconds each source may take before it counts as unknown.
DEFAULT_TIMEOUT_S = 10.0

#: Sources every probe must report (the collector's and the fallback's); a reading that lacks
#: one (a ``python3`` on the host that is not our collector, a truncated document) cannot be
#: trusted for what that source covers.
REQUIRED_SOURCES = ("processes", "device_files", "ports")


async def probe_host(
    executor: Executor,
    backend: GpuBackend,
    *,
    ports: list[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    kmsg_since_us: int | None = None,
    kmsg_since_boot_id: str | None = None,
    shm_dir: str | None = None,
    listeners: bool = False,
    shm_patterns: Sequence[str] | None = None,
) -> Snapshot:
    """Take a :class:`Snapshot` of the executor's host.

    Returns within about ``timeout`` seconds whatever the host does: a source that fails or times
    out is recorded as such in ``Snapshot.sources`` (and the GPU reading as ``ok=False``), which the
    verdict turns into UNKNOWN. A reading that lacks a required source, or does not have the
    snapshot's shape, is a failed source too. Never raises for a host-side failure.
    ``listeners``: also read every listening socket, on any port (``Snapshot.listeners``).
    ``shm_patterns``: the ``/dev/shm`` names reported in ``Snapshot.shm`` (``None``: those of
    the registered engines and their runtimes, :func:`cleanslate.engines.shm_patterns`).
    """
    started = time.monotonic()
    taken_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    in_scope = sorted(set(ports or ()))
    collected, gpu = await asyncio.gather(
        run_collector(
            executor, ports=in_scope, timeout=timeout, kmsg_since_us=kmsg_since_us,
            kmsg_since_boot_id=kmsg_since_boot_id, shm_dir=shm_dir, listeners=listeners,
            shm_patterns=shm_patterns,
        ),
        _read_gpus(executor, backend, timeout),
    )
    data, result = collected
    if data is None and not result.ok:
        # Loaded only when the collector failed: most hosts have python3, and a check's
        # start-up is part of what an operator waits for.
        from cleanslate.probe.fallback import needs_fallback, run_fallback

        if needs_fallback(result):
            # No python3 on the host: parse ps, ls and /proc/net/tcp instead, in the time left.
            left = max(1.0, timeout - (time.monotonic() - started))
            data, result = await run_fallback(executor, ports=in_scope, timeout=left,
                                              shm_dir=shm_dir, listeners=listeners,
                                              shm_patterns=shm_patterns)
    gpu_status = SourceStatus(
        name=f"gpu:{gpu.backend}", ok=gpu.ok, critical=True, error=gpu.error,
        elapsed_s=gpu.elapsed_s,
    )

    def failed(error: str, elapsed_s: float) -> Snapshot:
        return Snapshot(
            host=executor.name,
            taken_at=taken_at,
            elapsed_s=round(time.monotonic() - started, 4),
            ports_in_scope=tuple(in_scope),
            gpu=gpu,
            sources=(SourceStatus(name="collector", ok=False, error=error,
                                  elapsed_s=round(elapsed_s, 4)),
                     gpu_status),
        )

    if data is None:
        return failed(result.describe_failure(), result.elapsed_s)
    sources = data.get("sources")
    if not isinstance(sources, list):
        sources = []
    names = {s.get("name") for s in sources if isinstance(s, dict)}
    sources += [_missing(name) for name in REQUIRED_SOURCES if name not in names]
    if not data.get("processes"):
        # Every host has at least the probe's own process: an empty list is a failed read.
        sources = [s for s in sources if not (isinstance(s, dict) and s.get("name") ==
                                              "processes" and s.get("ok"))]
        if all(not (isinstance(s, dict) and s.get("name") == "processes") for s in sources):
            sources.append({"name": "processes", "ok": False, "critical": True,
                            "error": "the probe listed no process at all"})
    if listeners and data.get("listeners") is None and "ports" in names:
        sources.append({"name": "listeners", "ok": False, "critical": True,
                        "error": "the listening sockets were asked for but not read"})
    data["sources"] = [*sources, gpu_status.model_dump()]
    data.update(host=executor.name, taken_at=taken_at, gpu=gpu,
                elapsed_s=round(time.monotonic() - started, 4))
    try:
        return Snapshot.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return failed(f"the collector's output is not a snapshot: {where}: {first['msg']} "
                      f"({exc.error_count()} errors)", result.elapsed_s)


def _missing(name: str) -> dict[str, Any]:
    return {"name": name, "ok": False, "critical": True,
            "error": "missing from the probe's output (not the cleanslate collector?)"}


async def _read_gpus(executor: Executor, backend: GpuBackend, timeout: float) -> GpuReading:
    started = time.monotonic()
    try:
        # The backend honours the timeout itself; this outer bound is the last line of defence.
        reading = await asyncio.wait_for(backend.read(executor, timeout), timeout + 2.0)
    except TimeoutError:
        return GpuReading(backend=backend.name, ok=False,
                          error=f"GPU backend {backend.name} did not answer within {timeout:g} s",
                          elapsed_s=round(time.monotonic() - started, 4))
    except Exception as exc:  # a backend bug must not turn into CLEAN
        return GpuReading(backend=backend.name, ok=False,
                          error=f"GPU backend {backend.name} failed: {type(exc).__name__}: {exc}",
                          elapsed_s=round(time.monotonic() - started, 4))
    if not reading.elapsed_s:
        reading = reading.model_copy(update={"elapsed_s": round(time.monotonic() - started, 4)})
    return reading
