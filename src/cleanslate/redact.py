"""Secrets kept out of what cleanslate writes and prints.

A serving host is full of secrets that are not ours: ``HF_TOKEN`` in a run's environment, a
server's ``--api-key``, a store URL's password, another user's ``curl -H 'Authorization: Bearer
...'``. Everything that leaves a process as a record (the store, ``--json``, reports, run folders,
progress lines) goes through the functions here first. What counts as a secret:

- an environment variable or flag whose name, split on ``_``, ``-`` and ``.``, has a part that
  is or ends with ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``, ``CREDENTIAL(S)``,
  ``APIKEY``, ``ACCESSKEY``, ``PRIVATEKEY``, ``SECRETKEY``, or that is ``KEY``, ``AUTH``,
  ``PASS``, ``PW`` (``HF_TOKEN``, ``OPENAI_API_KEY``, ``PGPASSWORD``, ``--api-key``), unless
  its last part says it names a place or a measure of the secret rather than the secret
  (``PATH``, ``FILE``, ``DIR``, ``THROUGHPUT``, ...: ``HF_TOKEN_PATH``, ``--api-key-file``,
  ``total_token_throughput``); not ``TOKENIZERS_PARALLELISM``, ``--max-num-batched-tokens``
  nor ``--ssl-keyfile``; or a name the user lists in ``CLEANSLATE_SECRET_NAMES``
  (comma-separated, case-insensitive; always secret);
- the password of a URL (``scheme://user:PASSWORD@host``);
- what follows ``Bearer`` or ``Basic``, or an ``Authorization:`` header's scheme.

Values are replaced by :data:`REDACTED`; names stay, so a reader still sees *that* a token was
set. The functions never raise on any text and never return the secret. Every pattern starts
only at the beginning of a word, so the cost is linear in the text's length (a process can
write a megabyte of argv, and every snapshot redacts every command line).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: What a secret value is replaced with.
REDACTED = "***"

#: Environment variable with extra secret names (comma-separated, matched case-insensitively).
SECRET_NAMES_ENV = "CLEANSLATE_SECRET_NAMES"

#: Secret values shorter than this are not looked for in free text (they would match
#: everywhere and hide nothing); they are still replaced where their name says what they are.
MIN_SCRUB_LEN = 4

_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY",
          "ACCESSKEY", "PRIVATEKEY", "SECRETKEY")
_EXACT = frozenset({"KEY", "AUTH", "PASS", "PW"})
# A last part that makes the name a place or a measure, not the secret itself.
_NOT_THE_VALUE = frozenset({"PATH", "FILE", "FILES", "DIR", "THROUGHPUT", "LEN", "LENGTH",
                            "COUNT", "SIZE", "THRESHOLD", "LATENCY", "WATERMARK", "METRICS"})
_SPLIT = re.compile(r"[_\-.]+")

# Lookbehinds make each pattern start only at the beginning of a word: without them, every
# position inside a long word is a new start and the scan is quadratic.
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)[^\s/]+@")
_AUTH_HEADER = re.compile(
    r"(?P<head>(?<!\w)(?i:authorization)[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?:(?i:bearer|basic|token|digest|negotiate|apikey|api-key|key|bot)[ \t]+)?"
    r"|(?<![\w\-])(?:Bearer|BEARER|Basic|BASIC)[ \t]+)"
    r"[^\s'\",;]+")
# NAME=value, 'name': 'value', --name=value, --name value, name: value in free text (log
# lines, details, shell commands, a server's printed arguments). The lookahead keeps names that
# hold a secret word (is_secret_name decides), so ordinary text costs one scan. A match ends
# where the value starts: when the name is not a secret, the scan goes on from there (the value
# may hold an assignment of its own: "x=HF_TOKEN=...").
_SECRET_WORDS = ("token", "secret", "pass", "pw", "credential", "key", "auth")
_ASSIGNMENT_TEMPLATE = (
    r"(?<![\w.\-])(?P<q>[\"']?)(?=-{{0,2}}[\w.\-]*(?i:{words}))"
    r"(?P<name>(?P<dash>-{{1,2}})?[A-Za-z_][\w.\-]*)(?P=q)"
    # "--name value" for options only ("the token was" is prose), and not "--name --next".
    r"(?:[ \t]*[=:][ \t]*(?=[^\s,;])|(?(dash)[ \t]+(?=[^\s,;\-])|(?!)))")
_VALUE = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'|\[[^\]\n]{0,256}\]|[^\s,;]+")


@functools.lru_cache(maxsize=8)
def _assignment_pattern(extra: frozenset[str]) -> re.Pattern[str]:
    words = [*_SECRET_WORDS, *(re.escape(n) for n in sorted(extra))]
    return re.compile(_ASSIGNMENT_TEMPLATE.format(words="|".join(words)))


def _redact_assignments(text: str, pattern: re.Pattern[str]) -> str:
    out: list[str] = []
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        start = m.end()
        out.append(text[pos:start])
        value = _VALUE.match(text, start) if is_secret_name(m.group("name")) else None
        if value is None:
            pos = start
        else:
            out.append(REDACTED)
            pos = value.end()
    out.append(text[pos:])
    return "".join(out)


@functools.lru_cache(maxsize=8)
def _parse_names(raw: str) -> frozenset[str]:
    out: set[str] = set()
    for n in raw.split(","):
        bare = n.strip().upper().lstrip("-")
        if bare:
            out.add(bare)
            out.add(bare.replace("-", "_"))
    return frozenset(out)


def _extra_names() -> frozenset[str]:
    return _parse_names(os.environ.get(SECRET_NAMES_ENV, ""))


@functools.lru_cache(maxsize=8192)
def _is_secret(name: str, extra: frozenset[str]) -> bool:
    bare = name.strip().lstrip("-").upper()
    if not bare or len(bare.split(None, 1)) > 1:
        return False  # a name has no blanks: "--api-key VALUE" as one word is text
    if bare in extra or bare.replace("-", "_") in extra:
        return True
    parts = [p for p in _SPLIT.split(bare) if p]
    if not parts or parts[-1] in _NOT_THE_VALUE:
        return False
    return any(part in _EXACT or part.endswith(_WORDS) for part in parts)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or flag name (``HF_TOKEN``, ``--api-key``) names a secret."""
    return _is_secret(str(name), _extra_names())


def redact_url(url: str) -> str:
    """``postgresql://user:pw@host/db`` -> ``postgresql://user:***@host/db`` (any URL in the
    text)."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", str(url))


def _scalar_secret(value: Any) -> bool:
    """Whether a value under a secret name is worth hiding (not unset, not a switch)."""
    return value not in (None, True, False, "")


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of secret names replaced, and URL passwords in the
    others."""
    return {k: (REDACTED if is_secret_name(k) and v else redact_text(str(v)))
            for k, v in env.items()}


def redact_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of engine flags (``{api-key: sk-..}``) with secret values replaced (a list of
    them element by element), and secrets in the text of the others."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if is_secret_name(str(key)):
            out[key] = _hide_all(value)
        else:
            out[key] = redact_data(value)
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of a command line with secret values replaced: ``--api-key X``, ``--api-key=X``,
    ``HF_TOKEN=X``, URL passwords and authorization headers. The word after a secret flag is
    taken as its value unless it is itself an option (starts with ``-``)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(REDACTED if arg else arg)
                continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg):
            hide_next = True
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if eq and value and is_secret_name(name) and not any(c.isspace() for c in name):
            out.append(f"{name}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return out


def redact_text(text: str) -> str:
    """Free text (a log line, a detail, a shell command, a printed argument list) with URL
    passwords, authorization headers and ``NAME=value`` / ``'name': 'value'`` / ``--name
    value`` / ``name: value`` assignments of secret names replaced."""
    if not text:
        return text
    text = str(text)
    # Substring tests (C speed) skip the regular expressions on text that cannot match them.
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", text)
    low = text.lower()
    if "authorization" in low or "bearer" in low or "basic" in low:
        text = _AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    extra = _extra_names()
    if any(w in low for w in _SECRET_WORDS) or any(n.lower() in low for n in extra):
        text = _redact_assignments(text, _assignment_pattern(extra))
    return text


def _hide_all(value: Any) -> Any:
    """Every scalar of a value held under a secret name replaced (structure kept)."""
    if isinstance(value, Mapping):
        return {k: _hide_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hide_all(v) for v in value]
    return REDACTED if _scalar_secret(value) else value


#: Keys whose list of strings is a command line (the word after a secret flag is its value);
#: other lists of strings (file names, labels) are redacted element by element.
ARGV_KEYS = frozenset({"argv", "cmdline", "launch", "command", "cmd", "args"})


def redact_data(value: Any, scrub: Scrubber | None = None, *, argv: bool = False) -> Any:
    """A copy of a JSON-like document (records, specs, check documents) with no secret: values
    under secret names hidden (all of their scalars), lists of strings under :data:`ARGV_KEYS`
    redacted as command lines (:func:`redact_argv`; ``argv`` says ``value`` is one), and every
    string through ``scrub`` (known secret values) and :func:`redact_text`. Numbers, booleans
    and ``None`` under other names are kept. Applying it twice gives the same document as
    applying it once."""
    if isinstance(value, str):
        return scrub(value) if scrub is not None else redact_text(value)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            key = redact_data(k, scrub) if isinstance(k, str) else k
            if isinstance(k, str) and is_secret_name(k):
                out[key] = _hide_all(v)
            else:
                out[key] = redact_data(v, scrub, argv=isinstance(k, str) and k in ARGV_KEYS)
        return out
    if isinstance(value, (list, tuple)):
        if argv and all(isinstance(v, str) for v in value):
            return [scrub(a) if scrub is not None else a for a in redact_argv(value)]
        return [redact_data(v, scrub) for v in value]
    return value


def secret_values(value: Any) -> set[str]:
    """The secret values a document holds, to look for elsewhere (a server's log tail may print
    its own ``--api-key``): values under secret names, the word after a secret flag in a
    command line (a list of strings under :data:`ARGV_KEYS`), ``NAME=value`` items of such
    lists, and URL passwords in any string. Values shorter than :data:`MIN_SCRUB_LEN` are left
    out."""
    found: set[str] = set()

    def text(s: str) -> None:
        for m in _URL_PASSWORD.finditer(s):
            end = m.group(0)[len(m.group("head")):-1]
            found.add(end)

    def walk(v: Any, secret: bool, argv: bool = False) -> None:
        if isinstance(v, Mapping):
            for k, item in v.items():
                walk(item, secret or (isinstance(k, str) and is_secret_name(k)),
                     isinstance(k, str) and k in ARGV_KEYS)
        elif isinstance(v, (list, tuple)):
            strings = argv and all(isinstance(x, str) for x in v)
            for i, item in enumerate(v):
                walk(item, secret)
                if strings and not secret:
                    if item.startswith("-") and "=" not in item and is_secret_name(item) and \
                            i + 1 < len(v) and not v[i + 1].startswith("-"):
                        found.add(v[i + 1])
                    name, eq, rest = item.partition("=")
                    if eq and rest and is_secret_name(name):
                        found.add(rest)
        elif isinstance(v, str):
            if secret:
                found.add(v)
            text(v)
        elif secret and isinstance(v, (int, float)) and not isinstance(v, bool):
            found.add(str(v))

    walk(value, False)
    return {v for v in found if len(v) >= MIN_SCRUB_LEN and v != REDACTED}


class Scrubber:
    """Replaces known secret values (those of a run's environment and flags) wherever they
    appear in free text, such as a server's log tail, then applies :func:`redact_text`. Values
    shorter than :data:`MIN_SCRUB_LEN` are not scrubbed (they would match everywhere and hide
    nothing)."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = sorted({v for v in values
                               if isinstance(v, str) and len(v) >= MIN_SCRUB_LEN
                               and v != REDACTED}, key=len, reverse=True)

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(self._values)

    @classmethod
    def for_run(cls, env: Mapping[str, str], flags: Mapping[str, Any],
                argv: Sequence[str] = ()) -> Scrubber:
        """The secrets of a run: its environment's and flags' secret values, those of its
        command line, and URL passwords in any of them."""
        return cls(secret_values({"env": dict(env), "flags": dict(flags), "argv": list(argv)}))

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        return redact_text(text)


__all__ = [
    "ARGV_KEYS",
    "MIN_SCRUB_LEN",
    "REDACTED",
    "SECRET_NAMES_ENV",
    "Scrubber",
    "is_secret_name",
    "redact_argv",
    "redact_data",
    "redact_env",
    "redact_flags",
    "redact_text",
    "redact_url",
    "secret_values",
]
