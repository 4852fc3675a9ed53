"""What a hostile server costs the benchmark client: time, memory and how its requests count.

Each of the fake server's hostile streams (``hostile=KIND``,
:data:`cleanslate.testing._hostile.HOSTILE_KINDS`) and its other faults answer one level of 4
requests, 2 at a time, each with a 1 s deadline, in a fresh process (so that its peak memory is
its own); the anchor is the same level against the well-behaved fake (``ok``). Printed per
server: seconds, the process's peak memory (MiB) and its growth over the anchor's, the requests
sent, completed and failed by class, and whether ``sent == completed + failed``::

    python benchmarks/hostile_streams.py
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time

REQUESTS, CONCURRENCY, DEADLINE_S = 4, 2, 1.0
OTHER_FAULTS = ("endless", "hang", "malformed-every=1", "error-body", "http-500")


def _one(fault: str) -> dict[str, object]:
    from cleanslate.bench import BenchConfig, run_benchmark
    from cleanslate.testing.fake_openai import FakeOptions, parse_faults, start_fake_server

    async def run() -> dict[str, object]:
        server = await start_fake_server(FakeOptions(parse_faults([fault])))
        config = BenchConfig.model_validate({
            "url": server.url, "model": "m", "num_prompts": REQUESTS,
            "loads": [{"kind": "closed", "concurrency": CONCURRENCY}],
            "workload": {"kind": "random", "input_len": 8, "output_len": 4},
            "request_timeout_s": DEADLINE_S, "read_timeout_s": DEADLINE_S})
        t0 = time.perf_counter()
        try:
            level = (await run_benchmark(config)).levels[0]
        finally:
            server.close()
            await server.wait_closed()
        return {"fault": fault, "seconds": time.perf_counter() - t0, "sent": level.sent,
                "completed": level.completed, "failed": level.failed,
                "errors": level.errors, "asked": server.stats.requests}

    out = asyncio.run(run())
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(_one(sys.argv[2])))
        return
    from cleanslate.testing._hostile import HOSTILE_KINDS

    faults = ["ok", *(f"hostile={k}" for k in HOSTILE_KINDS), *OTHER_FAULTS]
    rows = []
    for fault in faults:
        done = subprocess.run([sys.executable, __file__, "--one", fault], check=True,
                              capture_output=True, text=True)
        rows.append(json.loads(done.stdout.splitlines()[-1]))
    anchor = float(rows[0]["peak_rss_mib"])
    print(f"{'server':30} {'s':>5} {'MiB':>6} {'+MiB':>5}  sent done fail  classes")
    for r in rows:
        counted = r["sent"] == int(r["completed"]) + int(r["failed"]) == r["asked"]
        rss = float(r["peak_rss_mib"])
        print(f"{r['fault']:30} {float(r['seconds']):5.2f} {rss:6.1f} {rss - anchor:5.1f}  "
              f"{r['sent']:>4} {r['completed']:>4} {r['failed']:>4}  {r['errors']}"
              f"{'' if counted else '  NOT COUNTED'}")
    worst = max(rows, key=lambda r: float(r["seconds"]))
    print(f"\n{len(rows) - 1} servers; the longest {worst['fault']} {worst['seconds']:.2f} s; "
          f"the most memory over the anchor "
          f"{max(float(r['peak_rss_mib']) for r in rows) - anchor:.1f} MiB")


if __name__ == "__main__":
    main()
