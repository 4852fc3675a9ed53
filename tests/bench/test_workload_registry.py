"""Workload kinds are open: a kind registered outside ``cleanslate.bench`` is parsed, validated
by every model that holds a workload (benchmark config and result, a study's ``workload:``),
serialized with its own fields and generated; a kind is registered once."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from cleanslate.bench import (
    WORKLOADS,
    BenchConfig,
    Prompt,
    RandomWorkload,
    generate,
    parse_workload,
    register_workload,
    workload_from_dict,
)
from cleanslate.bench._tokens import Tokenizer
from cleanslate.bench._workloads import Workload
from cleanslate.errors import InputError
from cleanslate.tune.study import load_study
from tests._kit import study_yaml


class RepeatWorkload(Workload):
    """A user's kind: the same word repeated ``words`` times."""

    kind: Literal["test-repeat"] = "test-repeat"
    words: int = Field(default=4, ge=1, le=1000)
    output_len: int = Field(default=8, ge=1)

    def max_input_tokens(self) -> int:
        return self.words

    def max_output_tokens(self) -> int:
        return self.output_len


@register_workload(RepeatWorkload)
def _repeat(spec: RepeatWorkload, n: int, rng: random.Random,
            tok: Tokenizer | None) -> list[Prompt]:
    return [Prompt(" ".join(["word"] * spec.words), spec.words, "approx", spec.output_len)
            for _ in range(n)]


def test_a_registered_kind_is_parsed_validated_and_generated() -> None:
    assert "test-repeat" in WORKLOADS
    spec = parse_workload("test-repeat:words=3")
    assert spec == RepeatWorkload(words=3)
    assert workload_from_dict({"kind": "test-repeat", "words": 5}) == RepeatWorkload(words=5)
    assert [p.input_tokens for p in generate(spec, 2, seed=0)] == [3, 3]
    with pytest.raises(InputError, match="words: Input should be greater than or equal to 1"):
        parse_workload("test-repeat:words=0")


def test_models_that_hold_a_workload_accept_the_kind_and_keep_its_fields() -> None:
    config = BenchConfig(url="http://127.0.0.1:1", model="m",
                         workload={"kind": "test-repeat", "words": 7})  # type: ignore[arg-type]
    assert config.workload == RepeatWorkload(words=7)
    again = BenchConfig.model_validate_json(config.model_dump_json())
    assert again.workload == RepeatWorkload(words=7)
    assert config.model_dump()["workload"] == {"kind": "test-repeat", "words": 7, "output_len": 8}
    assert BenchConfig(url="http://127.0.0.1:1", model="m").workload == RandomWorkload()


def test_a_study_accepts_the_kind(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(study_yaml(workload={"kind": "test-repeat", "words": 6}))
    spec, _ = load_study(path)
    assert spec.bench_config("http://127.0.0.1:1", ignore_eos=True).workload == \
        RepeatWorkload(words=6)


def test_a_kind_is_registered_once() -> None:
    with pytest.raises(ValueError, match=re.escape("workload 'random' is already registered")):
        register_workload(RandomWorkload)
    with pytest.raises(ValueError, match=re.escape("workload 'test-repeat' is already")):
        register_workload(RepeatWorkload)(_repeat)


def test_an_unknown_kind_names_the_registered_ones() -> None:
    with pytest.raises(InputError, match="'test-repeat'"):
        workload_from_dict({"kind": "nope"})
