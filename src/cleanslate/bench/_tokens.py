"""Token counting: a local Hugging Face tokenizer when given, a documented approximation otherwise.

Without a tokenizer (see ``docs/bench.md``):

* a generated prompt is a sequence of common English words, each written with a leading space;
  BPE tokenizers of the GPT-2 / Llama / Qwen families encode each of them as one token, so a
  prompt of ``n`` words counts as ``n`` tokens (typically within a few percent of the truth);
* text from a dataset counts as ``ceil(characters / 4)`` tokens, the usual English rule of thumb;
* output tokens come from the server's ``usage.completion_tokens`` whenever the server sends
  usage; otherwise one token per content event of the stream.

``transformers`` (or only ``tokenizers``) is imported lazily, only when a tokenizer directory is
given; it is an optional dependency.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Protocol

from cleanslate.errors import InputError
from cleanslate.inputs import check_input_dir

#: Common English words that BPE tokenizers of the usual families encode as one token each
#: when preceded by a space.
_WORDS_TEXT = """the of and to in is was for on that with as by it at from his he an be this are
    which or had not but have were one they their all has been who more time also first new would
    there two when its after used only other can her may into some most so any over she them
    than up out about many these then between no such made where each him while years both
    through during could under well being before same year part three did later world well
    city people state small school system however during since group number known water
    life end day work house found long good way little own great old right high still set
    power back now last even place down name name off line same game side light field team
    form local book land case must best early north south east west power body open next
    river music army play film form back large second war family church left line order"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORDS_TEXT.split()))


class Tokenizer(Protocol):
    """The part of a tokenizer this package uses."""

    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    @property
    def vocab_ids(self) -> list[int]: ...


class HFTokenizer:
    """A tokenizer from a local directory (``tokenizer.json`` and friends), never the hub."""

    def __init__(self, path: str) -> None:
        p = Path(path)
        if not p.is_dir():
            raise InputError(
                f"tokenizer directory {path!r} does not exist",
                where="--tokenizer",
                hint="give a local directory holding tokenizer.json (no downloads are made)",
            )
        # transformers opens the folder's files itself: no FIFO or device may be among them.
        check_input_dir(p, where="--tokenizer")
        try:
            from transformers import AutoTokenizer

            self._tok: Any = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            special = set(self._tok.all_special_ids)
            size = len(self._tok)
        except ImportError:
            try:
                from tokenizers import Tokenizer as RawTokenizer
            except ImportError:
                raise InputError(
                    "--tokenizer needs the 'transformers' or 'tokenizers' package",
                    where="--tokenizer",
                    hint="pip install tokenizers, or run without --tokenizer (approximate counts)",
                ) from None
            file = p / "tokenizer.json"
            if not file.is_file():
                raise InputError(f"{file} not found", where="--tokenizer") from None
            self._tok = _RawAdapter(RawTokenizer.from_file(str(file)))
            special = set()
            size = self._tok.vocab_size
        except (OSError, ValueError) as exc:
            raise InputError(
                f"cannot load a tokenizer from {path!r}: {exc}", where="--tokenizer"
            ) from None
        self._vocab = [i for i in range(size) if i not in special]
        self.path = str(p)

    def encode(self, text: str) -> list[int]:
        # verbose=False: a trace's prompt longer than model_max_length is counted to be cut,
        # not a mistake for transformers to warn about on the terminal
        return list(self._tok.encode(text, add_special_tokens=False, verbose=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    @property
    def vocab_ids(self) -> list[int]:
        return self._vocab

    @property
    def model_max_length(self) -> int | None:
        """The tokenizer's ``model_max_length`` (its ``tokenizer_config.json``; transformers
        answers 10**30 when none is set); ``None`` without transformers."""
        value = getattr(self._tok, "model_max_length", None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class _RawAdapter:
    """``tokenizers.Tokenizer`` behind the small surface of a ``transformers`` tokenizer."""

    def __init__(self, tok: object) -> None:
        self._tok = tok

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())  # type: ignore[attr-defined]

    def encode(self, text: str, add_special_tokens: bool = False, verbose: bool = True
               ) -> list[int]:
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)  # type: ignore[attr-defined]
        return list(enc.ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))  # type: ignore[attr-defined]


def approx_count(text: str) -> int:
    """Approximate tokens of free text: ``ceil(len(text) / 4)``, at least 1 for non-empty text."""
    return max(1, math.ceil(len(text) / 4)) if text else 0


def random_text(rng: random.Random, n_tokens: int, tokenizer: Tokenizer | None) -> tuple[str, int]:
    """A random prompt of ``n_tokens`` tokens and its token count.

    With a tokenizer the count is exact for that tokenizer (random vocabulary ids, decoded and
    re-encoded until the round trip is stable at the target length; the few tokenizers where it
    is not stable give the nearest length, which is what is returned). Without one, words of
    :data:`WORDS` (one token each by the approximation above).
    """
    if n_tokens <= 0:
        return "", 0
    if tokenizer is None:
        return "".join(" " + w for w in rng.choices(WORDS, k=n_tokens)).lstrip(), n_tokens
    vocab = tokenizer.vocab_ids
    ids = rng.choices(vocab, k=n_tokens)
    text = tokenizer.decode(ids)
    for _ in range(8):
        ids = tokenizer.encode(text)
        if len(ids) == n_tokens:
            return text, n_tokens
        if len(ids) > n_tokens:
            ids = ids[:n_tokens]
        else:
            ids = ids + rng.choices(vocab, k=n_tokens - len(ids))
        text = tokenizer.decode(ids)
    return text, tokenizer.count(text)
