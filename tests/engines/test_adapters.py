from __future__ import annotations

import sys
from typing import Any

import pytest

from cleanslate.engines import EngineAdapter, engine_names, get_engine, require_signature
from cleanslate.engines.vllm import API_SERVER_MODULE
from cleanslate.errors import InputError


def test_registry_has_every_engine_users_name_in_yaml() -> None:
    assert set(engine_names()) >= {
        "sglang",
        "vllm",
        "trtllm",
        "transformers",
        "llamacpp",
        "command",
        "sim",
    }
    for name in engine_names():
        if name == "command":
            continue
        adapter = get_engine(name)
        assert isinstance(adapter, EngineAdapter)
        assert adapter.readiness_path == "/health"
        assert 0 < adapter.default_port < 65536
        assert adapter.signature is require_signature(name)


def test_unknown_engine_suggests_the_closest_name() -> None:
    with pytest.raises(InputError, match="did you mean vllm") as info:
        get_engine("vlm")
    assert info.value.where == "engine"


def test_vllm_default_launch() -> None:
    argv = get_engine("vllm").build_argv("M", 8001, {"max-model-len": 512, "enforce-eager": True})
    assert argv == [
        "vllm",
        "serve",
        "M",
        "--port",
        "8001",
        "--max-model-len",
        "512",
        "--enforce-eager",
    ]


def test_vllm_launch_override_for_the_cpu_build_puts_the_model_after_model() -> None:
    adapter = get_engine("vllm", launch=["/venv/bin/python", "-m", API_SERVER_MODULE])
    assert adapter.build_argv("/models/tiny", 8124, {"dtype": "bfloat16"}) == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
        "--port",
        "8124",
        "--dtype",
        "bfloat16",
    ]
    assert adapter.help_argv() == ["/venv/bin/python", "-m", API_SERVER_MODULE, "--help=all"]
    # an explicit model_flag wins over the guess from the prefix
    positional = get_engine("vllm", launch=["my-vllm"], model_flag=None)
    assert positional.build_argv("M", 1) == ["my-vllm", "M", "--port", "1"]


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("sglang", ["python", "-m", "sglang.launch_server", "--model-path", "M", "--port", "7",
                    "--enable-metrics"]),
        ("transformers", ["transformers", "serve", "M", "--port", "7"]),
        ("trtllm", ["trtllm-serve", "M", "--port", "7"]),
        ("llamacpp", ["llama-server", "-m", "M", "--port", "7"]),
        (
            "sim",
            [
                sys.executable,
                "-m",
                "cleanslate.sim",
                "serve",
                "--model-path",
                "M",
                "--port",
                "7",
                "--enable-metrics",
            ],
        ),
    ],
)
def test_model_and_port_placement(engine: str, expected: list[str]) -> None:
    assert get_engine(engine).build_argv("M", 7) == expected


def test_default_ports_and_host() -> None:
    assert get_engine("sglang").build_argv("M")[-3:-1] == ["--port", "30000"]
    assert get_engine("llamacpp").default_port == 8080
    assert get_engine("vllm").build_argv("M", 9, host="0.0.0.0")[-2:] == ["--host", "0.0.0.0"]
    assert get_engine("sglang", python="/opt/py").launch_prefix[0] == "/opt/py"
    assert get_engine("vllm").readiness_url(8000) == "http://127.0.0.1:8000/health"


def test_sim_flags_are_sglang_style() -> None:
    argv = get_engine("sim", python="py").build_argv(
        "sim", 8000, {"tp-size": 2, "disable-cuda-graph": True, "fault": ["nan", "slow-release=3"]}
    )
    assert argv == [
        "py", "-m", "cleanslate.sim", "serve", "--model-path", "sim", "--port", "8000",
        "--enable-metrics", "--tp-size", "2", "--disable-cuda-graph", "--fault", "nan",
        "--fault", "slow-release=3",
    ]  # fmt: skip
    # the user's `enable-metrics: false` turns the sim's /metrics off; the sim has no DP
    # attention, so never the all-schedulers flag
    off = get_engine("sim", python="py").build_argv("sim", 8000, {"enable-metrics": False})
    assert off == ["py", "-m", "cleanslate.sim", "serve", "--model-path", "sim", "--port", "8000"]
    assert "--enable-metrics-for-all-schedulers" not in get_engine("sim").build_argv(
        "sim", 1, {"enable-dp-attention": True})


ALL = "--enable-metrics-for-all-schedulers"


@pytest.mark.parametrize(
    ("flags", "tail"),
    [
        ({}, ["--enable-metrics"]),
        ({"tp-size": 2}, ["--enable-metrics", "--tp-size", "2"]),
        # DP attention: every scheduler reports, not rank 0 alone
        ({"enable-dp-attention": True}, ["--enable-metrics", ALL, "--enable-dp-attention"]),
        ({"attn-dp-size": 4}, ["--enable-metrics", ALL, "--attn-dp-size", "4"]),
        ({"--attention-data-parallel-size": 2},
         ["--enable-metrics", ALL, "--attention-data-parallel-size", "2"]),
        ({"attn-dp-size": 1}, ["--enable-metrics", "--attn-dp-size", "1"]),
        ({"enable-dp-attention": False}, ["--enable-metrics"]),
        # the user's word wins: off, on among his flags, or the all-schedulers flag off
        ({"enable-metrics": False}, []),
        ({"enable_metrics": None}, []),
        ({"enable-metrics": False, "attn-dp-size": 2}, ["--attn-dp-size", "2"]),
        ({"enable-metrics": True}, ["--enable-metrics"]),
        ({"attn-dp-size": 2, ALL: False}, ["--enable-metrics", "--attn-dp-size", "2"]),
        ({"attn-dp-size": 2, "enable-metrics-for-all-schedulers": True},
         ["--enable-metrics", "--attn-dp-size", "2", ALL]),
    ],
)
def test_sglang_launches_with_metrics_unless_told_not_to(
    flags: dict[str, Any], tail: list[str]
) -> None:
    argv = get_engine("sglang", python="py").build_argv("M", 30000, flags)
    assert argv == ["py", "-m", "sglang.launch_server", "--model-path", "M", "--port", "30000",
                    *tail]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "flag"),
    [
        ("vllm", "port"),
        ("vllm", "model"),
        ("sglang", "model-path"),
        ("llamacpp", "m"),
        ("sim", "host"),
    ],
)
def test_flags_that_the_adapter_places_are_refused(engine: str, flag: str) -> None:
    with pytest.raises(InputError, match="set by cleanslate") as info:
        get_engine(engine).build_argv("M", 1, {flag: "x"})
    assert info.value.where == f"flags.{flag}"


def test_bad_port_model_and_readiness_path() -> None:
    with pytest.raises(InputError, match="out of range"):
        get_engine("vllm").build_argv("M", 70000)
    with pytest.raises(InputError, match="no model"):
        get_engine("vllm").build_argv("", 1)
    with pytest.raises(InputError, match="must start with"):
        get_engine("transformers", readiness_path="health")
    with pytest.raises(InputError, match="bad option"):
        get_engine("vllm", nonsense=1)


def test_command_engine_templates() -> None:
    adapter = get_engine(
        "command",
        argv=["my-server", "--listen", "0.0.0.0:{port}", "{model}"],
        readiness_path="/ping",
    )
    assert adapter.build_argv("/m", 8123, {"threads": 4}) == [
        "my-server", "--listen", "0.0.0.0:8123", "/m", "--threads", "4",
    ]  # fmt: skip
    assert adapter.readiness_path == "/ping"
    assert adapter.signature is None
    assert adapter.help_argv() is None
    with pytest.raises(InputError, match=r"no \{port\}"):
        get_engine("command", argv=["my-server", "{model}"])
    with pytest.raises(InputError, match="needs an argv"):
        get_engine("command")


def test_leftovers_name_what_vllm_leaves_behind() -> None:
    leftovers = get_engine("vllm").leftovers
    assert {"psm_*", "sem.mp-*"} <= set(leftovers.shm_globs)
    assert {"VLLM::EngineCore", "VLLM::Worker"} <= set(leftovers.process_names)
    assert "sglang::scheduler" in get_engine("sglang").leftovers.process_names


def test_capabilities_used_by_the_smoke_test() -> None:
    for name in ("vllm", "sglang", "transformers", "sim"):
        adapter = get_engine(name)
        assert adapter.supports_completions and adapter.supports_chat
    assert get_engine("command", argv=["x", "{port}"], supports_chat=False).supports_chat is False
