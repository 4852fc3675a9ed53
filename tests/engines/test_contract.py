"""The engine adapter contract (:mod:`cleanslate.testing.engine_contract`) on every registered
engine, and the registry's own rules: one class per name, lookups that never special-case an
engine."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cleanslate.engines import (
    RUNTIME_SHM_GLOBS,
    EngineAdapter,
    ProcessSignature,
    engine_class,
    engine_names,
    find_signature,
    match_engine,
    register_engine,
    require_signature,
    shm_patterns,
    signatures,
)
from cleanslate.errors import InputError
from cleanslate.testing import engine_contract

#: Constructor options an engine cannot be built without (``command`` needs its template).
OPTIONS: dict[str, dict[str, Any]] = {
    "command": {"argv": ["my-server", "--listen", "127.0.0.1:{port}", "--weights", "{model}"]},
}


@pytest.mark.parametrize("name", engine_names())
def test_every_registered_engine_keeps_the_contract(name: str, tmp_path: Path) -> None:
    engine_contract.check_engine(engine_class(name), tmp_path, **OPTIONS.get(name, {}))


def test_the_builtin_engines_are_registered() -> None:
    assert set(engine_names()) >= {"sglang", "vllm", "trtllm", "transformers", "llamacpp",
                                   "command", "sim"}


def test_a_second_class_under_a_taken_name_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("'vllm' is already registered by cleanslate")):
        @register_engine
        class Impostor(EngineAdapter):
            name = "vllm"
    assert engine_class("vllm").__module__ == "cleanslate.engines.vllm"
    register_engine(engine_class("vllm"))  # the same class again is no conflict


def test_a_signature_for_another_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="signature is for engine 'vllm'"):
        @register_engine
        class Mislabelled(EngineAdapter):
            name = "contract-mislabelled"
            signature: ClassVar[ProcessSignature | None] = engine_class("vllm").signature
    assert "contract-mislabelled" not in engine_names()


def test_lookups_come_from_the_adapters() -> None:
    by_engine = {s.engine: s for s in signatures()}
    for name in engine_names():
        assert by_engine.get(name) is engine_class(name).signature
        assert find_signature(name) is engine_class(name).signature
    assert find_signature("command") is None and find_signature("no-such") is None
    assert require_signature("vllm") is engine_class("vllm").signature
    patterns = shm_patterns()
    assert patterns[:len(RUNTIME_SHM_GLOBS)] == RUNTIME_SHM_GLOBS
    assert len(set(patterns)) == len(patterns)
    for name in engine_names():
        assert set(engine_class(name).leftovers.shm_globs) <= set(patterns)


def test_an_engine_without_a_signature_matches_nothing_and_check_says_why() -> None:
    argv = [sys.executable, "-m", "cleanslate.sim", "serve", "--port", "1"]
    assert match_engine("python3", argv) == "sim"
    assert match_engine("python3", argv, ["command"]) is None
    assert match_engine("python3", argv, ["command", "sim"]) == "sim"
    with pytest.raises(InputError, match="has no process signature") as info:
        require_signature("command")
    assert info.value.where == "--engine" and "sim" in (info.value.hint or "")
    with pytest.raises(InputError, match="unknown engine 'nope'"):
        require_signature("nope")
    with pytest.raises(InputError, match="unknown engine 'nope'"):
        match_engine("x", ["x"], ["nope"])


def test_the_collector_reports_the_same_patterns_as_before_the_registry() -> None:
    """The hand-kept list the collector had before the adapters carried their globs."""
    assert set(shm_patterns()) == {
        "nccl-*", "psm_*", "sem.mp-*", "torch_*", "sglang*", "vllm*", "trtllm*",
        "cleanslate-sim-*", "cuda.shm.*", "vader*",
        # issue 23: names found in the engines' source
        "sgl_shm_*", "multi_tokenizer_args_*", "VLLM_OBJECT_STORAGE_SHM_BUFFER*", "*-cpushm_*",
    }


class _Broken(EngineAdapter):
    """Not registered: an adapter that breaks clauses of the contract, one per check."""

    name = "contract-broken"
    description = "breaks the contract"
    signature = ProcessSignature.compile("contract-broken", r"^nothing$", r"^nothing$")

    def default_launch(self) -> tuple[str, ...]:
        return ("broken-server",)

    def build_argv(self, model: str, port: int | None = None, flags: Any = None, *,
                   host: str | None = None) -> list[str]:
        return ["broken-server", *(f"--{k}" for k in flags or {}), "--port", str(port), model]

    def help_argv(self) -> list[str] | None:
        return []


@pytest.mark.parametrize(("check", "needle"), [
    (engine_contract.check_registered, "registered"),
    (engine_contract.check_argv, "flags not last"),
    (engine_contract.check_reserved_flags, "was accepted"),
    (engine_contract.check_signature, "does not match its own argv"),
    (engine_contract.check_help, "help_argv() returned []"),
])
def test_the_contract_catches_a_broken_adapter(check: Any, needle: str) -> None:
    target = _Broken if check is engine_contract.check_registered else _Broken()
    with pytest.raises(AssertionError) as info:
        check(target)
    assert needle in str(info.value)
