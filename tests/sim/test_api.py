"""The simulated server's OpenAI-compatible API, as a client sees it."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest

from tests.sim._client import closed_level, one_request
from tests.sim.conftest import SimServers

pytestmark = pytest.mark.slow

MODEL = "cleanslate/sim-70b"


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


def stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        url,
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    events = []
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                events.append({"done": True})
                break
            events.append(json.loads(line[6:]))
    return events


def test_models_and_health_declare_a_simulation(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.1")
    assert get(server.url + "/health")[0] == 200
    status, body = get(server.url + "/v1/models")
    assert status == 200
    models = json.loads(body)["data"]
    assert [m["id"] for m in models] == [MODEL]
    assert "simulation" in models[0]["owned_by"]


def test_completions_lengths_and_determinism(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.1", "--seed", "7")
    url = server.url + "/v1/completions"
    body = {"model": MODEL, "prompt": "one two three four", "max_tokens": 12, "ignore_eos": True}
    status, first = post(url, body)
    assert status == 200
    text = first["choices"][0]["text"]
    assert len(text.split()) == 12 and first["choices"][0]["finish_reason"] == "length"
    assert first["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16,
                              "prompt_tokens_details": {"cached_tokens": 0}}
    assert post(url, body)[1]["choices"][0]["text"] == text  # same seed, same prompt
    assert post(url, {**body, "seed": 1})[1]["choices"][0]["text"] != text
    # Without ignore_eos the request stops at its natural end (16..256 tokens) or max_tokens.
    long = post(url, {**body, "max_tokens": 1000, "ignore_eos": False})[1]
    n = long["usage"]["completion_tokens"]
    assert 16 <= n <= 256 and long["choices"][0]["finish_reason"] == "stop"
    pinned = post(url, {**body, "max_tokens": 1000, "ignore_eos": False, "min_tokens": 300})[1]
    assert pinned["usage"]["completion_tokens"] == 300
    # Another server with the same seed writes the same text.
    other = sims.start("--time-scale", "0.1", "--seed", "7")
    assert post(other.url + "/v1/completions", body)[1]["choices"][0]["text"] == text


def test_streaming_chat_with_usage(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.1")
    events = stream(
        server.url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 9,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert events[-1] == {"done": True}
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 9
    assert usage["usage"]["prompt_tokens"] == 3 + 3 + 2
    content = [e for e in events[:-2] if e["choices"][0]["delta"].get("content")]
    assert len(content) == 9
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-2])
    # Without include_usage there is no usage chunk.
    plain = stream(server.url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3})
    assert all("usage" not in e for e in plain)
    assert sum(1 for e in plain if e.get("choices")) == 3


def test_bad_requests_are_http_errors(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.1", "--context-length", "64")
    url = server.url + "/v1/completions"
    assert post(url, {"model": "other", "prompt": "x"})[0] == 404
    assert post(url, {"model": MODEL, "prompt": "x", "max_tokens": 100})[0] == 400
    assert post(url, {"model": MODEL})[0] == 400
    assert post(url, {"model": MODEL, "prompt": "x", "max_tokens": 0})[0] == 400


def test_ground_truth_matches_the_client(sims: SimServers) -> None:
    gt = sims.tmp / "gt.jsonl"
    server = sims.start("--time-scale", "0.2", "--ground-truth", str(gt))
    level = closed_level(server.url, 8, 24, 64, 20)
    assert level.completed == 24 and level.failed == 0
    assert level.total_output_tokens == 24 * 20 and level.output_tokens_source == "server"
    lines = [json.loads(x) for x in gt.read_text().splitlines()]
    assert len(lines) == 24
    for rec in lines:
        assert rec["status"] == "ok" and rec["stream"] is True
        assert rec["completion_tokens"] == 20 and rec["prompt_tokens"] == 64
        assert rec["arrival"] <= rec["first_token"] <= rec["last_token"]
        assert rec["arrival_mono"] <= rec["first_token_mono"] <= rec["last_token_mono"]
    # The client's median TTFT is within a few ms of the server's.
    server_ttft = sorted(r["first_token_mono"] - r["arrival_mono"] for r in lines)
    server_median = (server_ttft[11] + server_ttft[12]) / 2
    assert level.ttft_ms.median is not None
    assert abs(server_median - level.ttft_ms.median / 1000) < 0.05


def test_aborted_requests_free_their_slot(sims: SimServers) -> None:
    server = sims.start("--time-scale", "0.5", "--max-running-requests", "2")

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            tasks = [
                asyncio.ensure_future(one_request(session, server.url, "a b", 500))
                for _ in range(2)
            ]
            await asyncio.sleep(0.5)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.3)
            res = await one_request(session, server.url, "c d", 5, timeout_s=10)
            assert res.ok and res.output_tokens == 5

    asyncio.run(go())
