"""Flag validation against real ``--help`` outputs and real help commands run on the host."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from cleanslate.engines import (
    check_flags,
    engine_help_options,
    get_engine,
    parse_help_options,
    validate_flags,
)
from cleanslate.errors import InputError
from cleanslate.hosts.local import LocalExecutor

DATA = Path(__file__).parent / "data"

# A literal argparse program, run for real: the styles engines built on argparse print.
ARGPARSE_PROGRAM = """
import argparse
p = argparse.ArgumentParser(prog="fake-engine")
p.add_argument("--model-path", "--model", required=False)
p.add_argument("--tp-size", "--tp", type=int, default=1)
p.add_argument("--mem-fraction-static", type=float)
p.add_argument("--disable-cuda-graph", action="store_true")
p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
p.add_argument("--a-very-long-option-name-that-wraps", metavar="A_VERY_LONG_METAVAR_VALUE")
p.add_argument("-c", "--ctx-size", type=int, help="context; see also --not-an-option")
p.add_argument("--level", type=int, default=-1, help="level (default: -1)")
p.parse_args()
"""


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_vllm_help_all_lists_every_option() -> None:
    options = parse_help_options(_text("help_vllm_api_server_all.txt"))
    assert len(options) > 400
    assert {
        "--model",
        "--port",
        "--max-model-len",
        "--dtype",
        "--enforce-eager",
        "--no-enforce-eager",
        "--tensor-parallel-size",
        "-tp",
        "--gpu-memory-utilization",
        "--help",
    } <= options
    assert not any(option.endswith(("-", ".")) for option in options)


def test_vllm_plain_help_lists_only_groups() -> None:
    # which is why the vllm adapter asks for --help=all
    assert parse_help_options(_text("help_vllm_api_server.txt")) == set()


def test_transformers_serve_click_help() -> None:
    options = parse_help_options(_text("help_transformers_serve.txt"))
    assert {
        "--continuous-batching",
        "--no-continuous-batching",
        "--cb-use-cuda-graph",
        "--no-cb-use-cuda-graph",
        "--cb-max-memory-percent",
        "--device",
        "--dtype",
        "--port",
        "--host",
        "-h",
        "--help",
        "-q",
    } <= options
    assert "--cb-" not in options  # "Configure with --cb-* flags" is prose


def test_typer_rich_box_help() -> None:
    options = parse_help_options(_text("help_typer_rich.txt"))
    assert {"--host", "--gpus", "--until-clean", "--tolerance-mib", "--help"} <= options


def test_unknown_flags_get_the_closest_valid_spellings() -> None:
    options = parse_help_options(_text("help_vllm_api_server_all.txt"))
    check_flags({"max-model-len": 512, "enforce-eager": True, "tp": None}, options, engine="vllm")
    with pytest.raises(InputError) as info:
        check_flags(
            {"max-model-length": 512, "gpu_memory_utilization": 0.9, "zzz-qqq": 1},
            options,
            engine="vllm",
            where="study.yaml:12",
        )
    message = str(info.value)
    assert "--max-model-length (did you mean --max-model-len" in message
    assert "--gpu_memory_utilization (did you mean --gpu-memory-utilization?)" in message
    assert "--zzz-qqq" in message and "unknown vllm flags" in message
    assert info.value.where == "study.yaml:12"


def test_literal_argparse_program_through_the_executor() -> None:
    adapter = get_engine(
        "command",
        argv=["x", "{port}"],
        help_argv=[sys.executable, "-c", ARGPARSE_PROGRAM, "--help"],
    )

    async def run() -> None:
        executor = LocalExecutor()
        result = await validate_flags(
            adapter, {"tp-size": 2, "disable-cuda-graph": True, "c": 4096}, executor
        )
        assert result.checked and result.note is None
        assert {
            "--model-path",
            "--model",
            "--tp-size",
            "--tp",
            "--enable-prefix-caching",
            "--no-enable-prefix-caching",
            "--a-very-long-option-name-that-wraps",
            "-c",
            "--ctx-size",
            "--level",
            "-h",
            "--help",
        } <= result.options
        assert "--not-an-option" not in result.options
        assert "-1" not in result.options
        with pytest.raises(InputError, match="did you mean --mem-fraction-static"):
            await validate_flags(adapter, {"mem-fraction-statik": 0.9}, executor)

    asyncio.run(run())


def test_missing_engine_skips_validation_with_a_note() -> None:
    async def run() -> None:
        executor = LocalExecutor()
        adapter = get_engine("trtllm", launch=["cleanslate-no-such-engine-binary"])
        result = await validate_flags(adapter, {"anything": 1}, executor)
        assert not result.checked
        assert result.note is not None and "not validated" in result.note
        failing = get_engine("vllm", launch=[sys.executable, "-c", "import sys; sys.exit(3)"])
        options, note = await engine_help_options(failing, executor)
        assert options is None and note is not None and "exited 3" in note
        no_help = get_engine("command", argv=["x", "{port}"])
        result = await validate_flags(no_help, {"anything": 1}, executor)
        assert not result.checked and "no help command" in (result.note or "")

    asyncio.run(run())


def test_sim_engine_help_through_the_executor() -> None:
    """The simulated engine's real typer help (``--model-path,--model`` with no space)."""

    async def run() -> None:
        adapter = get_engine("sim")
        result = await validate_flags(
            adapter, {"tp-size": 2, "disable-cuda-graph": True, "fault": ["nan"]}, LocalExecutor()
        )
        assert result.checked
        assert {"--tp-size", "--tp", "--model-path", "--model", "--fault"} <= result.options
        with pytest.raises(InputError, match="did you mean --max-running-requests"):
            await validate_flags(adapter, {"max-running-request": 8}, LocalExecutor())

    asyncio.run(run())
