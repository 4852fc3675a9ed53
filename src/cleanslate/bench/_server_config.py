"""The configuration an engine actually runs with, read from the engine itself, beside the flags
it was asked for (``docs/engines.md``, "Configuration in effect").

A one-flag A/B that silently changes a second setting, or a limit the engine chose itself
(SGLang's ``max_running_requests`` auto-detected as 2048 while the client sends 512), is a known
trap; :class:`ServerConfig` keeps what was asked (``requested``), what the engine says is in
effect (``in_effect``, each value with its ``sources`` entry) and the ``differences``:

- ``differs``: a flag asked for whose value in effect is another;
- ``not_reported``: a flag asked for that the engine's answers do not show (nothing to compare);
- ``engine_chose``: a limit not asked for, whose value the engine chose itself.

Where each flavour reads (:func:`read_server_config`):

- ``sglang`` (SGLang, and cleanslate's sim, which answers the same JSON): ``GET /server_info``,
  else ``GET /get_server_info`` (its older spelling); the server arguments, the scheduler's
  ``max_total_num_tokens``, and ``internal_states[0].effective_max_running_requests_per_dp``
  (the request cap in effect, also when ``max_running_requests`` is ``null``: not asked);
- ``vllm``: the labels of ``vllm:cache_config_info`` on ``GET /metrics``, ``max_model_len`` of
  ``GET /v1/models``, and from its log the ``non-default args: {...}`` line (the arguments as
  vLLM parsed them) and the ``with config: ...`` line (the engine's resolved configuration);
- ``llamacpp``: ``GET /props`` (``total_slots``: ``--parallel``; ``default_generation_settings
  .n_ctx``: the context of one slot);
- ``none``: the engine has no such endpoint (``transformers serve``): said once, in ``note``.

Everything read is someone else's text: bodies are read up to :data:`MAX_BODY_BYTES`, JSON
nested deeper than the parser allows, NaN/Infinity, keys that are not identifiers, strings with
escape sequences, and too many keys are refused or cut; a server that answers garbage leaves
``unreadable`` with a printable reason (at most 200 characters), never a traceback. Nothing read
is followed (redirects are not) or executed (the log's dict is read by :func:`ast.literal_eval`,
which evaluates literals only, on a line of at most :data:`MAX_LINE_CHARS`).

Models and parsers need only the standard library and pydantic; aiohttp is imported by the
readers when they run.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from cleanslate.models import Frozen
from cleanslate.redact import REDACTED, is_secret_name, redact_text

if TYPE_CHECKING:
    import aiohttp

#: A value kept in ``requested`` / ``in_effect``: JSON scalars only (lists become text).
Scalar = str | int | float | bool | None
Flavour = Literal["sglang", "vllm", "llamacpp", "none"]
DifferenceKind = Literal["differs", "not_reported", "engine_chose"]

#: The most bytes of one JSON answer read: SGLang's /server_info is ~10 KB, llama.cpp's /props
#: carries the chat template (tens of KB for large ones).
MAX_BODY_BYTES = 2 * 1024 * 1024
#: The most bytes of a vLLM /metrics answer read (52 KB on a tiny model, as the metrics observer).
MAX_METRICS_BYTES = 8 * 1024 * 1024
#: Seconds one request may take, and the whole reading (a bare URL tries up to five paths; a
#: server that never answers an unknown path must not hold a launch for long).
TIMEOUT_S = 5.0
TOTAL_TIMEOUT_S = 10.0
#: Keys kept in ``in_effect``; characters of a key, of a string value, of a reason.
MAX_KEYS = 256
KEY_CHARS = 64
VALUE_CHARS = 200
REASON_CHARS = 200
#: Characters of one log line parsed (vLLM's "with config:" line is ~6 KB).
MAX_LINE_CHARS = 64 * 1024
#: JSON nesting accepted (SGLang's answer nests 3 deep).
MAX_DEPTH = 16

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}\Z")


def printable(text: str, limit: int = VALUE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, control characters (terminal escapes, newlines)
    replaced by spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in text[:limit]).strip()


def _reason(text: str) -> str:
    return printable(redact_text(text), REASON_CHARS) or "unreadable"


class ConfigDifference(Frozen):
    """One way the configuration in effect is not what was asked (see the module docstring).

    ``setting``: the engine's name for it (``max_running_requests``; not ``key``, a name the
    store's redaction masks); ``flag``: the option
    as asked (``--max-running-requests``), ``None`` for ``engine_chose``; ``asked`` and
    ``in_effect``: the two values (``None`` where there is none); ``source``: where the value
    in effect was read."""

    kind: DifferenceKind
    setting: str
    flag: str | None = None
    asked: Scalar = None
    in_effect: Scalar = None
    source: str | None = None

    def describe(self) -> str:
        """One line for people: ``--max-num-seqs 2 asked, 256 in effect``."""
        if self.kind == "engine_chose":
            return f"{self.setting}: not asked for; the engine chose {_show(self.in_effect)}"
        asked = f"{self.flag or self.setting} {_show(self.asked)}"
        if self.kind == "not_reported":
            return f"{asked} asked; the engine does not report {self.setting}"
        return f"{asked} asked, {_show(self.in_effect)} in effect ({self.setting})"


def _show(value: Scalar) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


class ServerConfig(Frozen):
    """What a server was asked to run with and what it says it runs with.

    ``requested``: the flags as given to the engine (``{"--max-running-requests": 64}``);
    ``requested_known``: whether they are known (a launch), not a bare URL's (then
    ``requested`` is empty and a limit is said chosen only where the engine says so).
    ``in_effect``: the engine's settings under its own names (``max_running_requests``),
    scalars only; ``sources[key]`` says where each was read
    (``GET /server_info``, ``vllm:cache_config_info``, ``log: non-default args``).
    ``differences``: see :class:`ConfigDifference`. ``unreadable``: why nothing could be read
    (``None`` when something was); ``note``: said once and not a failure (an engine without a
    configuration endpoint). ``flavour``: which reader answered; ``engine``: the adapter's
    name when known (``sim`` answers as ``sglang``)."""

    url: str = ""
    engine: str | None = None
    flavour: Flavour | None = None
    requested: dict[str, Scalar] = Field(default_factory=dict)
    requested_known: bool = False
    in_effect: dict[str, Scalar] = Field(default_factory=dict)
    sources: dict[str, str] = Field(default_factory=dict)
    differences: tuple[ConfigDifference, ...] = ()
    unreadable: str | None = None
    note: str | None = None

    def limits(self) -> dict[str, Scalar]:
        """The limits in effect that cap the work in flight (the flavour's: SGLang's
        ``max_running_requests`` and ``max_total_num_tokens``, vLLM's ``max_num_seqs`` when
        known, ``max_model_len`` and ``num_gpu_blocks``, llama.cpp's ``total_slots`` and
        ``n_ctx_slot``), those read."""
        keys = LIMITS.get(self.flavour or "", ())
        return {k: self.in_effect[k] for k in keys if self.in_effect.get(k) is not None}

    def summary(self) -> str | None:
        """``in effect: max_running_requests 64, max_total_num_tokens 148,833``, or ``None``
        when no limit was read."""
        found = self.limits()
        if not found:
            return None
        return "in effect: " + ", ".join(f"{k} {_show(v)}" for k, v in found.items())

    def report(self) -> list[str]:
        """What ``serve`` and ``bench`` print: :meth:`summary` (when a limit was read), then
        :meth:`lines`."""
        said = self.summary()
        return ([said] if said is not None and self.unreadable is None else []) + self.lines()

    def lines(self) -> list[str]:
        """What to print: one line per difference, or why nothing was read (empty when the
        configuration was read and matches what was asked)."""
        if self.unreadable is not None:
            return [f"configuration in effect: unreadable ({self.unreadable})"]
        said = [f"configuration in effect: {self.note}"] if self.note is not None else []
        return said + [d.describe() for d in self.differences]


# -- values --------------------------------------------------------------------------------------


def scalar(value: Any) -> tuple[bool, Scalar]:
    """``(True, value)`` for a value worth keeping, as a JSON scalar; ``(False, None)`` for one
    that is not (NaN, infinite, a mapping, a long list, an int beyond 2**63)."""
    if value is None or isinstance(value, bool):
        return True, value
    if isinstance(value, int):
        return (abs(value) < 2**63), (value if abs(value) < 2**63 else None)
    if isinstance(value, float):
        return (math.isfinite(value)), (value if math.isfinite(value) else None)
    if isinstance(value, str):
        return True, printable(value)
    if isinstance(value, (list, tuple)) and len(value) <= 32 and all(
            v is None or isinstance(v, (str, int, float, bool)) for v in value):
        try:
            text = json.dumps(list(value), allow_nan=False)
        except ValueError:
            return False, None
        return True, printable(text)
    return False, None


def flag_key(flag: str) -> str:
    """The engine-side name of an option: ``--max-running-requests`` and ``max-running-requests``
    are ``max_running_requests``; ``-np`` is ``np``."""
    return flag.lstrip("-").replace("-", "_")


def option_text(key: str) -> str:
    """A flag key as written to the engine (``max-running-requests`` -> ``--max-running-
    requests``); keys already spelled with dashes are kept."""
    return key if key.startswith("-") else "--" + key


def requested_flags(flags: Mapping[str, Any] | None,
                    spell: Any = option_text) -> dict[str, Scalar]:
    """The flags of a launch (``ServeConfig.flags``) as ``requested``: keys spelled as on the
    command line by ``spell`` (an adapter's ``option_name``), values as scalars (a flag without
    value is ``True``; a list becomes its JSON text; a value that is not a scalar, its text)."""
    out: dict[str, Scalar] = {}
    for key, value in (flags or {}).items():
        ok, kept = scalar(value)
        if not ok:
            kept = printable(str(value))
        if kept is not None and is_secret_name(str(key)):
            kept = REDACTED
        elif isinstance(kept, str):
            kept = redact_text(kept)
        out[str(spell(str(key)))] = kept
    return out


def _same(asked: Scalar, effect: Scalar) -> bool:
    if asked is True and effect is None:
        return False
    if isinstance(asked, bool) or isinstance(effect, bool):
        truth = {"true": True, "1": True, "false": False, "0": False}
        a = asked if isinstance(asked, bool) else truth.get(str(asked).strip().lower())
        e = effect if isinstance(effect, bool) else truth.get(str(effect).strip().lower())
        return a is not None and a == e
    try:
        a_num, e_num = float(str(asked)), float(str(effect))
    except ValueError:
        return str(asked).strip() == str(effect).strip()
    return math.isclose(a_num, e_num, rel_tol=1e-9, abs_tol=1e-12)


def compare(requested: Mapping[str, Scalar] | None, in_effect: Mapping[str, Scalar],
            sources: Mapping[str, str], *, aliases: Mapping[str, str] | None = None,
            limits: Sequence[str] = (), said_chosen: Iterable[str] = (), abbrev: bool = False,
            ignore: Iterable[str] = ()) -> tuple[ConfigDifference, ...]:
    """The differences between ``requested`` (flags as asked) and ``in_effect``.

    A flag's key is :func:`flag_key` of it, then ``aliases`` (the engine's own name for it:
    llama.cpp's ``np`` is ``total_slots``); with ``abbrev`` a unique prefix of an in-effect
    key counts (SGLang takes ``--tp`` for ``--tp-size``). ``limits``: the settings the engine
    chooses when not asked; one in ``in_effect`` and not asked for is an ``engine_chose``
    when the engine says it chose it (``said_chosen``: SGLang's ``max_running_requests``
    argument ``null``) or when ``requested`` is known (a launch: what was not passed was
    not asked). ``requested`` ``None``: not known (a bare URL): only what the engine says it
    chose is reported. ``ignore``: flag keys that are not settings (the sim's ``fault``)."""
    aliases = aliases or {}
    said = set(said_chosen)
    known = requested is not None
    requested = requested or {}
    skip = set(ignore)
    out: list[ConfigDifference] = []
    asked_keys: set[str] = set()
    for flag, asked in requested.items():
        key = flag_key(flag)
        if key in skip:
            continue
        key = aliases.get(key, key)
        if key not in in_effect and abbrev:
            found = [k for k in in_effect if k.startswith(key)]
            if len(found) == 1:
                key = found[0]
        asked_keys.add(key)
        if key not in in_effect:
            out.append(ConfigDifference(kind="not_reported", setting=key, flag=flag,
                                        asked=asked))
        elif not _same(asked, in_effect[key]):
            out.append(ConfigDifference(kind="differs", setting=key, flag=flag, asked=asked,
                                        in_effect=in_effect[key], source=sources.get(key)))
    for key in limits:
        if key in asked_keys or in_effect.get(key) is None or not (known or key in said):
            continue
        out.append(ConfigDifference(kind="engine_chose", setting=key, in_effect=in_effect[key],
                                    source=sources.get(key)))
    return tuple(out)


class _Collected:
    """``in_effect`` and ``sources`` being filled, bounded in keys."""

    def __init__(self) -> None:
        self.values: dict[str, Scalar] = {}
        self.sources: dict[str, str] = {}
        self.dropped = 0
        self.note: str | None = None
        #: limits the engine says it chose itself (not given on its command line)
        self.said_chosen: set[str] = set()

    def put(self, key: Any, value: Any, source: str, *, override: bool = True) -> None:
        if not isinstance(key, str) or not _KEY.match(key):
            self.dropped += 1
            return
        ok, kept = scalar(value)
        if not ok:
            self.dropped += 1
            return
        if kept is not None and is_secret_name(key):
            kept = REDACTED
        elif isinstance(kept, str):
            kept = redact_text(kept)
        if key in self.values and not override:
            return
        if key not in self.values and len(self.values) >= MAX_KEYS:
            self.dropped += 1
            return
        self.values[key] = kept
        self.sources[key] = source


# -- parsers (pure) -----------------------------------------------------------------------------


def parse_json_object(body: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(object, None)`` for a JSON object, else ``(None, why)``. NaN/Infinity, deeper than
    :data:`MAX_DEPTH` and anything but an object are refused."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        doc = json.loads(body, parse_constant=no_constant)
    except RecursionError:
        return None, "JSON nested too deep"
    except ValueError as exc:
        return None, _reason(f"not JSON: {exc}")
    if not isinstance(doc, dict):
        return None, f"a JSON {type(doc).__name__}, not an object"
    if _depth(doc) > MAX_DEPTH:
        return None, f"JSON nested deeper than {MAX_DEPTH}"
    return doc, None


def _depth(doc: Any) -> int:
    depth, level = 0, [doc]
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        nxt: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                nxt.extend(item.values())
            elif isinstance(item, list):
                nxt.extend(item)
        level = nxt
    return depth


#: SGLang settings the engine chooses itself when not asked (the request cap and the KV tokens).
SGLANG_CHOSEN = ("max_running_requests", "max_total_num_tokens")
#: SGLang flags whose setting /server_info names otherwise.
SGLANG_ALIASES = {"max_total_tokens": "max_total_num_tokens"}


def parse_server_info(doc: Mapping[str, Any], source: str) -> _Collected:
    """SGLang's (and the sim's) server info -> settings. The server arguments at the top level;
    ``max_running_requests`` is the cap in effect: the internal state's
    ``effective_max_running_requests_per_dp`` (per DP rank) when present, else the argument;
    ``max_total_num_tokens`` is the KV cache's token capacity."""
    got = _Collected()
    for key, value in doc.items():
        if key in ("internal_states", "max_total_tokens"):
            continue
        if isinstance(value, dict) and key == "simulation":
            for inner, inner_value in value.items():  # the sim's own settings (time_scale)
                got.put(inner, inner_value, f"{source} {key}", override=False)
            continue
        got.put(key, value, source)
    states = doc.get("internal_states")
    state = states[0] if isinstance(states, list) and states else None
    if isinstance(state, dict):
        cap = state.get("effective_max_running_requests_per_dp")
        if isinstance(cap, int) and not isinstance(cap, bool):
            got.put("max_running_requests", cap,
                    f"{source} internal_states[0].effective_max_running_requests_per_dp")
            if "max_running_requests" in doc and doc["max_running_requests"] is None:
                got.said_chosen.add("max_running_requests")
        if "last_gen_throughput" in state:
            got.put("last_gen_throughput", state["last_gen_throughput"],
                    f"{source} internal_states[0]")
    if "max_total_tokens" in doc and doc["max_total_tokens"] is None:
        got.said_chosen.add("max_total_num_tokens")
    # a None argument that nothing resolved says nothing about what is in effect
    for key in [k for k, v in got.values.items() if v is None]:
        del got.values[key]
        del got.sources[key]
    return got


#: vLLM settings it chooses itself when not asked: the context (from the model) and the KV
#: cache's blocks (from the memory left after the weights).
VLLM_CHOSEN = ("max_model_len", "num_gpu_blocks")
#: vLLM flags whose setting is read under another name.
VLLM_ALIASES = {"max_seq_len": "max_model_len"}
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_WITH_CONFIG = re.compile(r"Initializing a \S+ LLM engine \(([^)]{1,40})\) with config: (.*)$")


def parse_vllm_log(text: str) -> _Collected:
    """Settings from a vLLM log: the last ``non-default args: {...}`` line (as vLLM parsed the
    command line; read with :func:`ast.literal_eval`, never evaluated) and the last ``with
    config: ...`` line's top-level ``key=value`` pairs whose value is a plain word (its nested
    configs are left out; ``torch.bfloat16`` read as ``bfloat16``), which win over the
    arguments (they are what the engine resolved). Lines longer than :data:`MAX_LINE_CHARS`
    are skipped."""
    got = _Collected()
    args_line = config_line = None
    version = None
    for line in text.splitlines():
        if len(line) > MAX_LINE_CHARS:
            continue
        if (m := _NON_DEFAULT.search(line)) is not None:
            args_line = m.group(1)
        elif (m := _WITH_CONFIG.search(line)) is not None:
            version, config_line = m.group(1), m.group(2)
    if config_line is not None:
        for key, value in _config_pairs(config_line):
            got.put(key, value, "log: engine config")
        if version is not None:
            got.put("version", version, "log: engine config")
        if "max_seq_len" in got.values:
            got.put("max_model_len", got.values.pop("max_seq_len"), "log: engine config")
            got.sources.pop("max_seq_len", None)
    if args_line is not None:
        try:
            args = ast.literal_eval(args_line)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            args = None
        if isinstance(args, dict):
            for key, value in args.items():
                got.put(key, value, "log: non-default args", override=False)
            if "max_model_len" not in args:  # not given: vLLM took it from the model
                got.said_chosen.add("max_model_len")
    return got


def _config_pairs(line: str) -> Iterable[tuple[str, Scalar]]:
    """Top-level ``key=value`` pairs of ``a=1, b=X(c=2, d=3), e='f'``: values with brackets are
    skipped; quoted words unquoted; ``None``/``True``/``False`` and numbers typed."""
    depth, quote, start = 0, "", 0
    parts: list[str] = []
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    for part in parts:
        key, sep, raw = part.strip().partition("=")
        if not sep or not _KEY.match(key) or any(c in raw for c in "()[]{}<>"):
            continue
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            yield key, raw[1:-1]
        elif raw in ("None", "True", "False"):
            yield key, {"None": None, "True": True, "False": False}[raw]
        elif raw.startswith("torch."):  # dtype=torch.bfloat16 is the flag's bfloat16
            yield key, raw.removeprefix("torch.")
        else:
            yield key, _number(raw)


def _number(raw: str) -> Scalar:
    for kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            continue
        ok, kept = scalar(value)
        return kept if ok else raw
    return raw


def parse_cache_config(metrics_text: str) -> _Collected:
    """The labels of ``vllm:cache_config_info`` (its value is 1: the information is in the
    labels): ``block_size``, ``gpu_memory_utilization``, ``num_gpu_blocks``,
    ``kv_cache_size_tokens``, ``enable_prefix_caching``...; typed like the log's values."""
    from prometheus_client.parser import text_string_to_metric_families

    got = _Collected()
    # Only its lines are parsed: vLLM's whole exposition (52 KB on a tiny model) is histograms.
    name = "vllm:cache_config_info"
    mine = "\n".join(line for line in metrics_text.splitlines()
                     if line.startswith(name) or line.startswith(("# HELP " + name,
                                                                  "# TYPE " + name)))
    try:
        for family in text_string_to_metric_families(mine + "\n"):
            if family.name != "vllm:cache_config_info":
                continue
            for sample in family.samples[:1]:
                for key, raw in sample.labels.items():
                    value: Scalar = {"None": None, "True": True, "False": False}.get(raw, raw)
                    if isinstance(value, str):
                        value = _number(value)
                    got.put(key, value, "vllm:cache_config_info")
                if sample.labels.get("num_gpu_blocks_override") == "None":
                    got.said_chosen.add("num_gpu_blocks")  # sized from the memory left
            break
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        got.dropped += 1
        got.put("_error", _reason(f"{type(exc).__name__}: {exc}"), "vllm:cache_config_info")
    for key in [k for k, v in got.values.items() if v is None]:
        del got.values[key]
        del got.sources[key]
    return got


def parse_models(doc: Mapping[str, Any]) -> _Collected:
    """``max_model_len`` of the first model of ``GET /v1/models`` (vLLM, SGLang and the sim
    say it)."""
    got = _Collected()
    data = doc.get("data")
    first = data[0] if isinstance(data, list) and data else None
    if isinstance(first, dict):
        value = first.get("max_model_len")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            got.put("max_model_len", value, "GET /v1/models")
    return got


#: llama.cpp settings it chooses itself when not asked: its slots (``--parallel``, auto by
#: default in recent builds) and one slot's context (``--ctx-size`` shared among the slots).
LLAMACPP_CHOSEN = ("total_slots", "n_ctx_slot")
#: llama.cpp flags (short and long) and the /props key that shows them.
LLAMACPP_ALIASES = {"np": "total_slots", "parallel": "total_slots",
                    "metrics": "endpoint_metrics", "slots": "endpoint_slots",
                    "props": "endpoint_props", "m": "model_path", "model": "model_path",
                    "a": "model_alias", "alias": "model_alias", "c": "ctx_size"}


def parse_props(doc: Mapping[str, Any]) -> _Collected:
    """llama.cpp's ``GET /props``: ``total_slots``, the context of one slot as ``n_ctx_slot``
    (``default_generation_settings.n_ctx``: ``--ctx-size`` divided among the slots unless the
    KV cache is unified), the model, the endpoints on, the build. The chat template and the
    sampling defaults are left out."""
    got = _Collected()
    for key in ("total_slots", "model_path", "model_alias", "model_ftype", "endpoint_slots",
                "endpoint_props", "endpoint_metrics", "build_info", "is_sleeping"):
        if key in doc:
            got.put(key, doc[key], "GET /props")
    settings = doc.get("default_generation_settings")
    if isinstance(settings, dict) and "n_ctx" in settings:
        got.put("n_ctx_slot", settings["n_ctx"], "GET /props default_generation_settings.n_ctx")
    return got


# -- readers (async) ----------------------------------------------------------------------------


async def fetch_body(session: aiohttp.ClientSession, url: str, *,
                     max_bytes: int = MAX_BODY_BYTES,
                     timeout_s: float = TIMEOUT_S) -> tuple[str | None, str | None]:
    """``(text, None)`` for a 200 answer at ``url``, else ``(None, why)``: redirects not
    followed, the body read up to ``max_bytes`` (compressed bodies refused), UTF-8 only.
    Never raises except on cancellation."""
    import aiohttp

    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, allow_redirects=False,
                                   headers={"Accept-Encoding": "identity"}) as resp:
                if 300 <= resp.status < 400:
                    return None, _reason(f"HTTP {resp.status} redirect not followed")
                if resp.status != 200:
                    return None, _reason(f"HTTP {resp.status} at {url}")
                encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
                if encoding not in ("", "identity") and not session.auto_decompress:
                    return None, _reason(f"compressed body ({encoding}) not accepted")
                if (resp.content_length or 0) > max_bytes:
                    return None, f"body over {max_bytes} bytes"
                body = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > max_bytes:
                        return None, f"body over {max_bytes} bytes"
    except TimeoutError:
        return None, f"no answer within {timeout_s:g} s"
    except (aiohttp.ClientError, OSError, ValueError, UnicodeError) as exc:
        return None, _reason(f"{type(exc).__name__}: {exc}")
    try:
        return body.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "body is not UTF-8 text"


async def _json_at(session: aiohttp.ClientSession, url: str
                   ) -> tuple[dict[str, Any] | None, str | None]:
    text, why = await fetch_body(session, url)
    if text is None:
        return None, why
    return parse_json_object(text)


async def _read_sglang(session: aiohttp.ClientSession, base: str
                       ) -> tuple[_Collected | None, str | None]:
    why = None
    for path in ("/server_info", "/get_server_info"):
        doc, why = await _json_at(session, base + path)
        if doc is None:
            continue
        if not any(k in doc for k in ("model_path", "internal_states", "tp_size",
                                      "max_running_requests")):
            why = f"GET {path}: not SGLang's server info (none of its keys)"
            continue
        return parse_server_info(doc, f"GET {path}"), None
    return None, why


async def _read_vllm(session: aiohttp.ClientSession, base: str, log_text: str | None
                     ) -> tuple[_Collected | None, str | None]:
    got = parse_vllm_log(log_text) if log_text else _Collected()
    text, why = await fetch_body(session, base + "/metrics", max_bytes=MAX_METRICS_BYTES)
    found_cache = False
    if text is not None:
        cache = parse_cache_config(text)
        error = cache.values.pop("_error", None)
        if error is not None:
            why = f"/metrics: {error}"
        found_cache = bool(cache.values)
        if not found_cache and error is None:
            why = "/metrics has no vllm:cache_config_info"
        for key, value in cache.values.items():
            got.values[key] = value
            got.sources[key] = cache.sources[key]
        got.said_chosen |= cache.said_chosen
    doc, models_why = await _json_at(session, base + "/v1/models")
    if doc is not None:
        models = parse_models(doc)
        got.values.update(models.values)
        got.sources.update(models.sources)
    if not got.values:
        return None, why or models_why or "nothing read"
    if not found_cache and why is not None:
        got.note = why
    return got, None


async def _read_llamacpp(session: aiohttp.ClientSession, base: str
                         ) -> tuple[_Collected | None, str | None]:
    doc, why = await _json_at(session, base + "/props")
    if doc is None:
        return None, why
    if "total_slots" not in doc and "default_generation_settings" not in doc:
        return None, "GET /props: not llama.cpp's props (no total_slots)"
    return parse_props(doc), None


#: The limits :meth:`ServerConfig.summary` prints, per flavour.
LIMITS: dict[str, tuple[str, ...]] = {
    "sglang": SGLANG_CHOSEN,
    "vllm": ("max_num_seqs", *VLLM_CHOSEN),
    "llamacpp": LLAMACPP_CHOSEN,
}

_RULES: dict[str, tuple[Mapping[str, str], tuple[str, ...]]] = {
    "sglang": (SGLANG_ALIASES, SGLANG_CHOSEN),
    "vllm": (VLLM_ALIASES, VLLM_CHOSEN),
    "llamacpp": (LLAMACPP_ALIASES, LLAMACPP_CHOSEN),
}


async def _first_answer(session: aiohttp.ClientSession, base: str,
                        order: Sequence[Flavour], log_text: str | None, reasons: list[str]
                        ) -> tuple[_Collected | None, Flavour | None]:
    """The first flavour of ``order`` whose reader finds a setting; each that does not adds
    its reason to ``reasons``."""
    for name in order:
        if name == "sglang":
            got, why = await _read_sglang(session, base)
        elif name == "llamacpp":
            got, why = await _read_llamacpp(session, base)
        else:
            got, why = await _read_vllm(session, base, log_text)
        if got is not None and got.values:
            return got, name
        reasons.append(f"{name}: {why or 'no setting readable in its answer'}")
    return None, None


def _unpooled(session: aiohttp.ClientSession) -> bool:
    connector = session.connector
    return connector is not None and connector.force_close


async def read_server_config(
    session: aiohttp.ClientSession | None,
    base_url: str,
    *,
    flavour: Flavour | None = None,
    engine: str | None = None,
    requested: Mapping[str, Scalar] | None = None,
    log_text: str | None = None,
    abbrev: bool = False,
    aliases: Mapping[str, str] | None = None,
    ignore: Iterable[str] = (),
    note: str | None = None,
    timeout_s: float = TOTAL_TIMEOUT_S,
) -> ServerConfig:
    """Read the configuration in effect of the server at ``base_url`` and compare it with
    ``requested``. Never raises except on cancellation.

    ``flavour``: which reader (``None``: a bare URL; SGLang's server info, then llama.cpp's
    props, then vLLM's cache config are tried, and the first that answers names the
    flavour). ``none`` reads nothing and keeps ``note``. ``log_text``: the server's log (vLLM's
    arguments are read from it). ``abbrev``, ``aliases`` and ``ignore``: the engine's flag
    rules for :func:`compare`. ``session``: the caller's pool (the benchmark's, so the reading
    takes its path); ``None``: a small one of its own. ``timeout_s``: the whole reading's
    budget (each request has at most :data:`TIMEOUT_S` of it).
    """
    import aiohttp

    base = base_url.rstrip("/")
    known: dict[str, Any] = {"url": base, "requested": dict(requested or {}),
                             "requested_known": requested is not None}
    if flavour == "none":
        return ServerConfig(**known, engine=engine, flavour="none",
                            note=note or "the engine has no configuration endpoint")
    if session is None or not _unpooled(session):
        # Its own connections, to where the caller's pool connects, never pooled: aiohttp pools
        # a connection once an answer's end is read, and bytes a server sends past a short
        # Content-Length would be read as the answer to the benchmark request that took it
        # next (a hostile /metrics failed a level's request so in 4 of 5 runs).
        from cleanslate.hosts.forward import connector_for, same_connector

        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S * 4)
        # without a pool: to where the URL is served (a remote run's forward socket too)
        connector = (same_connector(session.connector, force_close=True) if session is not None
                     else connector_for(base_url, force_close=True))
        async with aiohttp.ClientSession(
                connector=connector, timeout=timeout,
                auto_decompress=session.auto_decompress if session else True) as own:
            return await read_server_config(
                own, base_url, flavour=flavour, engine=engine, requested=requested,
                log_text=log_text, abbrev=abbrev, aliases=aliases, ignore=ignore, note=note,
                timeout_s=timeout_s)
    order: Sequence[Flavour] = (flavour,) if flavour else ("sglang", "llamacpp", "vllm")
    reasons: list[str] = []
    got: _Collected | None = None
    found: Flavour | None = None
    try:
        async with asyncio.timeout(timeout_s):
            got, found = await _first_answer(session, base, order, log_text, reasons)
    except TimeoutError:
        reasons.append(f"no reading within {timeout_s:g} s")
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, MemoryError) as exc:
        # a parser met a shape no test thought of: still an answer, never a traceback
        reasons.append(f"{type(exc).__name__}: {exc}")
    if got is None or found is None:
        return ServerConfig(**known, engine=engine, flavour=flavour,
                            unreadable=_reason("; ".join(reasons) or "nothing answered"))
    if engine is None and found == "sglang" and (
            str(got.values.get("version", "")).endswith("+sim")):
        engine = "sim"
    own_aliases, limits = _RULES[found]
    differences = compare(requested, got.values, got.sources,
                          aliases={**own_aliases, **(aliases or {})}, limits=limits,
                          said_chosen=got.said_chosen, abbrev=abbrev, ignore=ignore)
    return ServerConfig(**known, engine=engine, flavour=found, in_effect=got.values,
                        sources=got.sources, differences=differences, note=got.note)


__all__ = [
    "MAX_BODY_BYTES",
    "ConfigDifference",
    "DifferenceKind",
    "Flavour",
    "Scalar",
    "ServerConfig",
    "compare",
    "fetch_body",
    "flag_key",
    "parse_cache_config",
    "parse_json_object",
    "parse_models",
    "parse_props",
    "parse_server_info",
    "parse_vllm_log",
    "read_server_config",
    "requested_flags",
]
