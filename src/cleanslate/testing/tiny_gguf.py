"""A tiny random-weight Llama as one GGUF file, for running llama.cpp's ``llama-server`` with no
download and no torch.

:func:`build_tiny_gguf` trains a byte-level BPE (vocabulary 1,024) with the ``tokenizers``
package on generated text (the same corpus as :mod:`cleanslate.testing.tiny_model`), draws
random float32 weights with NumPy, and writes them with ``gguf`` (llama.cpp's own gguf-py):
hidden 256, 2 layers, 4 heads and 2 KV heads (head_dim 64), feed-forward 512, context 2,048,
``tokenizer.ggml.pre = default`` and a chat template. About 7 MB, a fraction of a second.
Output is gibberish; loading, tokenization, the chat template, prefill, decode, sampling and
detokenization are all real.

``numpy``, ``tokenizers`` and ``gguf`` are imported inside the function: test extras, not
dependencies of cleanslate.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from cleanslate.testing.tiny_model import CHAT_TEMPLATE, generate_corpus

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")


def build_tiny_gguf(
    path: str | os.PathLike[str],
    *,
    hidden_size: int = 256,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    num_hidden_layers: int = 2,
    intermediate_size: int = 512,
    vocab_size: int = 1024,
    context_length: int = 2048,
    seed: int = 0,
) -> Path:
    """Write the model to ``path`` (a ``.gguf`` file; parent folders are created) and return it."""
    np: Any = importlib.import_module("numpy")
    tk: Any = importlib.import_module("tokenizers")
    gguf: Any = importlib.import_module("gguf")

    bpe = tk.Tokenizer(tk.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(generate_corpus(seed=seed), trainer=trainer)
    state = json.loads(bpe.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    n_vocab = len(tokens)

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    head_dim = hidden_size // num_attention_heads
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("cleanslate-tiny-llama")
    writer.add_context_length(context_length)
    writer.add_embedding_length(hidden_size)
    writer.add_block_count(num_hidden_layers)
    writer.add_feed_forward_length(intermediate_size)
    writer.add_head_count(num_attention_heads)
    writer.add_head_count_kv(num_key_value_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    special = {vocab[t] for t in SPECIAL_TOKENS}
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                            for i in range(n_vocab)])
    writer.add_token_merges(merges)
    writer.add_unk_token_id(vocab["<unk>"])
    writer.add_bos_token_id(vocab["<s>"])
    writer.add_eos_token_id(vocab["</s>"])
    writer.add_pad_token_id(vocab["<pad>"])
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int) -> Any:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    q_dim, kv_dim = num_attention_heads * head_dim, num_key_value_heads * head_dim
    writer.add_tensor("token_embd.weight", weight(n_vocab, hidden_size))
    for i in range(num_hidden_layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(hidden_size))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(q_dim, hidden_size))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_dim, hidden_size))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_dim, hidden_size))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(hidden_size, q_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(hidden_size))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(intermediate_size, hidden_size))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(intermediate_size, hidden_size))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(hidden_size, intermediate_size))
    writer.add_tensor("output_norm.weight", ones(hidden_size))
    writer.add_tensor("output.weight", weight(n_vocab, hidden_size))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


__all__ = ["build_tiny_gguf"]
