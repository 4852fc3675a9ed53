"""The simulated engine's OpenAI-compatible HTTP API: the handlers the launcher serves.

Endpoints: ``GET /health`` (200 while the process serves, even when the scheduler hangs),
``GET /health_generate`` (one token through the scheduler: 200, or 503 after 20 s),
``GET /v1/models``, ``GET /server_info`` and ``GET /get_server_info`` (the configuration in
effect, SGLang's keys), ``GET /metrics`` (SGLang-named Prometheus text, with
``--enable-metrics`` only, else 404; :mod:`cleanslate.sim.metrics`), ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream``, ``stream_options.include_usage``, ``max_tokens`` /
``max_completion_tokens``, ``min_tokens``, ``ignore_eos``, ``seed``). What they write (SSE
framing, chunks, usage, error bodies) is :mod:`cleanslate.wire`'s, as the fake server's is.

**Ground truth** (``--ground-truth FILE``): one JSON line per finished request, appended when it
ends (line-buffered)::

    {"id": "cmpl-sim-1-5", "endpoint": "completions", "stream": true, "status": "ok",
     "arrival": 1764504000.123456, "first_token": 1764504000.234567,
     "last_token": 1764504001.345678, "arrival_mono": 1234.5, "first_token_mono": 1234.6,
     "last_token_mono": 1235.7, "prompt_tokens": 1024, "completion_tokens": 128,
     "chunks": 128, "finish_reason": "length", "run_factor": 1.0123,
     "host_factor": 1.0, "cold_factor": 1.2}

``arrival`` is when the server began handling the request (body read); ``first_token`` /
``last_token`` are taken just before the first / last chunk *with content* is written to the
socket (for a non-streaming request both are the time the response is written). Times are wall
clock, epoch seconds (``time.time()``); the ``_mono`` fields are ``time.monotonic()``, the same
clock as any process on the same host uses. ``completion_tokens`` counts tokens;
``chunks`` counts content events (one token each unless the client lagged or
``--stream-interval`` > 1). ``status`` is ``ok``, ``aborted`` (the client went away) or
``error``. ``run_factor`` and ``host_factor`` are the server's noise factors on every step
time (``docs/sim-model.md``), ``cold_factor`` the cold-start factor of a prefill step when the
request arrived.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Mapping
from typing import IO, Any, TypedDict

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from cleanslate import __version__, wire
from cleanslate.sim.engine import DEGENERATE_TOKEN_ID, NAN_TOKEN_ID, Engine, SimRequest
from cleanslate.sim.metrics import CONTENT_TYPE, RequestStats
from cleanslate.sim.model import SimModel
from cleanslate.sim.text import (
    DEGENERATE_BYTES,
    NAN_BYTES,
    VOCAB_BYTES,
    count_words,
    text_seed,
)

HEALTH_GENERATE_TIMEOUT_S = 20.0
OWNED_BY = "cleanslate-sim (simulation, not a real model)"
SERVER_HEADER = "cleanslate-sim (simulation)"
#: The text of the token ids that are not vocabulary indices (faults).
SPECIAL_BYTES = {NAN_TOKEN_ID: NAN_BYTES, DEGENERATE_TOKEN_ID: DEGENERATE_BYTES}


class GroundTruth(TypedDict):
    """One line of the ground-truth file (the module docstring)."""

    id: str
    endpoint: str
    stream: bool
    status: str
    arrival: float
    arrival_mono: float
    first_token: float | None
    first_token_mono: float | None
    last_token: float | None
    last_token_mono: float | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    chunks: int
    finish_reason: str | None
    run_factor: float
    host_factor: float
    cold_factor: float


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response(wire.http_error_body(status, message, kind), status=status)


class Api:
    """The routes of one simulated server, over its scheduler (``engine``)."""

    def __init__(
        self,
        *,
        model_name: str,
        model_path: str,
        stream_interval: int,
        model: SimModel,
        engine: Engine,
        ground_truth: IO[str] | None,
        created: int,
        server_info: Mapping[str, object] | None = None,
        metrics: CollectorRegistry | None = None,
        stats: RequestStats | None = None,
    ) -> None:
        """``server_info``: the static part of ``/server_info`` (the launcher's
        :func:`~cleanslate.sim.launcher.server_args`); ``metrics``: the registry ``/metrics``
        writes (``None``: metrics are off, 404); ``stats``: where finished requests are
        counted for it."""
        self.model_name = model_name
        self.model_path = model_path
        self.stream_interval = stream_interval
        self.model = model
        self.engine = engine
        self.gt = ground_truth
        self._ids = itertools.count(1)
        self._created = created
        self._info = dict(server_info or {})
        self._metrics = metrics
        self.stats = stats

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        # SGLang 0.5 serves both; /get_server_info is its deprecated spelling.
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200, headers={"Server": SERVER_HEADER})

    async def health_generate(self, request: web.Request) -> web.Response:
        """SGLang's deeper health check: one token through the scheduler, 503 after 20 s."""
        engine = self.engine
        req = SimRequest(f"health-{next(self._ids)}", 1, 1, 0, True, 1)
        engine.submit(req, probe=True)
        try:
            while not req.finished:
                await asyncio.wait_for(req.next_tokens(), HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            return web.Response(status=503, text="the scheduler did not answer")
        finally:
            engine.finish(req)
        return web.Response(status=200, headers={"Server": SERVER_HEADER})

    async def models(self, request: web.Request) -> web.Response:
        body = wire.models_body(
            [
                {
                    "id": self.model_name,
                    "created": self._created,
                    "owned_by": OWNED_BY,
                    "root": self.model_path,
                    "max_model_len": self.model.s.context_length,
                }
            ]
        )
        return web.json_response(body, headers={"Server": SERVER_HEADER})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text read from the live state; 404 without ``--enable-metrics``."""
        if self._metrics is None:
            return web.Response(status=404, text="Not Found",
                                headers={"Server": SERVER_HEADER})
        return web.Response(body=generate_latest(self._metrics),
                            headers={"Content-Type": CONTENT_TYPE, "Server": SERVER_HEADER})

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's server info: the server arguments (``max_running_requests`` is ``null``
        when not given), the scheduler's ``max_total_num_tokens`` and ``max_req_input_len``,
        and one internal state with the limits in effect
        (``effective_max_running_requests_per_dp``, ``memory_usage``) and
        ``last_gen_throughput``."""
        engine = self.engine
        plan = self.model.memory_plan()
        capacity = engine.kv_capacity
        state: dict[str, object] = {
            **self._info,
            "last_gen_throughput": engine.gen_throughput,
            "memory_usage": {
                "weight": round(plan.weights_mib / 1024, 2),
                "kvcache": round(plan.kv_cache_mib / 1024, 2),
                "token_capacity": capacity,
                "graph": round(plan.graph_mib / 1024, 2),
            },
            "effective_max_running_requests_per_dp": engine.max_running,
        }
        body = {
            **self._info,
            "status": "ready",
            "max_total_num_tokens": capacity,
            "max_req_input_len": max(0, min(self.model.s.context_length, capacity) - 1),
            "internal_states": [state],
            "version": f"{__version__}+sim",
        }
        return web.json_response(body, headers={"Server": SERVER_HEADER})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _prompt(self, body: dict[str, Any], chat: bool) -> tuple[int, str]:
        """(prompt tokens, the key that seeds the text); raises ValueError for bad input."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            n = 3
            parts: list[str] = []
            for m in messages:
                if not isinstance(m, dict):
                    raise ValueError("each message must be an object")
                content = m.get("content") or ""
                if isinstance(content, list):
                    content = " ".join(
                        str(c.get("text", "")) for c in content if isinstance(c, dict)
                    )
                text = str(content)
                parts.append(text)
                n += 3 + count_words(text)
            return n, "\n".join(parts)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return max(1, count_words(prompt)), prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt), ",".join(map(str, prompt[:64]))
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return max(1, count_words(prompt[0])), prompt[0]
        raise ValueError("'prompt' must be a string or a list of token ids (one prompt)")

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival, arrival_mono = time.time(), time.monotonic()
        engine = self.engine
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            prompt_tokens, key = self._prompt(body, chat)
        except ValueError as exc:
            return _error(400, f"invalid request: {exc}")
        model = body.get("model")
        if model not in (None, self.model_name, self.model_path):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        ctx = self.model.s.context_length
        default_max = 16 if not chat else max(1, ctx - prompt_tokens)
        max_new = body.get("max_completion_tokens") if chat else None
        if max_new is None:
            max_new = body.get("max_tokens")
        if max_new is None:
            max_new = default_max
        try:
            max_new = int(max_new)
            min_new = int(body.get("min_tokens") or 0)
        except (TypeError, ValueError):
            return _error(400, "max_tokens and min_tokens must be integers")
        if max_new < 1:
            return _error(400, f"max_tokens must be at least 1, got {max_new}.")
        if prompt_tokens + max_new > ctx:
            return _error(
                400,
                f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{prompt_tokens + max_new} tokens ({prompt_tokens} in the messages, {max_new} "
                "in the completion). Please reduce the length of the messages or completion.",
            )
        seed = body.get("seed")
        state = text_seed(self.model.s.seed, key, seed if isinstance(seed, int) else None)
        req = SimRequest(
            f"{'chatcmpl' if chat else 'cmpl'}-sim-{os.getpid()}-{next(self._ids)}",
            prompt_tokens,
            max_new,
            min_new,
            bool(body.get("ignore_eos", False)),
            state,
            self.stream_interval,
        )
        if engine.prefix_cache is not None:
            req.cached = engine.prefix_cache.lookup_and_insert(key, prompt_tokens)
        if not engine.fits_ever(prompt_tokens, req.stop_at):
            return _error(
                400,
                f"the request needs {req.kv_tokens} tokens of KV cache but the simulated server "
                f"has {engine.kv_capacity} in total",
            )
        record: GroundTruth = {
            "id": req.rid,
            "endpoint": "chat/completions" if chat else "completions",
            "stream": bool(body.get("stream", False)),
            "status": "error",
            "arrival": arrival,
            "arrival_mono": arrival_mono,
            "first_token": None,
            "first_token_mono": None,
            "last_token": None,
            "last_token_mono": None,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": req.cached,
            "completion_tokens": 0,
            "chunks": 0,
            "finish_reason": None,
            "run_factor": self.model.run_factor,
            "host_factor": self.model.host_factor,
            "cold_factor": self.model.cold_factor(prefill=True),
        }
        engine.submit(req)
        try:
            if body.get("stream"):
                so = body.get("stream_options")
                usage = isinstance(so, dict) and bool(so.get("include_usage"))
                return await self._stream(request, req, chat, usage, record)
            return await self._whole(req, chat, record)
        except (ConnectionError, asyncio.CancelledError):
            record["status"] = "aborted"
            raise
        finally:
            engine.finish(req)
            if self.stats is not None:
                self.stats.finished(req.prompt_tokens, req.generated, req.cached,
                                    time.monotonic() - arrival_mono, record["status"] != "ok")
            if self.gt is not None:
                self.gt.write(json.dumps(record) + "\n")

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        chat: bool,
        usage: bool,
        record: GroundTruth,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": wire.EVENT_STREAM,
                "Cache-Control": "no-cache",
                "Server": SERVER_HEADER,
            }
        )
        await resp.prepare(request)
        chunks_of = wire.ChunkTemplate(
            req.rid, self.model_name, chat=chat, created=int(time.time())
        )
        if chat:
            await resp.write(chunks_of.role())
        content = chunks_of.content
        vocab = VOCAB_BYTES
        stats = self.stats
        chunks = 0
        first = True
        last_mono = 0.0
        while True:
            toks, done = await req.next_tokens()
            if toks:
                text = b"".join(vocab[t] if t >= 0 else SPECIAL_BYTES[t] for t in toks)
                now = time.time()
                if first:
                    record["first_token"] = now
                    record["first_token_mono"] = last_mono = time.monotonic()
                    first = False
                    if stats is not None:
                        stats.ttft.observe(last_mono - record["arrival_mono"])
                elif stats is not None:
                    mono = time.monotonic()
                    gap = mono - last_mono
                    stats.itl.observe(gap / len(toks), len(toks), gap)
                    last_mono = mono
                if done:
                    record["last_token"] = now
                    record["last_token_mono"] = time.monotonic()
                await resp.write(content(text, req.finish_reason if done else None))
                chunks += 1
            if done:
                break
        record["completion_tokens"] = req.generated
        record["chunks"] = chunks
        record["finish_reason"] = req.finish_reason
        out = chunks_of.usage(req.prompt_tokens, req.generated, self._cached(req)) if usage \
            else b""
        await resp.write(out + wire.DONE_EVENT)
        record["status"] = "ok"
        await resp.write_eof()
        return resp

    def _cached(self, req: SimRequest) -> int | None:
        """The request's cached prompt tokens for its usage (``None`` with the cache off)."""
        return None if self.engine.prefix_cache is None else req.cached

    async def _whole(self, req: SimRequest, chat: bool, record: GroundTruth) -> web.Response:
        tokens: list[int] = []
        stats = self.stats
        while True:
            toks, done = await req.next_tokens()
            if stats is not None and toks and not tokens:
                stats.ttft.observe(time.monotonic() - record["arrival_mono"])
            tokens.extend(toks)
            if done:
                break
        text = b"".join(VOCAB_BYTES[t] if t >= 0 else SPECIAL_BYTES[t] for t in tokens)
        body = wire.whole_response(
            req.rid,
            self.model_name,
            chat=chat,
            created=int(time.time()),
            text=text.decode(),
            finish_reason=req.finish_reason,
            prompt_tokens=req.prompt_tokens,
            completion_tokens=req.generated,
            cached_tokens=self._cached(req),
        )
        now, mono = time.time(), time.monotonic()
        record["first_token"] = record["last_token"] = now
        record["first_token_mono"] = record["last_token_mono"] = mono
        record["completion_tokens"] = req.generated
        record["chunks"] = 1
        record["finish_reason"] = req.finish_reason
        record["status"] = "ok"
        return web.json_response(body, headers={"Server": SERVER_HEADER})
