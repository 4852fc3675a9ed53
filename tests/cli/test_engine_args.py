"""Engine flags after ``--`` on the command line, as the engine spells them: long options,
short ones (``-c``, llama.cpp's ``-np``) and negative numbers as values; a flag given both in
the server file and after ``--`` is the command line's alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanslate.cli.serve import _config, parse_engine_args
from cleanslate.engines import get_engine
from cleanslate.errors import InputError


def test_long_and_short_options_keep_their_spelling() -> None:
    flags = parse_engine_args(["--threads", "2", "-c", "8192", "-np", "4", "--flash-attn",
                               "--x", "a", "b", "--ctx=512"])
    assert flags == {"threads": "2", "-c": "8192", "-np": "4", "flash-attn": True,
                     "x": ["a", "b"], "ctx": "512"}


def test_a_short_option_is_not_folded_into_the_previous_flag() -> None:
    # The bug this guards: `--threads 2 -c 8192` became `--threads 2 -c 8192` as one list.
    assert parse_engine_args(["--threads", "2", "-c", "8192"])["threads"] == "2"


@pytest.mark.parametrize("value", ["-1", "-0.5", "-.5"])
def test_negative_numbers_are_values(value: str) -> None:
    assert parse_engine_args(["--temp", value]) == {"temp": value}


@pytest.mark.parametrize("args", [["8192"], ["-", "x"], ["--", "x"]])
def test_a_value_with_no_flag_before_it_is_refused(args: list[str]) -> None:
    with pytest.raises(InputError, match="unexpected engine argument"):
        parse_engine_args(args)


def test_short_options_reach_llama_server_as_written(tmp_path: Path) -> None:
    config = _config(None, "llamacpp", "m.gguf", None, 8080, None, None, True,
                     ["-c", "8192", "-np", "4", "--threads", "2"])
    argv = get_engine("llamacpp").build_argv(config.model, 8080, flags=config.flags)
    tail = argv[argv.index("-c"):]
    assert tail == ["-c", "8192", "-np", "4", "--threads", "2"]


def test_the_command_line_overrides_the_file_however_each_spells_the_flag(
        tmp_path: Path) -> None:
    server = tmp_path / "server.yaml"
    server.write_text("engine: llamacpp\nmodel: m.gguf\nport: 8080\n"
                      "flags: {c: 4096, np: 2, threads: 2}\n")
    config = _config(server, None, None, None, None, None, None, True, ["-c", "8192", "--np", "8"])
    argv = get_engine("llamacpp").build_argv(config.model, 8080, flags=config.flags)
    assert argv.count("-c") == 1 and argv[argv.index("-c") + 1] == "8192"
    assert argv.count("-np") == 1 and argv[argv.index("-np") + 1] == "8"
    assert argv[argv.index("--threads") + 1] == "2"
