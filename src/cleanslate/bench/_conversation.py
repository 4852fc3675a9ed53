"""Multi-turn conversations: each user sends its next message after the previous answer.

A conversation is ``turns`` user messages. Each request carries the conversation's whole
history (every earlier user message and the server's actual answer to it) and then the new
message, so a server's prefix cache meets the reuse a chat service meets: the history of turn
``k`` is the prompt of turn ``k - 1`` plus its answer. On the chat endpoint the history is the
``messages`` list; on completions it is one text, each message on its own lines after
``User:`` or ``Assistant:`` (a history that only grows at its end, as a chat template's).

A level runs conversations instead of requests: a closed loop of concurrency ``c`` is ``c``
users, each starting its next conversation when the last one ends; an open loop starts
conversations at its rate (each then runs at its own pace). ``think_time_s`` passes between an
answer and the next message. Metrics are reported per turn as well as over the level
(:class:`TurnResult`): TTFT, input tokens and the prompt tokens the server served from its
cache, which grow turn by turn on a server with prefix caching.

User messages are random tokens of ``input_len`` (``path`` unset), or the human turns of a
ShareGPT-format file's conversations, in order (``path`` set; conversations with fewer human
turns than ``turns`` end sooner). ``system_len`` tokens of a system message start every
conversation of a measurement, the same tokens in each (a chat service's system prompt, the
prefix every conversation shares); each measurement (level, repeat) draws its own, so a level
never meets the last one's in the server's cache.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from cleanslate.bench._limits import MAX_CONCURRENCY, MAX_LEN
from cleanslate.bench._tokens import Tokenizer, approx_count, random_text
from cleanslate.bench._workloads import Prompt, Workload, read_dataset, register_workload
from cleanslate.errors import InputError
from cleanslate.models import FrozenStrict

#: The most turns of one conversation.
MAX_TURNS = 1000

#: The most tokens a conversation's history may reach by its last turn: the system message,
#: every user message and ``output_len`` for every answer before the last (the longest
#: prompt of any workload, ``MAX_LEN``; about 10 MB of client memory per user talking).
MAX_HISTORY_TOKENS = MAX_LEN

#: The roles of a history's messages, as the chat endpoint names them.
Role = Literal["system", "user", "assistant"]
History = list[tuple[Role, str]]

#: How a completions prompt writes each role.
_LABELS: dict[Role, str] = {"system": "System", "user": "User", "assistant": "Assistant"}


class ConversationWorkload(Workload):
    """Conversations of ``turns`` user messages (see the module docstring)."""

    kind: Literal["conversation"] = "conversation"
    turns: int = Field(default=4, ge=1, le=MAX_TURNS)
    input_len: int = Field(default=128, ge=1, le=MAX_LEN, description="tokens of each new "
                           "user message (random messages)")
    output_len: int = Field(default=128, ge=1, le=MAX_LEN)
    think_time_s: float = Field(default=0.0, ge=0, le=3600.0)
    system_len: int = Field(default=0, ge=0, le=MAX_LEN, description="tokens of the system "
                            "message every conversation starts with (0: none)")
    users: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY, description="users "
                              "talking at once: a closed loop of this concurrency")
    path: str | None = Field(default=None, description="a ShareGPT-format file: its human "
                             "turns as the user messages")

    @model_validator(mode="after")
    def _history_bounded(self) -> ConversationWorkload:
        if self.path is None and self.max_history_tokens() > MAX_HISTORY_TOKENS:
            raise ValueError(
                f"{self.turns} turns of {self.input_len:,} input and {self.output_len:,} "
                f"output tokens reach a history of {self.max_history_tokens():,} tokens: at "
                f"most {MAX_HISTORY_TOKENS:,}; use fewer turns or shorter messages")
        return self

    def max_history_tokens(self, messages: Sequence[int] | None = None) -> int:
        """Tokens of the last turn's prompt: the system message, the user messages (each
        ``input_len``, or the tokens of ``messages``) and an answer of ``output_len`` to each
        but the last."""
        users = sum(messages) if messages is not None else self.turns * self.input_len
        turns = len(messages) if messages is not None else self.turns
        return self.system_len + users + max(0, turns - 1) * self.output_len

    def max_input_tokens(self) -> int:
        """The longest user message a prompt holds (a request's history is built while the
        level runs, from the messages and the answers)."""
        longest = self.input_len + 1 if self.path is None else MAX_LEN
        return max(longest, self.system_len + 1)

    def max_output_tokens(self) -> int:
        return self.output_len


class TurnResult(FrozenStrict):
    """The requests of one turn index over a level's conversations."""

    turn: int
    requests: int
    failed: int
    mean_input_tokens: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    median_e2el_ms: float | None
    cached_prompt_tokens: int | None = Field(description="summed over the requests whose "
                                             "usage reports it; None when none does")
    cached_share: float | None = Field(description="cached prompt tokens over the input "
                                       "tokens of the requests that report them")


def _dataset_messages(path: str, tok: Tokenizer | None) -> list[list[str]]:
    """The human messages of each conversation of a ShareGPT-format file, in order."""
    data = read_dataset(Path(path))
    if not isinstance(data, list):
        raise InputError("expected a JSON list of conversations", where=path)
    out: list[list[str]] = []
    for item in data:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list):
            continue
        human = [t.get("value") for t in conv if isinstance(t, dict)
                 and t.get("from") in ("human", "user") and isinstance(t.get("value"), str)]
        messages = [m for m in human if isinstance(m, str) and m.strip()]
        if messages:
            out.append(messages)
    if not out:
        raise InputError("no conversation with a human turn found", where=path,
                         hint='ShareGPT format: [{"conversations": [{"from": "human", '
                         '"value": ...}, {"from": "gpt", "value": ...}, ...]}, ...]')
    return out


@register_workload(ConversationWorkload)
def _conversations(spec: ConversationWorkload, n: int, rng: random.Random,
                   tok: Tokenizer | None) -> list[Prompt]:
    """``n`` user messages: conversation 0's turns 1..turns, then conversation 1's, ..."""
    source: Literal["tokenizer", "approx"] = "tokenizer" if tok else "approx"
    system = random_text(rng, spec.system_len, tok)[0] if spec.system_len else None
    out: list[Prompt] = []
    if spec.path is None:
        conv = 0
        while len(out) < n:
            for turn in range(1, spec.turns + 1):
                text, count = random_text(rng, spec.input_len, tok)
                out.append(Prompt(text, count, source, spec.output_len, conversation=conv,
                                  turn=turn, system=system))
            conv += 1
        return out
    dialogs = _dataset_messages(spec.path, tok)
    count_of = tok.count if tok is not None else approx_count
    for number, dialog in enumerate(dialogs, 1):  # approximate counts: a bound on memory
        history = spec.max_history_tokens([approx_count(m) for m in dialog[:spec.turns]])
        if history > MAX_HISTORY_TOKENS:
            raise InputError(f"conversation {number:,} reaches a history of {history:,} "
                             f"tokens by turn {min(spec.turns, len(dialog))}: at most "
                             f"{MAX_HISTORY_TOKENS:,}", where=spec.path,
                             hint="use fewer turns (turns=), or a shorter output_len")
    rng.shuffle(dialogs)
    conv = 0
    while len(out) < n:
        for turn, text in enumerate(dialogs[conv % len(dialogs)][:spec.turns], 1):
            out.append(Prompt(text, count_of(text), source, spec.output_len,
                              conversation=conv, turn=turn, system=system))
        conv += 1
    return out


def conversations(prompts: Sequence[Prompt]) -> list[list[int]]:
    """The indices of each conversation's prompts, turn by turn, in order of first turn."""
    order: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        order.setdefault(p.conversation if p.conversation is not None else -1 - i, []).append(i)
    return list(order.values())


def history_text(history: History) -> str:
    """A history as one completions prompt: each message after its role's label."""
    return "\n\n".join(f"{_LABELS[role]}: {text}" for role, text in history) + \
        "\n\nAssistant:"


def history_tokens(history: History, tok: Tokenizer | None) -> int:
    """The history's tokens as this client counts them (the server's usage, when sent,
    replaces the count in the record)."""
    count = tok.count if tok is not None else approx_count
    return sum(count(text) for _role, text in history)


def turn_results(turns: Sequence[tuple[int, bool, int, float | None, float | None,
                                       int | None]]) -> tuple[TurnResult, ...]:
    """Per-turn figures from ``(turn, ok, input_tokens, ttft_ms, e2el_ms, cached_tokens)``
    of each request of a level."""
    import numpy as np

    by_turn: dict[int, list[tuple[bool, int, float | None, float | None, int | None]]] = {}
    for turn, ok, n_in, ttft, e2e, cached in turns:
        by_turn.setdefault(turn, []).append((ok, n_in, ttft, e2e, cached))
    out = []
    for turn in sorted(by_turn):
        rows = by_turn[turn]
        good = [r for r in rows if r[0]]
        ttfts = [r[2] for r in good if r[2] is not None]
        e2es = [r[3] for r in good if r[3] is not None]
        reported = [(r[1], r[4]) for r in good if r[4] is not None]
        cached = sum(c for _n, c in reported if c is not None) if reported else None
        cached_in = sum(n for n, _c in reported)
        out.append(TurnResult(
            turn=turn, requests=len(good), failed=len(rows) - len(good),
            mean_input_tokens=sum(r[1] for r in good) / len(good) if good else None,
            median_ttft_ms=float(np.median(ttfts)) if ttfts else None,
            p99_ttft_ms=float(np.percentile(ttfts, 99)) if ttfts else None,
            median_e2el_ms=float(np.median(e2es)) if e2es else None,
            cached_prompt_tokens=cached,
            cached_share=(cached / cached_in if cached is not None and cached_in else None)))
    return tuple(out)


__all__ = ["MAX_HISTORY_TOKENS", "MAX_TURNS", "ConversationWorkload", "History", "TurnResult",
           "conversations", "history_text", "history_tokens", "turn_results"]
