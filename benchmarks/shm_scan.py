"""What reading a full ``/dev/shm`` costs the probe (issue 35, Build 4).

From half full on, the collector reads what fills ``/dev/shm``: it walks it for the largest
files (bounded: 200,000 files, 1 s) and reads every process's ``/proc/PID/maps`` for the
processes that map them (bounded: 1 s). This times ``probe_host`` (the collector in a child
``python3`` and the ``none`` GPU backend) side by side, alternating, on two tmpfs mounts of
the same size: one empty (nothing is scanned) and one 95 % full of ``--files`` files (all of
them 4 KiB but one, which fills the rest), at each level of extra idle ``sleep`` processes
(``--levels``, started and ended by PID). Runs in private PID, network and mount namespaces
(``benchmarks/_isolate.py``). Prints a Markdown table: p50 of each, the difference, and the
scan's own ``elapsed_s``.

    sudo python benchmarks/shm_scan.py [--files 10000] [--levels 0,1000] [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _isolate import reexec_isolated

SIZE_MIB = 64


def _tmpfs() -> Path:
    path = Path(tempfile.mkdtemp(prefix="cs-shm-bench-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=1777", "cs-bench",
                    str(path)], check=True)
    return path


def _fill(path: Path, files: int) -> None:
    for i in range(files - 1):
        (path / f"seg.{i:06d}").write_bytes(b"\1" * 4096)
    used = (files - 1) * 4096
    rest = int(SIZE_MIB * (1 << 20) * 0.95) - used
    (path / "big").write_bytes(b"\1" * max(rest, 4096))


def _probe(shm_dir: Path) -> tuple[float, float | None, bool]:
    started = time.perf_counter()
    snapshot = asyncio.run(probe_host(LocalExecutor(), NoGpuBackend(), timeout=30.0,
                                      shm_dir=str(shm_dir)))
    took = (time.perf_counter() - started) * 1000
    usage = snapshot.shm_usage
    return took, usage.elapsed_s * 1000 if usage else None, bool(usage and usage.complete)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--levels", default="0,1000")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    reexec_isolated("CLEANSLATE_SHM_BENCH_ISOLATED", "shm_scan")
    empty, full = _tmpfs(), _tmpfs()
    _fill(full, args.files)
    print(f"{args.files} files in a {SIZE_MIB} MiB tmpfs, 95 % full; {args.runs} runs each, "
          f"alternating; p50 in ms\n")
    print("| extra processes | probe, empty /dev/shm | probe, full /dev/shm | added | "
          "scan (walk + maps) | complete |")
    print("|---|---|---|---|---|---|")
    for level in (int(x) for x in args.levels.split(",") if x):
        sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(level)]
        try:
            _probe(empty), _probe(full)  # warm-up
            base: list[float] = []
            loaded: list[float] = []
            scans: list[float] = []
            complete = True
            for _ in range(args.runs):
                base.append(_probe(empty)[0])
                took, scan, done = _probe(full)
                loaded.append(took)
                scans.append(scan or 0.0)
                complete = complete and done
            b, f = statistics.median(base), statistics.median(loaded)
            print(f"| {level} | {b:.1f} | {f:.1f} | {f - b:+.1f} | "
                  f"{statistics.median(scans):.1f} | {'yes' if complete else 'no'} |")
        finally:
            for proc in sleepers:
                proc.kill()
            for proc in sleepers:
                proc.wait()
    for path in (empty, full):
        subprocess.run(["umount", "-l", str(path)], check=False)
        os.rmdir(path)


if __name__ == "__main__":
    main()
