"""Engine flags as the engine spells them: short options, prefixes, renamed flags, real help.

Checked against the real help texts of SGLang 0.5.23 and llama.cpp's ``llama-server``
(``data/help_sglang_0.5.23.txt``, ``data/help_llama_server.txt``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanslate.engines import check_flags, get_engine, match_engine, parse_help_options
from cleanslate.errors import InputError

DATA = Path(__file__).parent / "data"
SGLANG_HELP = parse_help_options((DATA / "help_sglang_0.5.23.txt").read_text())
LLAMA_HELP = parse_help_options((DATA / "help_llama_server.txt").read_text())


def test_every_sglang_option_spelling_is_parsed() -> None:
    # SGLang 0.5.23's parser defines 561 spellings; 2 (--forward-pass-metrics-*) are hidden
    # from --help, so 559 can be read there.
    assert len(SGLANG_HELP) == 559
    for name in ("--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size",
                 "--tp-size", "--tensor-parallel-size", "--ep-size", "--expert-parallel-size",
                 "--ep", "--moe-runner-backend", "--attention-backend", "--kv-cache-dtype",
                 "--enable-torch-compile", "--trust-remote-code", "--model-path", "--model",
                 "--dsa-decode-backend", "--dsa-prefill-backend", "--cuda-graph-max-bs-decode",
                 "--cuda-graph-max-bs-prefill", "--disable-cuda-graph", "--enable-dp-attention"):
        assert name in SGLANG_HELP, name
    assert not any(name.startswith("--forward-pass-metrics") for name in SGLANG_HELP)


def sglang_check(flags: dict[str, object]) -> list[str]:
    adapter = get_engine("sglang")
    return check_flags(flags, SGLANG_HELP, engine="sglang", adapter=adapter)


def test_the_seeds_tuning_flags_are_valid_in_0_5_23() -> None:
    assert sglang_check({"mem-fraction-static": 0.92, "max-running-requests": 256,
                         "chunked-prefill-size": 4096, "tp-size": 8, "ep-size": 8,
                         "moe-runner-backend": "flashinfer_trtllm",
                         "attention-backend": "fa3", "kv-cache-dtype": "fp8_e4m3",
                         "dsa-decode-backend": "flashmla_kv",
                         "cuda-graph-max-bs-decode": 256}) == []


@pytest.mark.parametrize("flag, text", [
    ("nsa-decode-backend", "--nsa-decode-backend was removed in sglang 0.5.20: use "
                           "--dsa-decode-backend"),
    ("nsa-prefill-backend", "--nsa-prefill-backend was removed in sglang 0.5.20: use "
                            "--dsa-prefill-backend"),
    ("cuda-graph-max-bs", "--cuda-graph-max-bs was removed in sglang 0.5.20: use "
                          "--cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill"),
])
def test_removed_flags_get_version_aware_messages(flag: str, text: str) -> None:
    with pytest.raises(InputError) as caught:
        sglang_check({flag: "x"})
    assert text in caught.value.message
    assert "python -m sglang.launch_server --help" in (caught.value.hint or "")


def test_deprecated_flags_are_accepted_with_a_warning() -> None:
    warnings = sglang_check({"disable-cuda-graph": True, "enable-dp-attention": True})
    assert any("--disable-cuda-graph was deprecated in sglang 0.5.20: use "
               "--cuda-graph-backend-decode disabled" in w for w in warnings)
    assert any("--enable-dp-attention was deprecated" in w and "--attn-dp-size" in w
               for w in warnings)


def test_unique_prefixes_are_accepted_as_sglang_does_and_ambiguous_ones_refused() -> None:
    warnings = sglang_check({"tp": 2, "mem-frac": 0.9})
    assert any("--tp is taken by sglang as --tp-size" in w for w in warnings)
    assert any("--mem-frac is taken by sglang as --mem-fraction-static" in w for w in warnings)
    with pytest.raises(InputError) as caught:
        sglang_check({"cuda-graph-max-b": 16})
    assert "ambiguous" in caught.value.message
    assert "--cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill" in caught.value.message


def test_a_misspelling_gets_the_closest_spelling() -> None:
    with pytest.raises(InputError) as caught:
        sglang_check({"mem-fraction-statc": 0.9})
    assert "did you mean --mem-fraction-static" in caught.value.message


def test_vllm_takes_no_prefixes() -> None:
    adapter = get_engine("vllm")
    with pytest.raises(InputError):
        check_flags({"max-model": 512}, {"--max-model-len", "--port"}, engine="vllm",
                    adapter=adapter)


# -- llama.cpp: short options -----------------------------------------------------------------

def test_llama_short_options_are_spelled_with_one_dash() -> None:
    adapter = get_engine("llamacpp")
    argv = adapter.build_argv("/m/tiny.gguf", 8081, {"c": 8192, "np": 4, "ngl": 99, "fa": "on",
                                                     "threads": 2, "ctx-size": 4096})
    assert argv[:5] == ["llama-server", "-m", "/m/tiny.gguf", "--port", "8081"]
    assert argv[5:] == ["-c", "8192", "-np", "4", "-ngl", "99", "-fa", "on", "--threads", "2",
                        "--ctx-size", "4096"]
    assert check_flags({"c": 8192, "np": 4, "ngl": 99, "fa": "on", "threads": 2},
                       LLAMA_HELP, engine="llamacpp", adapter=adapter) == []


def test_every_llama_short_option_in_its_help_is_known_to_the_adapter() -> None:
    adapter = get_engine("llamacpp")
    short = {o[1:] for o in LLAMA_HELP if o.startswith("-") and not o.startswith("--")
             and len(o) > 2}
    assert short == set(adapter.short_options)
    assert len(LLAMA_HELP) == 413


def test_a_long_spelling_of_a_short_option_says_how_to_write_it() -> None:
    # An engine that does not list the short option (an older adapter, a custom build): the
    # validator still says what to write.
    with pytest.raises(InputError) as caught:
        check_flags({"np": 4}, LLAMA_HELP, engine="llamacpp")
    assert "did you mean -np?" in caught.value.message
    assert "llamacpp --help" in (caught.value.hint or "")


def test_the_hint_names_the_real_help_command() -> None:
    adapter = get_engine("llamacpp")
    with pytest.raises(InputError) as caught:
        check_flags({"no-such-flag": 1}, LLAMA_HELP, engine="llamacpp", adapter=adapter)
    assert "`llama-server --help`" in (caught.value.hint or "")


# -- signatures -------------------------------------------------------------------------------

@pytest.mark.parametrize("comm, cmdline", [
    ("sglang::schedul", ["sglang::scheduler"]),
    ("sglang::schedul", ["sglang::scheduler_DP0_TP1_EP1"]),
    ("sglang::detoken", ["sglang::detokenizer"]),
    ("sglang::detoken", ["sglang::detokenizer_router"]),
    ("sglang::data_pa", ["sglang::data_parallel_controller"]),
    ("sglang::tokeniz", ["sglang::tokenizer_worker:4242"]),
    ("sgl_diffusion::", ["sgl_diffusion::scheduler_TP0"]),
    ("python3", ["python3", "-m", "sglang.launch_server", "--model-path", "m"]),
])
def test_every_sglang_title_is_recognised(comm: str, cmdline: list[str]) -> None:
    assert match_engine(comm, cmdline) == "sglang"


@pytest.mark.parametrize("comm, cmdline", [
    ("llama-server", ["/opt/llama/bin/llama-server", "-m", "x.gguf"]),
    ("llama-server-cu", ["llama-server-cuda", "-m", "x.gguf"]),
    ("llama-cpp-serve", ["/venv/bin/python", "/venv/bin/llama-cpp-server", "--port", "1"]),
    ("python3", ["python3", "-m", "llama_cpp.server", "--model", "x.gguf"]),
    ("my-llm", ["/opt/my-llm", "-m", "/models/q4.gguf", "--port", "9000"]),
    ("my-llm", ["/opt/my-llm", "--model=/models/q4.gguf"]),
])
def test_llama_cpp_servers_are_recognised(comm: str, cmdline: list[str]) -> None:
    assert match_engine(comm, cmdline) == "llamacpp"


@pytest.mark.parametrize("comm, cmdline", [
    ("vim", ["vim", "notes-about-llama-server.txt"]),
    ("ls", ["ls", "/models/q4.gguf"]),
    ("python3", ["python3", "convert.py", "--outfile", "x.gguf"]),
])
def test_bystanders_are_not_llama_cpp(comm: str, cmdline: list[str]) -> None:
    assert match_engine(comm, cmdline) is None
