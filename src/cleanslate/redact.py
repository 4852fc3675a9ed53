"""Secrets kept out of what cleanslate writes and prints.

A serving host is full of secrets that are not ours: ``HF_TOKEN`` in a run's environment, a
server's ``--api-key``, a store URL's password, another user's ``curl -H 'Authorization: Bearer
...'``. Everything that leaves a process as a record (the store, ``--json``, reports, run folders,
progress lines) goes through the functions here first. What counts as a secret:

- an environment variable or flag whose name, split on ``_`` and ``-``, has a part that is or
  ends with ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``, ``CREDENTIAL(S)``, ``APIKEY``, or
  that is ``KEY``, ``AUTH``, ``PASS``, ``PW`` (``HF_TOKEN``, ``OPENAI_API_KEY``,
  ``PGPASSWORD``, ``--api-key``; not ``TOKENIZERS_PARALLELISM``, ``--max-num-batched-tokens``
  nor ``--ssl-keyfile``), or that the user names in
  ``CLEANSLATE_SECRET_NAMES`` (comma-separated, case-insensitive);
- the password of a URL (``scheme://user:PASSWORD@host``);
- what follows ``Bearer`` or ``Basic`` in an authorization header.

Values are replaced by :data:`REDACTED`; names stay, so a reader still sees *that* a token was
set. The functions never raise and never return the secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: What a secret value is replaced with.
REDACTED = "***"

#: Environment variable with extra secret names (comma-separated, matched case-insensitively).
SECRET_NAMES_ENV = "CLEANSLATE_SECRET_NAMES"

_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY",
          "ACCESSKEY", "PRIVATEKEY", "SECRETKEY")
_EXACT = ("KEY", "AUTH", "PASS", "PW")
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@")
_AUTH_HEADER = re.compile(r"(?P<head>(?:\b[Aa]uthorization\s*[:=]\s*(?:\w+\s+)?"
                          r"|\bBearer\s+|\bBasic\s+))[^\s'\"]+")
# NAME=value and --name=value / --name value in free text (log lines, details, shell commands).
_ASSIGNMENT = re.compile(r"(?P<name>(?<![\w-])-{0,2}[A-Za-z_][\w.-]*)(?P<sep>=|:\s|\s+)"
                         r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;]+)")


def _extra_names() -> frozenset[str]:
    raw = os.environ.get(SECRET_NAMES_ENV, "")
    return frozenset(n.strip().upper().lstrip("-") for n in raw.split(",") if n.strip())


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or flag name (``HF_TOKEN``, ``--api-key``) names a secret."""
    bare = name.strip().lstrip("-").upper()
    if not bare:
        return False
    if bare in _extra_names() or bare.replace("-", "_") in _extra_names():
        return True
    parts = [p for p in re.split(r"[_\-.]", bare) if p]
    return any(part in _EXACT or part.endswith(_WORDS) for part in parts)


def redact_url(url: str) -> str:
    """``postgresql://user:pw@host/db`` -> ``postgresql://user:***@host/db``."""
    return _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", url)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of secret names replaced."""
    return {k: (REDACTED if is_secret_name(k) and v else redact_url(str(v)))
            for k, v in env.items()}


def redact_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of engine flags (``{api-key: sk-..}``) with secret values replaced."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if is_secret_name(str(key)) and value not in (None, True, False):
            out[key] = REDACTED
        elif isinstance(value, str):
            out[key] = redact_url(value)
        else:
            out[key] = value
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of a command line with secret values replaced: ``--api-key X``, ``--api-key=X``,
    ``HF_TOKEN=X``, URL passwords and authorization headers."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(REDACTED)
                continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg):
            hide_next = True
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if eq and value and is_secret_name(name) and " " not in name:
            out.append(f"{name}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return out


def redact_text(text: str) -> str:
    """Free text (a log line, a detail, a shell command) with URL passwords, authorization
    headers and ``NAME=value`` / ``--name value`` assignments of secret names replaced."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", text)
    text = _AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, text)

    def assignment(m: re.Match[str]) -> str:
        name = m.group("name")
        if not is_secret_name(name) or m.group("value").startswith("-"):
            return m.group(0)
        if m.group("sep").strip() == "" and not name.startswith("-"):
            return m.group(0)  # "the token was" is prose, not an assignment
        return f"{name}{m.group('sep')}{REDACTED}"

    return _ASSIGNMENT.sub(assignment, text)


class Scrubber:
    """Replaces known secret values (those of a run's environment and flags) wherever they
    appear in free text, such as a server's log tail. Values shorter than 4 characters are not
    scrubbed (they would match everywhere and hide nothing)."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = sorted({v for v in values if isinstance(v, str) and len(v) >= 4},
                              key=len, reverse=True)

    @classmethod
    def for_run(cls, env: Mapping[str, str], flags: Mapping[str, Any]) -> Scrubber:
        values = [v for k, v in env.items() if is_secret_name(k)]
        values += [str(v) for k, v in flags.items()
                   if is_secret_name(str(k)) and v not in (None, True, False)]
        return cls(values)

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        for value in self._values:
            text = text.replace(value, REDACTED)
        return redact_text(text)


__all__ = [
    "REDACTED",
    "SECRET_NAMES_ENV",
    "Scrubber",
    "is_secret_name",
    "redact_argv",
    "redact_env",
    "redact_flags",
    "redact_text",
    "redact_url",
]
