"""A tiny random-weight Llama with a real tokenizer, for running real engines with no download.

:func:`build_tiny_llama` writes a folder that ``transformers serve`` and vLLM load like any
Hugging Face checkpoint: ``config.json`` + ``model.safetensors`` + ``generation_config.json`` and a
``PreTrainedTokenizerFast`` (byte-level BPE trained with the ``tokenizers`` package on generated
text, with bos/eos/pad tokens and a chat template).

The defaults (hidden 256, 4 heads, 2 KV heads, head_dim 64, 2 layers, intermediate 512) are the
shape that vLLM's CPU attention supports: head_dim 16 crashed on the first request
(``tests/fixtures/vllm-cpu/crash_enginedead_first_request.log``). ``generation_config.eos_token_id``
is ``None`` so random weights do not stop generation early, and ``do_sample`` is on: greedy
decoding of random weights repeats one token forever, which the smoke test calls degenerate.
Its tokenizer alone: :func:`build_tiny_tokenizer` (a folder ``--tokenizer`` loads) and
:func:`tiny_bpe` (the BPE through the ``tokenizers`` package only, for fast tests).

``torch``, ``transformers`` and ``tokenizers`` are imported inside the function: they are test
extras, not dependencies of cleanslate.
"""

from __future__ import annotations

import importlib
import os
import random
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_VOCABULARY = (
    "the a an one two three four five six seven eight nine ten server engine model token "
    "batch memory graph kernel request prompt answer question cache block page queue "
    "worker process signal port host clean slate verify launch bench tune record fast slow "
    "small large red green blue river mountain city paris france capital ocean forest "
    "light dark morning night is are was were be has have had do does did can will would "
    "should may might must and or but if then so because while when where who what which "
    "how why of in on at by for with from to hello world today tomorrow yesterday number "
    "letter word sentence story poem song"
)
_WORDS = tuple(_VOCABULARY.split())


def generate_corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    """Deterministic pseudo-English sentences (plus digits and punctuation) to train a BPE on."""
    rng = random.Random(seed)
    corpus = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        sentence = " ".join(words)
        corpus.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ","]))
    return corpus


SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")


def tiny_bpe(vocab_size: int = 1024, seed: int = 0) -> Any:
    """The tiny model's byte-level BPE as a ``tokenizers.Tokenizer`` (the ``tokenizers``
    package alone: about 0.1 s, no transformers), trained on :func:`generate_corpus`."""
    tk: Any = importlib.import_module("tokenizers")
    decoders, models, pre_tokenizers = tk.decoders, tk.models, tk.pre_tokenizers
    processors, trainers = tk.processors, tk.trainers
    bpe = tk.Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(generate_corpus(seed=seed), trainer=trainer)
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    return bpe


def _tiny_tokenizer(vocab_size: int, model_max_length: int, seed: int) -> Any:
    """The byte-level BPE of :func:`tiny_bpe`, as a ``PreTrainedTokenizerFast``."""
    hf: Any = importlib.import_module("transformers")
    tokenizer = hf.PreTrainedTokenizerFast(
        tokenizer_object=tiny_bpe(vocab_size, seed),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_tokenizer(path: str | os.PathLike[str], *, vocab_size: int = 1024,
                         model_max_length: int = 2048, seed: int = 0) -> Path:
    """Write the tiny model's tokenizer alone at ``path`` (created if missing; transformers
    needed, not torch) and return it: a folder ``--tokenizer`` loads, whose
    ``model_max_length`` is ``model_max_length``."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _tiny_tokenizer(vocab_size, model_max_length, seed).save_pretrained(out)
    return out


def build_tiny_llama(
    path: str | os.PathLike[str],
    *,
    hidden_size: int = 256,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    num_hidden_layers: int = 2,
    intermediate_size: int = 512,
    head_dim: int = 64,
    vocab_size: int = 1024,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    dtype: str = "bfloat16",
) -> Path:
    """Build the model folder at ``path`` (created if missing) and return it.

    ``dtype`` is the dtype the weights are saved in: ``bfloat16`` matches how vLLM's CPU build
    serves it (``--dtype bfloat16``); ``transformers serve --dtype float32`` loads either.

    ``vocab_size`` is the BPE's target size; the model's embedding matches the tokenizer's real
    length. Weights are random (``seed``), so output is gibberish, but every step of serving is
    real: tokenization, the chat template, prefill, decode, sampling, detokenization.
    """
    # Imported as untyped modules: they are optional (test extras), so the type checker must
    # not depend on whether they are installed.
    torch: Any = importlib.import_module("torch")
    hf: Any = importlib.import_module("transformers")

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tiny_tokenizer(vocab_size, max_position_embeddings, seed)
    tokenizer.save_pretrained(out)

    config = hf.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = hf.LlamaForCausalLM(config).to(getattr(torch, dtype))
    # Random weights must neither stop early nor decode greedily: greedy decoding of random
    # weights falls into repetition at once (" by by by ..."), which a smoke test rightly flags.
    # Engines that take their defaults from generation_config (transformers serve) then sample.
    model.generation_config.eos_token_id = None
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_p = 1.0
    model.save_pretrained(out)
    return out
