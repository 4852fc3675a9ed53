"""Workloads: what the prompts look like. A small registry keyed by the name users write.

A workload is a frozen pydantic model, a subclass of :class:`Workload` with a ``kind`` field
(``random``, ``sharegpt``, ``shared-prefix`` here; ``trace`` in :mod:`cleanslate.bench._trace`,
``conversation`` in :mod:`cleanslate.bench._conversation`), plus a generator registered under
that kind that turns it into :class:`Prompt` objects. On the command line a workload is written
``KIND:key=value,...`` (``random:input_len=1024,output_len=256,range_ratio=0.1``); in YAML as a
mapping with ``kind``.

Adding a workload: a :class:`Workload` subclass whose ``kind`` is a ``Literal`` with a default,
and a generator decorated with ``@register_workload(ThatClass)``. Every model that holds a
:data:`WorkloadSpec` (``BenchConfig``, ``BenchResult``, a study's ``workload:``) then accepts
the new kind; registering a kind twice is an error.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BeforeValidator, Field, SerializeAsAny, ValidationError

from cleanslate.bench._limits import MAX_LEN, MAX_PREFIXES
from cleanslate.bench._tokens import Tokenizer, approx_count, random_text
from cleanslate.errors import InputError
from cleanslate.inputs import interruptible, read_input
from cleanslate.models import FrozenStrict


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's input: the text, its token count and where that count came from, and the
    number of output tokens to ask for.

    ``at_s``: when a replayed trace sends it, in seconds from the level's start (``None``: the
    load decides). ``blocks``: the trace's prefix blocks that start the text, ``(hash, tokens)``
    each (:mod:`cleanslate.bench._trace`). ``conversation`` and ``turn`` (from 1): the
    conversation this is the next user message of (:mod:`cleanslate.bench._conversation`);
    ``None`` for a request on its own. ``system``: the system message that conversation starts
    with (``None``: none)."""

    text: str
    input_tokens: int
    input_source: Literal["tokenizer", "approx"]
    output_len: int
    at_s: float | None = None
    blocks: tuple[tuple[int, int], ...] = ()
    conversation: int | None = None
    turn: int = 0
    system: str | None = None


class Workload(FrozenStrict):
    """The base of workload specs: frozen, unknown keys refused. A subclass narrows ``kind`` to
    its ``Literal`` name (with that default) and says how long its prompts can get."""

    kind: str

    def max_input_tokens(self) -> int:
        """The longest prompt this workload generates, in (approximate) tokens."""
        raise NotImplementedError

    def max_output_tokens(self) -> int:
        """The most output tokens one of its requests asks for."""
        raise NotImplementedError


class RandomWorkload(Workload):
    """Random prompts. Lengths are uniform in ``[len * (1 - range_ratio), len * (1 + range_ratio)]``
    (vLLM's convention); ``prefix_len`` tokens of one fixed random prefix start every prompt."""

    kind: Literal["random"] = "random"
    input_len: int = Field(default=1024, ge=1, le=MAX_LEN)
    output_len: int = Field(default=128, ge=1, le=MAX_LEN)
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    prefix_len: int = Field(default=0, ge=0, le=MAX_LEN)

    def max_input_tokens(self) -> int:
        """The longest prompt this workload generates, in (approximate) tokens."""
        return int(self.input_len * (1 + self.range_ratio)) + 1 + self.prefix_len

    def max_output_tokens(self) -> int:
        return int(self.output_len * (1 + self.range_ratio)) + 1


class ShareGPTWorkload(Workload):
    """First human turn of each conversation of a ShareGPT-format JSON file as the prompt; the
    reply's length as the output length unless ``output_len`` is set. Conversations whose prompt
    or reply is shorter than 4 tokens, or longer than the limits, are skipped."""

    kind: Literal["sharegpt"] = "sharegpt"
    path: str
    output_len: int | None = Field(default=None, ge=1, le=MAX_LEN)
    max_input_len: int = Field(default=1024, ge=1, le=MAX_LEN)
    max_output_len: int = Field(default=2048, ge=1, le=MAX_LEN)

    def max_input_tokens(self) -> int:
        return self.max_input_len

    def max_output_tokens(self) -> int:
        return self.output_len or self.max_output_len


class SharedPrefixWorkload(Workload):
    """``num_prefixes`` random system prefixes of ``prefix_len`` tokens, each request one prefix
    (round robin) plus a random suffix of ``suffix_len`` tokens: exercises prefix caching."""

    kind: Literal["shared-prefix"] = "shared-prefix"
    num_prefixes: int = Field(default=8, ge=1, le=MAX_PREFIXES)
    prefix_len: int = Field(default=1024, ge=1, le=MAX_LEN)
    suffix_len: int = Field(default=128, ge=1, le=MAX_LEN)
    output_len: int = Field(default=128, ge=1, le=MAX_LEN)

    def max_input_tokens(self) -> int:
        return self.prefix_len + self.suffix_len + 1

    def max_output_tokens(self) -> int:
        return self.output_len


Generator = Callable[[Any, int, random.Random, "Tokenizer | None"], list[Prompt]]
#: The prompt generator of each registered kind.
WORKLOADS: dict[str, Generator] = {}
#: The spec model of each registered kind, in registration order.
_MODELS: dict[str, type[Workload]] = {}
G = TypeVar("G", bound=Generator)


def register_workload(model: type[Workload]) -> Callable[[G], G]:
    """Decorator of the prompt generator of the workload ``model`` (a :class:`Workload`
    subclass whose ``kind`` has a default: the name users write). Raises :class:`ValueError`
    when the kind is already registered."""
    kind = model.model_fields["kind"].default
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{model.__qualname__}: `kind` needs a default, the workload's name")
    if kind in _MODELS:
        raise ValueError(f"workload {kind!r} is already registered by "
                         f"{_MODELS[kind].__module__}.{_MODELS[kind].__qualname__}")

    def deco(fn: G) -> G:
        if kind in _MODELS:
            raise ValueError(f"workload {kind!r} is already registered")
        _MODELS[kind] = model
        WORKLOADS[kind] = fn
        return fn

    return deco


def _kind_error(data: object) -> str | None:
    """Why ``data`` names no registered kind (pydantic's words for a tagged union), or None."""
    if not isinstance(data, Mapping):
        return "Input should be a valid dictionary or object to extract fields from"
    if "kind" not in data:
        return "Unable to extract tag using discriminator 'kind'"
    kind = data["kind"]
    if not isinstance(kind, str) or kind not in _MODELS:
        expected = ", ".join(f"'{k}'" for k in _MODELS)
        return (f"Input tag '{kind}' found using 'kind' does not match any of the expected "
                f"tags: {expected}")
    return None


def _as_workload(value: Any) -> Any:
    """The spec of the registered kind that ``value`` (a mapping) names; instances pass."""
    if isinstance(value, Workload):
        return value
    problem = _kind_error(value)
    if problem is not None:
        raise ValueError(problem)
    return _MODELS[value["kind"]].model_validate(value)


#: A workload spec of any registered kind: validated from a mapping by its ``kind``, serialized
#: with all of its kind's fields.
WorkloadSpec = Annotated[SerializeAsAny[Workload], BeforeValidator(_as_workload)]


def parse_workload(text: str, *, where: str = "--workload") -> Workload:
    """Parse ``KIND:key=value,...`` (or a bare ``KIND``) into a validated workload spec."""
    kind, _, rest = text.strip().partition(":")
    kind = kind.strip()
    if kind not in WORKLOADS:
        raise InputError(
            f"unknown workload {kind!r}",
            where=where,
            hint=f"one of: {', '.join(sorted(WORKLOADS))}; "
            "e.g. random:input_len=1024,output_len=128",
        )
    fields: dict[str, Any] = {"kind": kind}
    for key, value in key_values(rest, where=where):
        fields[key.replace("-", "_")] = value
    return workload_from_dict(fields, where=where)


def key_values(text: str, *, where: str, hint: str | None = None) -> list[tuple[str, str]]:
    """``key=value,key=value`` as stripped pairs (empty parts skipped); a part without ``=``
    is an :class:`InputError` at ``where``."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq:
            raise InputError(f"{part!r} is not key=value", where=where, hint=hint)
        out.append((key.strip(), value.strip()))
    return out


def workload_from_dict(data: dict[str, Any], *, where: str = "workload") -> Workload:
    """Validate a mapping (from YAML or JSON) into the spec of the kind it names; errors are
    InputErrors."""
    problem = _kind_error(data)
    if problem is not None:
        raise InputError(f"bad workload: kind: {problem}", where=where)
    try:
        return _MODELS[data["kind"]].model_validate(data)
    except ValidationError as exc:
        raise InputError.from_validation(exc, what="bad workload", where=where,
                                         limit=len(exc.errors())) from None


def generate(
    spec: Workload, n: int, *, seed: int, tokenizer: Tokenizer | None = None
) -> list[Prompt]:
    """``n`` prompts of the workload, deterministic for a given seed (and tokenizer).

    Synchronous work of up to seconds (files read, prompts built), usually inside an event
    loop: SIGINT and SIGTERM interrupt it (:func:`cleanslate.inputs.interruptible`)."""
    rng = random.Random(f"{seed}:{spec.kind}")
    with interruptible():
        return WORKLOADS[spec.kind](spec, n, rng, tokenizer)


def _vary(rng: random.Random, length: int, ratio: float) -> int:
    lo = max(1, int(length * (1 - ratio)))
    hi = max(lo, int(length * (1 + ratio)))
    return rng.randint(lo, hi)


@register_workload(RandomWorkload)
def _random(
    spec: RandomWorkload, n: int, rng: random.Random, tok: Tokenizer | None
) -> list[Prompt]:
    prefix, prefix_n = random_text(rng, spec.prefix_len, tok)
    source: Literal["tokenizer", "approx"] = "tokenizer" if tok else "approx"
    out: list[Prompt] = []
    for _ in range(n):
        text, count = random_text(rng, _vary(rng, spec.input_len, spec.range_ratio), tok)
        if prefix:
            text = prefix + " " + text
            count += prefix_n if tok is None else 0
            if tok is not None:
                count = tok.count(text)
        out.append(Prompt(text, count, source, _vary(rng, spec.output_len, spec.range_ratio)))
    return out


def read_dataset(path: Path) -> Any:
    """The JSON document of a dataset file; unreadable, not UTF-8 or not JSON is an
    :class:`InputError` naming the file (and the line where known)."""
    raw = read_input(path, kind="dataset")  # a regular file (never a FIFO), at most 1 GiB
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x})", where=f"{path}:{line}",
            hint="a ShareGPT-format JSON file in UTF-8") from None
    del raw
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not JSON: {exc.msg}", where=f"{path}:{exc.lineno}", hint="a ShareGPT-format list"
        ) from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit number, nesting 100000 deep
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise InputError(f"not a usable JSON document: {reason}", where=str(path),
                         hint="a ShareGPT-format list") from None


@register_workload(ShareGPTWorkload)
def _sharegpt(
    spec: ShareGPTWorkload, n: int, rng: random.Random, tok: Tokenizer | None
) -> list[Prompt]:
    data = read_dataset(Path(spec.path))
    path = Path(spec.path)
    if not isinstance(data, list):
        raise InputError("expected a JSON list of conversations", where=str(path))
    count = tok.count if tok is not None else approx_count
    source: Literal["tokenizer", "approx"] = "tokenizer" if tok else "approx"
    pairs: list[tuple[str, str]] = []
    for item in data:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        first, second = conv[0], conv[1]
        if not (isinstance(first, dict) and isinstance(second, dict)):
            continue
        prompt, reply = first.get("value"), second.get("value")
        if isinstance(prompt, str) and isinstance(reply, str):
            pairs.append((prompt, reply))
    if not pairs:
        raise InputError(
            "no conversation with two turns found",
            where=str(path),
            hint='ShareGPT format: [{"conversations": [{"from": "human", "value": ...}, '
            '{"from": "gpt", "value": ...}]}, ...]',
        )
    rng.shuffle(pairs)
    out: list[Prompt] = []
    for prompt, reply in pairs:
        p_len = count(prompt)
        o_len = spec.output_len or count(reply)
        if p_len < 4 or o_len < 4 or p_len > spec.max_input_len or o_len > spec.max_output_len:
            continue
        out.append(Prompt(prompt, p_len, source, o_len))
        if len(out) == n:
            break
    if not out:
        raise InputError(
            "every conversation was filtered out by the length limits", where=str(path)
        )
    base = list(out)
    while len(out) < n:  # fewer usable conversations than requests: reuse them in order
        out.append(base[len(out) % len(base)])
    return out


@register_workload(SharedPrefixWorkload)
def _shared_prefix(
    spec: SharedPrefixWorkload, n: int, rng: random.Random, tok: Tokenizer | None
) -> list[Prompt]:
    source: Literal["tokenizer", "approx"] = "tokenizer" if tok else "approx"
    prefixes = [random_text(rng, spec.prefix_len, tok) for _ in range(spec.num_prefixes)]
    out: list[Prompt] = []
    for i in range(n):
        prefix, prefix_n = prefixes[i % spec.num_prefixes]
        suffix, suffix_n = random_text(rng, spec.suffix_len, tok)
        text = prefix + "\n" + suffix
        count = tok.count(text) if tok is not None else prefix_n + suffix_n
        out.append(Prompt(text, count, source, spec.output_len))
    return out
