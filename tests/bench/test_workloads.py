"""Workloads: the registry, spec parsing, lengths, ShareGPT files, token-exact prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cleanslate.bench import (
    WORKLOADS,
    RandomWorkload,
    SharedPrefixWorkload,
    generate,
    parse_workload,
    workload_from_dict,
)
from cleanslate.bench._tokens import HFTokenizer
from cleanslate.errors import InputError


def test_registry_and_parsing() -> None:
    assert {"random", "sharegpt", "shared-prefix"} <= set(WORKLOADS)
    spec = parse_workload("random:input_len=64,output_len=8,range_ratio=0.5")
    assert spec == RandomWorkload(input_len=64, output_len=8, range_ratio=0.5)
    assert parse_workload("shared-prefix:num_prefixes=2,prefix-len=16") == SharedPrefixWorkload(
        num_prefixes=2, prefix_len=16
    )
    assert workload_from_dict({"kind": "random", "input_len": 5}) == RandomWorkload(input_len=5)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nope:x=1", "unknown workload"),
        ("random:input_len", "not key=value"),
        ("random:input_len=abc", "input_len"),
        ("random:bogus=1", "bogus"),
        ("random:range_ratio=1.5", "range_ratio"),
    ],
)
def test_bad_specs_are_input_errors(text: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        parse_workload(text)


def test_random_lengths_and_determinism() -> None:
    spec = RandomWorkload(input_len=100, output_len=20, range_ratio=0.2)
    prompts = generate(spec, 200, seed=3)
    assert prompts == generate(spec, 200, seed=3)
    assert all(80 <= p.input_tokens <= 120 for p in prompts)
    assert all(16 <= p.output_len <= 24 for p in prompts)
    assert len({p.input_tokens for p in prompts}) > 10
    # approximation: one word per token
    assert all(len(p.text.split()) == p.input_tokens for p in prompts)
    assert all(p.input_source == "approx" for p in prompts)


def test_shared_prefix_shares_prefixes() -> None:
    spec = SharedPrefixWorkload(num_prefixes=2, prefix_len=30, suffix_len=5, output_len=4)
    prompts = generate(spec, 6, seed=0)
    heads = [p.text.split("\n")[0] for p in prompts]
    assert heads[0] == heads[2] == heads[4] and heads[1] == heads[3] and heads[0] != heads[1]
    assert all(p.input_tokens == 35 for p in prompts)


def test_sharegpt_file(tmp_path: Path) -> None:
    long_reply = "word " * 40
    data = [
        {
            "conversations": [
                {"from": "human", "value": "tell me about the sea " * 3},
                {"from": "gpt", "value": long_reply},
            ]
        },
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"id": "no conversations"},
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    prompts = generate(parse_workload(f"sharegpt:path={path}"), 3, seed=0)
    assert len(prompts) == 3  # one usable conversation, reused
    assert prompts[0].output_len == 50  # ceil(200 chars / 4)
    fixed = generate(parse_workload(f"sharegpt:path={path},output_len=7"), 1, seed=0)
    assert fixed[0].output_len == 7


def test_sharegpt_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  oops")
    with pytest.raises(InputError, match=r"bad\.json:2"):
        generate(parse_workload(f"sharegpt:path={bad}"), 1, seed=0)
    with pytest.raises(InputError, match="cannot read"):
        generate(parse_workload(f"sharegpt:path={tmp_path / 'missing.json'}"), 1, seed=0)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(InputError, match="no conversation"):
        generate(parse_workload(f"sharegpt:path={empty}"), 1, seed=0)


def make_tokenizer_dir(path: Path) -> Path:
    """A small byte-level BPE tokenizer trained here (no download), saved as a HF directory."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    text = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(200)]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return path


def test_token_exact_prompts_with_a_tokenizer(tmp_path: Path) -> None:
    tok = HFTokenizer(str(make_tokenizer_dir(tmp_path / "tok")))
    spec = RandomWorkload(input_len=64, output_len=8, range_ratio=0.25)
    prompts = generate(spec, 20, seed=1, tokenizer=tok)
    for p in prompts:
        assert p.input_source == "tokenizer"
        assert tok.count(p.text) == p.input_tokens
        assert 48 <= p.input_tokens <= 80


def test_missing_tokenizer_dir_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        HFTokenizer(str(tmp_path / "nope"))
