"""Deterministic token text of the simulated engine.

A token is one pseudo-word from a fixed vocabulary of :data:`VOCAB_SIZE` lower-case ASCII words
(so no JSON escaping is ever needed), written with a leading space: the text of ``n`` tokens has
exactly ``n`` whitespace-separated words, and a client can count tokens by splitting on spaces.
The words of a request depend only on the server's ``--seed``, the prompt text and the
request's own ``seed``. A prompt's length in tokens is its number of whitespace-separated words
(or the length of a token-id list); a chat prompt adds 3 tokens per message and 3 for the reply,
as OpenAI's counting does.
"""

from __future__ import annotations

import random
import zlib

VOCAB_SIZE = 4096
_MASK64 = (1 << 64) - 1
_LCG_A = 6364136223846793005
_LCG_C = 1442695040888963407

_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "")
_VOWELS = ("a", "e", "i", "o", "u")
NAN_TOKEN = "NaN"


def _build_vocab() -> tuple[str, ...]:
    rng = random.Random(20261130)
    seen: set[str] = set()
    words: list[str] = []
    while len(words) < VOCAB_SIZE:
        syllables = rng.choice((1, 2, 2, 3))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
        if len(word) >= 2 and word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


VOCAB: tuple[str, ...] = _build_vocab()
#: Each token's text (with its leading space) as UTF-8 bytes, ready to splice into JSON.
VOCAB_BYTES: tuple[bytes, ...] = tuple((" " + w).encode() for w in VOCAB)
NAN_BYTES = (" " + NAN_TOKEN).encode()
#: The one token a degenerate server writes (``degenerate-after``).
DEGENERATE_BYTES = b"!"


def text_seed(server_seed: int, prompt_key: str, request_seed: int | None) -> int:
    """The 64-bit state a request's token stream starts from."""
    h = zlib.crc32(prompt_key.encode("utf-8", "surrogatepass"))
    mixed = h * 0x9E3779B97F4A7C15 + server_seed * 0xBF58476D1CE4E5B9 + (request_seed or 0)
    return mixed & _MASK64


def next_state(state: int) -> int:
    return (state * _LCG_A + _LCG_C) & _MASK64


def token_of(state: int) -> int:
    return (state >> 40) % VOCAB_SIZE


def natural_length(state: int) -> int:
    """How many tokens the request would write before its end-of-sequence token: 16-256."""
    return 16 + ((state >> 20) % 241)


def count_words(text: str) -> int:
    return len(text.split())
