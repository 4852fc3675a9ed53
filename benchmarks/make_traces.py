"""Write the committed trace fixtures: a Mooncake-format trace and an Azure-format trace.

Both are synthetic (no production trace can be downloaded here) and shaped like their
originals, from one documented seed (``SEED``), so that running this again writes the same
bytes:

``tests/fixtures/traces/mooncake-500.jsonl``
    500 requests, Poisson arrivals at 5 req/s (timestamps in ms from the start), 512-token
    blocks. Requests belong to 24 sessions; a session's requests start with its own shared
    chain of 1-6 blocks (a system prompt and an earlier history), and 30 % of sessions also
    share one of 3 common "tool" chains before it, so the same block hash appears in many
    requests, as in Mooncake's published trace. Input lengths are the shared blocks plus a
    log-normal tail (median 600 tokens), output lengths log-normal (median 120, at least 1).
``tests/fixtures/traces/azure-500.csv``
    500 rows of Azure's LLM inference trace columns (``TIMESTAMP,ContextTokens,
    GeneratedTokens``), absolute times with 7 fractional digits as Azure writes them, gamma
    arrivals (shape 0.5: burstier than Poisson) at 5 req/s, log-normal lengths, and 5 rows
    asking for 0 output tokens (the real trace has such rows; a reader must not send them as
    requests for nothing).

Usage: ``python benchmarks/make_traces.py [--out tests/fixtures/traces]``
"""

from __future__ import annotations

import argparse
import json
import math
import random
from datetime import datetime, timedelta
from pathlib import Path

SEED = 20261203
REQUESTS = 500
RATE = 5.0
BLOCK = 512
REPO = Path(__file__).resolve().parent.parent


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def mooncake(rng: random.Random) -> list[dict[str, object]]:
    next_id = 0

    def chain(n: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + n))
        next_id += n
        return out

    tools = [chain(rng.randint(1, 3)) for _ in range(3)]
    sessions = []
    for _ in range(24):
        head = rng.choice(tools) if rng.random() < 0.3 else []
        sessions.append(head + chain(rng.randint(1, 6)))
    rows = []
    t = 0.0
    for _ in range(REQUESTS):
        t += rng.expovariate(RATE)
        shared = rng.choice(sessions)
        tail = _lognormal(rng, 600, 0.8, 1, 6000)
        length = len(shared) * BLOCK + tail
        own = chain(math.ceil(tail / BLOCK))
        rows.append({"timestamp": round(t * 1000), "input_length": length,
                     "output_length": _lognormal(rng, 120, 0.7, 1, 1024),
                     "hash_ids": shared + own})
    return rows


def azure(rng: random.Random) -> list[tuple[str, int, int]]:
    start = datetime(2023, 11, 16, 18, 15, 46)
    zero = set(rng.sample(range(REQUESTS), 5))
    rows = []
    t = 0.0
    shape = 0.5
    for i in range(REQUESTS):
        t += rng.gammavariate(shape, 1.0 / (RATE * shape))
        stamp = start + timedelta(seconds=t)
        text = stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + str(rng.randint(0, 9))
        out = 0 if i in zero else _lognormal(rng, 100, 0.9, 1, 2048)
        rows.append((text, _lognormal(rng, 900, 0.9, 1, 8000), out))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests/fixtures/traces")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    moon = args.out / "mooncake-500.jsonl"
    moon.write_text("".join(json.dumps(r) + "\n" for r in mooncake(rng)), encoding="utf-8")
    az = args.out / "azure-500.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{t},{c},{g}\n" for t, c, g in azure(rng)), encoding="utf-8")
    for path in (moon, az):
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
              f"({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
