"""The doctor's copy measurement, run by the host's Python (``python3 -``, source on stdin).

Imported by nothing at run time; it needs torch with CUDA on the host and says why not
otherwise (``{"skipped": ...}``, never a traceback). Input: one JSON object as the first
argument (``gpus``: indices, ``size_mib``). Output: one JSON object, ``measurements`` of
``{what, gpus, value, unit}``: per GPU device-to-device copy bandwidth, pinned host-to-device
and device-to-host, a tiny (4-byte) copy's latency; per ordered pair with P2P a
device-to-device copy, and host-staged (device -> pinned host -> device).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def copier(dst: Any, src: Any) -> Any:
    """A function copying ``src`` into ``dst``."""
    return lambda: dst.copy_(src)


def staged(dst: Any, host: Any, src: Any) -> Any:
    """A function copying ``src`` into ``dst`` through pinned host memory."""
    def copy() -> None:
        host.copy_(src)
        dst.copy_(host)

    return copy


def main() -> None:
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:
        print(json.dumps({"skipped": f"torch does not import: {type(exc).__name__}: {exc}"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": f"torch {torch.__version__} imports but sees no CUDA device"}))
        return
    count = torch.cuda.device_count()
    gpus = [g for g in (options.get("gpus") or range(count)) if 0 <= g < count]
    size = int(options.get("size_mib") or 256) << 20
    out: list[dict[str, Any]] = []

    def timed(fn: Any, devices: list[int], n: int = 10) -> float:
        fn()
        for d in devices:
            torch.cuda.synchronize(d)
        start = time.perf_counter()
        for _ in range(n):
            fn()
        for d in devices:
            torch.cuda.synchronize(d)
        return (time.perf_counter() - start) / n

    host = torch.empty(size, dtype=torch.uint8).pin_memory()
    bufs = {}
    for g in gpus:
        x = torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}")
        y = torch.empty_like(x)
        bufs[g] = x
        out.append({"what": "device-to-device copy", "gpus": [g], "unit": "GB/s",
                    "value": size / timed(copier(y, x), [g]) / 1e9})
        out.append({"what": "host-to-device copy (pinned)", "gpus": [g], "unit": "GB/s",
                    "value": size / timed(copier(x, host), [g]) / 1e9})
        out.append({"what": "device-to-host copy (pinned)", "gpus": [g], "unit": "GB/s",
                    "value": size / timed(copier(host, x), [g]) / 1e9})
        a = torch.empty(4, dtype=torch.uint8, device=f"cuda:{g}")
        b = torch.empty_like(a)
        out.append({"what": "tiny copy latency (4 bytes)", "gpus": [g], "unit": "us",
                    "value": timed(copier(b, a), [g], 1000) * 1e6})
        del y
    for i in gpus:
        for j in gpus:
            if i == j:
                continue
            peer = bool(torch.cuda.can_device_access_peer(i, j))
            dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{j}")
            src = bufs[i]
            out.append({"what": "GPU-to-GPU copy" + ("" if peer else " (no P2P access)"),
                        "gpus": [i, j], "unit": "GB/s",
                        "value": size / timed(copier(dst, src), [i, j]) / 1e9})
            out.append({"what": "host-staged GPU-to-GPU copy", "gpus": [i, j], "unit": "GB/s",
                        "value": size / timed(staged(dst, host, src), [i, j], 5) / 1e9})
            a = torch.empty(4, dtype=torch.uint8, device=f"cuda:{i}")
            b = torch.empty(4, dtype=torch.uint8, device=f"cuda:{j}")
            out.append({"what": "tiny GPU-to-GPU copy latency (4 bytes)", "gpus": [i, j],
                        "unit": "us", "value": timed(copier(b, a), [i, j], 1000) * 1e6})
            del dst
    print(json.dumps({"measurements": out, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
