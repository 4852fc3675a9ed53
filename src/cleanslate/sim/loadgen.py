"""A minimal closed-loop streaming client, for the sim's own tests and ``bench/`` scripts.

It is *not* the benchmark client of ``cleanslate bench`` (``cleanslate.bench``); it measures
just enough to check the simulated engine: per request the time to first content chunk, the end
time and the token count (from the ``usage`` chunk), and per run the output tokens per second
(total tokens / first send -> last receive). Times are ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class RequestResult:
    ok: bool
    sent: float
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    chunks: int = 0
    text: str = ""
    error: str | None = None


@dataclass
class RunResult:
    concurrency: int
    requests: list[RequestResult] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def output_tokens(self) -> int:
        return sum(r.tokens for r in self.ok)

    @property
    def duration_s(self) -> float:
        return max(1e-9, self.end - self.start)

    @property
    def output_throughput(self) -> float:
        """Output tokens per second over the run."""
        return self.output_tokens / self.duration_s

    @property
    def errors(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    def ttft_s(self, q: float = 0.5) -> float:
        values = sorted(r.first - r.sent for r in self.ok if r.first is not None)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]

    def mean_ttft_s(self) -> float:
        values = [r.first - r.sent for r in self.ok if r.first is not None]
        return statistics.fmean(values) if values else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": len(self.requests),
            "errors": self.errors,
            "output_tokens": self.output_tokens,
            "duration_s": round(self.duration_s, 3),
            "output_throughput": round(self.output_throughput, 1),
            "ttft_mean_s": round(self.mean_ttft_s(), 4),
            "ttft_p50_s": round(self.ttft_s(0.5), 4),
            "ttft_p99_s": round(self.ttft_s(0.99), 4),
        }


def make_prompt(index: int, words: int) -> str:
    """A prompt of exactly ``words`` sim tokens (distinct per index)."""
    return " ".join(f"w{index}x{i}" for i in range(words))


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    chat: bool = False,
    keep_text: bool = False,
    timeout_s: float | None = None,
) -> RequestResult:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
        marker = b'"content":"'
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
        marker = b'"text":"'
    res = RequestResult(ok=False, sent=time.monotonic())
    parts: list[str] = []
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url + path, json=body, timeout=timeout) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    res.ok = True
                    break
                i = line.find(marker)
                if i >= 0 and line[i + len(marker) : i + len(marker) + 1] != b'"':
                    now = time.monotonic()
                    if res.first is None:
                        res.first = now
                    res.end = now
                    res.chunks += 1
                    if keep_text:
                        parts.append(
                            json.loads(line[6:])["choices"][0].get("text")
                            or json.loads(line[6:])["choices"][0]["delta"]["content"]
                        )
                elif b'"usage"' in line:
                    res.tokens = int(json.loads(line[6:])["usage"]["completion_tokens"])
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.text = "".join(parts)
    return res


async def closed_loop(
    url: str,
    model: str,
    concurrency: int,
    num_requests: int,
    input_len: int,
    output_len: int,
    chat: bool = False,
    timeout_s: float | None = None,
) -> RunResult:
    """Keep ``concurrency`` requests in flight until ``num_requests`` were sent."""
    run = RunResult(concurrency=concurrency)
    counter = iter(range(num_requests))
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def user() -> None:
            for i in counter:
                r = await one_request(
                    session,
                    url,
                    model,
                    make_prompt(i, input_len),
                    output_len,
                    chat,
                    timeout_s=timeout_s,
                )
                run.requests.append(r)

        run.start = time.monotonic()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        run.end = max((r.end or r.sent) for r in run.requests) if run.requests else time.monotonic()
    return run
