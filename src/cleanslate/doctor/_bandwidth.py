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
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, TypedDict

#: One rank of the NCCL all-reduce: its own process (a CUDA context cannot be forked), started
#: from a temporary file because this script itself came on stdin.
ALLREDUCE_WORKER = """
import json, sys, time
import torch
import torch.distributed as dist
o = json.loads(sys.argv[1])
rank, world = o["rank"], o["world"]
torch.cuda.set_device(o["gpus"][rank])
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % o["port"], rank=rank,
                        world_size=world)
x = torch.ones(o["size"] // 4, dtype=torch.float32, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
dist.barrier()
start = time.perf_counter()
for _ in range(o["iters"]):
    dist.all_reduce(x)
torch.cuda.synchronize()
seconds = (time.perf_counter() - start) / o["iters"]
if rank == 0:
    print(json.dumps({"seconds": seconds}))
dist.destroy_process_group()
"""


def copier(dst: Any, src: Any) -> Any:
    """A function copying ``src`` into ``dst``."""
    return lambda: dst.copy_(src)


def staged(dst: Any, host: Any, src: Any) -> Any:
    """A function copying ``src`` into ``dst`` through pinned host memory."""
    def copy() -> None:
        host.copy_(src)
        dst.copy_(host)

    return copy


# The documents (TypedDicts of Python 3.8's ``typing``: the host's Python may be that old).


class AllReduce(TypedDict, total=False):
    """What :func:`allreduce` found: the bandwidths in GB/s, or ``error`` alone."""

    error: str
    algbw: float
    busbw: float


class Measurement(TypedDict):
    """One figure the script measured, on the GPUs it names."""

    what: str
    gpus: list[int]
    unit: str
    value: float


class _BandwidthsBase(TypedDict):
    measurements: list[Measurement]
    torch: str


class Bandwidths(_BandwidthsBase, total=False):
    """What the script prints when torch sees CUDA (else ``{"skipped": why}``)."""

    allreduce_skipped: str


def allreduce(gpus: list[int], size: int, iters: int, timeout: float) -> AllReduce:
    """NCCL all-reduce of ``size`` bytes over ``gpus``, one process per GPU: the algorithm and
    bus bandwidth (``busbw = algbw * 2 (n - 1) / n``, as nccl-tests define it), or an error."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    fd, path = tempfile.mkstemp(suffix=".py", prefix="cleanslate-allreduce-")
    with os.fdopen(fd, "w") as fh:
        fh.write(ALLREDUCE_WORKER)
    world = len(gpus)
    procs = []
    try:
        for rank in range(world):
            options = {"rank": rank, "world": world, "gpus": gpus, "port": port, "size": size,
                       "iters": iters}
            procs.append(subprocess.Popen([sys.executable, path, json.dumps(options)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        deadline = time.monotonic() + timeout
        outputs = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return {"error": f"the all-reduce did not finish in {timeout:g} s"}
            outputs.append((proc.returncode, out, err))
        for code, _out, err in outputs:
            if code != 0:
                lines = err.decode("utf-8", "replace").strip().splitlines() or [""]
                errors = [line for line in lines if "Error" in line]
                return {"error": f"an all-reduce rank exited {code}: "
                                 + (errors or lines)[-1].strip()[:300]}
        seconds = json.loads(outputs[0][1].decode().strip().splitlines()[-1])["seconds"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        os.unlink(path)
    algbw = size / seconds / 1e9
    return {"algbw": algbw, "busbw": algbw * 2 * (world - 1) / world}


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
    out: list[Measurement] = []

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
    result: Bandwidths = {"measurements": out, "torch": torch.__version__}
    if len(gpus) > 1 or options.get("allreduce"):
        del bufs, host
        torch.cuda.empty_cache()
        try:
            import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

            nccl = dist.is_available() and dist.is_nccl_available()
        except Exception:
            nccl = False
        if not nccl:
            result["allreduce_skipped"] = "torch.distributed has no NCCL"
        else:
            ar = allreduce(gpus, int(options.get("allreduce_mib") or 1024) << 20, 20,
                           float(options.get("allreduce_timeout_s") or 120))
            if "error" in ar:
                result["allreduce_skipped"] = ar["error"]
            else:
                out.append({"what": "NCCL all-reduce bus bandwidth", "gpus": gpus,
                            "unit": "GB/s", "value": ar["busbw"]})
                out.append({"what": "NCCL all-reduce algorithm bandwidth", "gpus": gpus,
                            "unit": "GB/s", "value": ar["algbw"]})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
