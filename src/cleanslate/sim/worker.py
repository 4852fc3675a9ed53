"""The processes the simulated launcher starts (``python -m cleanslate.sim.worker ROLE``).

Roles:

``scheduler``
    One per TP rank. Renames itself ``sim::scheduler_TP<rank>`` (``prctl(PR_SET_NAME)``), reads
    its plan as one JSON line on stdin, "allocates" its simulated GPU memory in stages in the
    ledger (CUDA context, weights, KV cache and CUDA graphs), prints ``READY`` on stdout and then
    obeys commands on stdin (``CRASH``: write a real traceback and exit 1). When stdin closes
    (the launcher died) it stays alive, as real schedulers do, until it is signalled. It does not
    use ``PR_SET_PDEATHSIG``.
``grandchild``
    The helper of the ``orphan-grandchild`` fault: in a new session, holds memory, sleeps.
``listener``
    The orphan of the ``leave-port`` fault: keeps a port listening (its own socket, or the
    server's listening socket inherited as a file descriptor).

Only the standard library and :mod:`cleanslate.sim.ledger` are imported, so a worker starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from datetime import datetime
from typing import NoReturn, TypedDict

from cleanslate.sim import ledger


def set_process_name(name: str) -> None:
    """Rename this process as ``setproctitle`` does for real engines.

    ``/proc/PID/comm`` gets the first 15 bytes (``prctl(PR_SET_NAME)``; ``sim::scheduler_TP0``
    reads ``sim::scheduler_`` there, as ``sglang::scheduler_TP0`` reads ``sglang::schedul``), and
    the command line (``/proc/PID/cmdline``, what ``ps -o args`` shows) becomes the full name:
    the original argv memory, whose bounds are fields 48-49 of ``/proc/self/stat``, is
    overwritten (Python keeps its own copy of argv, so nothing reads it any more).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_name = 15
        libc.prctl(pr_set_name, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/stat", "rb") as fh:
            data = fh.read().decode()
        rest = data[data.rfind(")") + 2 :].split()
        arg_start, arg_end = int(rest[45]), int(rest[46])
        size = arg_end - arg_start
        title = name.encode()[: size - 2]
        if size > 2 and arg_start > 0:
            # A non-NUL last byte tells the kernel the area was rewritten (as setproctitle
            # does): /proc/PID/cmdline then ends at the first NUL, giving one clean argument.
            pad = size - len(title) - 1
            ctypes.memmove(arg_start, title + b"\0" + b" " * pad, size)
    except (OSError, ValueError, IndexError):
        pass


def log(tag: str, message: str) -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp} {tag}] {message}\n")
    sys.stderr.flush()


def _gb(mib: float) -> str:
    return f"{mib / 1024:.2f}"


def _sleep_forever() -> NoReturn:
    while True:
        time.sleep(3600)


# --- the simulated attention path whose bug is the crash fault ----------------------------------
class PrefillMetadata:
    """Attention metadata of a prefill batch (simulated)."""

    __slots__ = ("page_table", "seq_lens")

    def __init__(self, batch_size: int) -> None:
        self.page_table = [0] * batch_size
        self.seq_lens = [1] * batch_size


class FlashAttentionBackend:
    def init_forward_metadata(self, batch_size: int) -> None:
        metadata = PrefillMetadata(batch_size)
        # The eager fallback above the captured batch sizes reads a field only decode has.
        self._page_table = metadata.page_table_1_flattened  # type: ignore[attr-defined]


class ModelRunner:
    def __init__(self) -> None:
        self.attn_backend = FlashAttentionBackend()

    def forward_extend(self, batch_size: int) -> None:
        self.attn_backend.init_forward_metadata(batch_size)

    def forward(self, batch_size: int) -> None:
        self.forward_extend(batch_size)


class OutOfMemoryError(RuntimeError):
    """Raised like ``torch.OutOfMemoryError`` (the traceback prints it with that name)."""


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


class TokenToKVPool:
    def __init__(self, size_tokens: int, request_mib: float, free_mib: float, total_mib: float):
        self.size = size_tokens
        self._allocate(request_mib, free_mib, total_mib)

    def _allocate(self, request_mib: float, free_mib: float, total_mib: float) -> None:
        in_use = total_mib - free_mib
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {_gb(request_mib)} GiB. GPU 0 has a total "
            f"capacity of {_gb(total_mib)} GiB of which {free_mib:.2f} MiB is free. Process "
            f"{os.getpid()} has {_gb(in_use)} GiB memory in use. Of the allocated memory "
            f"{_gb(in_use * 0.97)} GiB is allocated by PyTorch, and {_gb(in_use * 0.03)} GiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
            "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )


def _crash(tag: str, batch_size: int) -> NoReturn:
    try:
        ModelRunner().forward(batch_size)
    except AttributeError:
        sys.stderr.write(f"[{datetime.now():%Y-%m-%d %H:%M:%S} {tag}] Scheduler hit an exception: ")
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


class WorkerPlan(TypedDict):
    """What the launcher sends a scheduler worker on its first stdin line (one JSON object)."""

    rank: int
    gpu: int
    ledger_dir: str | None
    release_delay_s: float
    load_s: float
    gpu_memory_mib: int
    context_mib: float
    weights_mib: float
    static_pool_mib: float
    kv_cache_mib: float
    kv_capacity_tokens: int
    graph_mib: float
    workspace_mib: float
    cuda_graph_max_bs: int
    oom: bool
    forced_oom: bool
    not_enough_memory: bool
    ignore_sigterm: bool
    orphan_grandchild_mib: int | None


def _oom(tag: str, plan: WorkerPlan) -> NoReturn:
    total = float(plan["gpu_memory_mib"])
    used = float(plan["context_mib"]) + float(plan["weights_mib"])
    request = max(1024.0, float(plan["kv_cache_mib"]) + float(plan["graph_mib"]))
    free = max(0.0, total - used - request) if not plan.get("forced_oom") else 512.0
    free = min(free, request * 0.5)
    try:
        TokenToKVPool(int(plan["kv_capacity_tokens"]), request, free, total)
    except OutOfMemoryError:
        sys.stderr.write(f"[{datetime.now():%Y-%m-%d %H:%M:%S} {tag}] Scheduler hit an exception: ")
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def _not_enough_memory(tag: str) -> NoReturn:
    try:
        raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    except RuntimeError:
        sys.stderr.write(f"[{datetime.now():%Y-%m-%d %H:%M:%S} {tag}] Scheduler hit an exception: ")
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


# --- roles ---------------------------------------------------------------------------------------
def run_scheduler() -> NoReturn:
    first = sys.stdin.readline()
    plan: WorkerPlan = json.loads(first)
    rank = int(plan["rank"])
    gpu = int(plan["gpu"])
    tag = f"TP{rank}"
    name = f"sim::scheduler_TP{rank}"
    set_process_name(name)
    directory: str | None = plan.get("ledger_dir")
    delay = float(plan.get("release_delay_s") or 0.0)

    def alloc(mib: float) -> None:
        if directory:
            ledger.allocate(directory, gpu, int(mib), name, release_delay_s=delay)

    def on_term(signum: int, frame: object) -> None:
        if directory:
            ledger.release(directory, gpu)
        os._exit(0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if plan.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)

    total = float(plan["gpu_memory_mib"])
    ctx = float(plan["context_mib"])
    weights = float(plan["weights_mib"])
    alloc(ctx)
    log(tag, f"Simulated scheduler (cleanslate sim; no GPU is used) on simulated GPU {gpu}")
    log(tag, f"Load weight begin. avail mem={_gb(total - ctx)} GB")
    time.sleep(float(plan.get("load_s") or 0.0))
    alloc(ctx + weights)
    log(tag, f"Load weight end. type=SimForCausalLM, dtype=fp8, mem usage={_gb(weights)} GB")

    if plan.get("oom"):
        _oom(tag, plan)
    if plan.get("not_enough_memory"):
        _not_enough_memory(tag)
    kv = float(plan["kv_cache_mib"])
    static = float(plan["static_pool_mib"])
    log(tag, f"KV Cache is allocated. #tokens: {plan['kv_capacity_tokens']}, KV size: {_gb(kv)} GB")
    alloc(ctx + static)
    # Prefill activations live outside the static pool (docs/sim-model.md, memory model).
    workspace = float(plan.get("workspace_mib") or 0.0)
    static += workspace
    alloc(ctx + static)
    graph = float(plan["graph_mib"])
    if graph > 0:
        log(
            tag,
            f"Capture cuda graph begin. This can take up to several minutes. bs up to "
            f"{plan.get('cuda_graph_max_bs')}",
        )
        alloc(ctx + static + graph)
        log(tag, f"Capture cuda graph end. mem usage={_gb(graph)} GB")

    grandchild_mib = plan.get("orphan_grandchild_mib")
    if grandchild_mib and rank == 0:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cleanslate.sim.worker",
                "grandchild",
                "--gpu",
                str(gpu),
                "--mib",
                str(int(grandchild_mib)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert child.stdout is not None
        child.stdout.readline()  # its memory is in the ledger before this worker is ready
        child.stdout.close()
        log(tag, f"Started a helper process in a new session (pid {child.pid})")

    sys.stdout.write("READY\n")
    sys.stdout.flush()

    for line in sys.stdin:
        command = line.strip().split()
        if not command:
            continue
        if command[0] == "CRASH":
            batch = int(command[1]) if len(command) > 1 else 1
            _crash(tag, batch)
    # stdin closed: the launcher is gone. A real scheduler keeps its memory and waits.
    _sleep_forever()


def _report_ready() -> None:
    """Tell the parent we are set up, then point stdout at /dev/null (nobody reads it)."""
    with contextlib.suppress(OSError):
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def run_grandchild(gpu: int, mib: int) -> NoReturn:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    name = "sim::grandchild"
    set_process_name(name)
    directory = os.environ.get("CLEANSLATE_SIM_GPU_DIR")
    if directory:
        ledger.allocate(directory, gpu, mib, name)
    log(
        "grandchild",
        f"Simulated helper holding {mib} MiB on simulated GPU {gpu} "
        f"(pid {os.getpid()}, session {os.getsid(0)})",
    )
    _report_ready()
    _sleep_forever()


def run_listener(port: int, host: str, fd: int | None) -> NoReturn:
    set_process_name("sim::listener")
    if fd is not None:
        sock = socket.socket(fileno=fd)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
    log("listener", f"Simulated orphan keeps port {port} listening (pid {os.getpid()})")
    sock_keep = sock  # noqa: F841  (held open until the process ends)
    _report_ready()
    _sleep_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cleanslate.sim.worker")
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("scheduler")
    g = sub.add_parser("grandchild")
    g.add_argument("--gpu", type=int, required=True)
    g.add_argument("--mib", type=int, required=True)
    lp = sub.add_parser("listener")
    lp.add_argument("--port", type=int, required=True)
    lp.add_argument("--host", default="127.0.0.1")
    lp.add_argument("--fd", type=int, default=None)
    args = parser.parse_args(argv)
    if args.role == "scheduler":
        run_scheduler()
    elif args.role == "grandchild":
        run_grandchild(args.gpu, args.mib)
    else:
        run_listener(args.port, args.host, args.fd)


if __name__ == "__main__":
    main()
