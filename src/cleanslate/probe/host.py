"""Probe one host: the collector and a GPU backend, concurrently, each with its own timeout."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from cleanslate.hosts.base import Executor
from cleanslate.probe.collect import run_collector
from cleanslate.probe.fallback import needs_fallback, run_fallback
from cleanslate.probe.gpu.base import GpuBackend
from cleanslate.probe.snapshot import GpuReading, Snapshot, SourceStatus

#: Default seconds each source may take before it counts as unknown.
DEFAULT_TIMEOUT_S = 10.0


async def probe_host(
    executor: Executor,
    backend: GpuBackend,
    *,
    ports: list[int] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    kmsg_since_us: int | None = None,
    shm_dir: str | None = None,
) -> Snapshot:
    """Take a :class:`Snapshot` of the executor's host.

    Returns within about ``timeout`` seconds whatever the host does: a source that fails or times
    out is recorded as such in ``Snapshot.sources`` (and the GPU reading as ``ok=False``), which the
    verdict turns into UNKNOWN. Never raises for a host-side failure.
    """
    started = time.monotonic()
    taken_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    collected, gpu = await asyncio.gather(
        run_collector(
            executor, ports=sorted(set(ports or ())), timeout=timeout,
            kmsg_since_us=kmsg_since_us, shm_dir=shm_dir,
        ),
        _read_gpus(executor, backend, timeout),
    )
    data, result = collected
    if data is None and needs_fallback(result):
        # No python3 on the host: parse ps, ls and /proc/net/tcp instead, in the time left.
        left = max(1.0, timeout - (time.monotonic() - started))
        data, result = await run_fallback(executor, ports=sorted(set(ports or ())),
                                          timeout=left, shm_dir=shm_dir)
    gpu_status = SourceStatus(
        name=f"gpu:{gpu.backend}", ok=gpu.ok, critical=True, error=gpu.error,
        elapsed_s=gpu.elapsed_s,
    )
    if data is None:
        return Snapshot(
            host=executor.name,
            taken_at=taken_at,
            elapsed_s=round(time.monotonic() - started, 4),
            ports_in_scope=tuple(sorted(set(ports or ()))),
            gpu=gpu,
            sources=(
                SourceStatus(name="collector", ok=False, error=result.describe_failure(),
                             elapsed_s=round(result.elapsed_s, 4)),
                gpu_status,
            ),
        )
    data["sources"] = [*data.get("sources", []), gpu_status.model_dump()]
    data.update(host=executor.name, taken_at=taken_at, gpu=gpu,
                elapsed_s=round(time.monotonic() - started, 4))
    return Snapshot.model_validate(data)


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
