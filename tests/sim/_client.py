"""The sim's tests load it with the benchmark client (``cleanslate.bench``), as users do."""

from __future__ import annotations

import asyncio

import aiohttp

from cleanslate.bench import BenchConfig, ClosedLoop, LevelResult, Prompt, RandomWorkload, run_level
from cleanslate.bench._client import RequestBuilder, RequestRecord, send_request
from cleanslate.bench._sse import parse_stream
from cleanslate.wire import extract_text

MODEL = "cleanslate/sim-70b"


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, *,
    timeout_s: float = 30.0,
) -> RequestRecord:
    """One streamed completion (``ignore_eos``, usage asked for) through the client's request
    path; its record says ``ok``, ``output_tokens`` and ``error`` (``deadline`` when it did not
    end within ``timeout_s`` seconds)."""
    builder = RequestBuilder(url, MODEL, "completions", ignore_eos=True, extra_body={},
                             api_key=None, deadline_s=timeout_s)
    p = Prompt(prompt, len(prompt.split()), "approx", max_tokens)
    return await send_request(session, builder, p, builder.body(p), tokenizer=None)


async def streamed_text(session: aiohttp.ClientSession, url: str, prompt: str,
                        max_tokens: int) -> str:
    """The text of one streamed completion, parsed as the client parses streams."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        data = await resp.read()
    parsed = parse_stream([0.0], [data], keep_payloads=True)
    assert parsed.done and parsed.error is None
    return extract_text(parsed.payloads or [])


def closed_level(url: str, concurrency: int, num_prompts: int, input_len: int,
                 output_len: int) -> LevelResult:
    """A closed-loop level of ``num_prompts`` random prompts of exactly ``input_len`` sim tokens,
    asking for ``output_len`` tokens each."""
    config = BenchConfig(
        url=url, model=MODEL, workload=RandomWorkload(input_len=input_len, output_len=output_len),
        num_prompts=num_prompts,
    )
    return asyncio.run(run_level(config, ClosedLoop(concurrency=concurrency)))
