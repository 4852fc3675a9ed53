"""Secrets kept out of what cleanslate writes and prints.

A serving host is full of secrets that are not ours: ``HF_TOKEN`` in a run's environment, a
server's ``--api-key``, a store URL's password, another user's ``curl -H 'Authorization: Bearer
...'``. Everything that leaves a process as a record (the store, ``--json``, reports, run folders,
progress lines) goes through the functions here first. What counts as a secret:

- an environment variable or flag whose name, split on ``_``, ``-`` and ``.``, has a part that
  is or ends with ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``, ``CREDENTIAL(S)``,
  ``APIKEY``, ``ACCESSKEY``, ``PRIVATEKEY``, ``SECRETKEY``, ``PASSPHRASE``, ``COOKIE``,
  ``SIGNATURE``, ``SSHPASS``, or that is ``KEY``, ``AUTH``, ``PASS``, ``PW``, ``PAT``, ``SIG``,
  or ``PWD`` after another part (``HF_TOKEN``, ``OPENAI_API_KEY``, ``PGPASSWORD``,
  ``MYSQL_PWD``, ``GITHUB_PAT``, ``--api-key``; ``PWD`` alone is the working directory),
  unless a later part says it names a place or a measure of the secret rather than the secret
  (``PATH``, ``FILE``, ``DIR``, ``THROUGHPUT``, ``THRESHOLD``, ``MAP``, ``ID``, ``STDIN``, ...:
  ``HF_TOKEN_PATH``, ``--api-key-file``, ``total_token_throughput``,
  ``--password-stdin``) or the part before it makes it a unit (``PER``, ``FIRST``:
  ``--kt-max-deferred-experts-per-token``); not ``TOKENIZERS_PARALLELISM``,
  ``--max-num-batched-tokens`` nor ``--ssl-keyfile``; or a name the user lists in
  ``CLEANSLATE_SECRET_NAMES`` (comma-separated, case-insensitive; always secret);
- the password of a URL (``scheme://user:PASSWORD@host``, a ``/`` in it too), the userinfo
  of a web URL (``https://TOKEN@github.com``), a schemeless DSN's password
  (``user:PASSWORD@tcp(host)/db``), an ODBC ``Pwd=`` and secret query parameters
  (``?sig=``, ``X-Amz-Signature=``, ``token=``: the value ends at the next ``&``);
- what follows ``Bearer`` or ``Basic``, or an ``Authorization:`` header's scheme;
- the passwords of programs whose short flags carry one, after a word naming the program:
  ``mysql -pSECRET`` (the mysql and mariadb family; ``-p`` alone prompts), ``sshpass -p``,
  ``redis-cli -a``, ``docker login -p`` (podman, nerdctl...; ``docker run -p`` is a port),
  ``mongosh -p``, ``ldapsearch -w``, ``sqlcmd -P``, ``curl -u user:SECRET``.

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
from dataclasses import dataclass
from typing import Any

#: What a secret value is replaced with.
REDACTED = "***"

#: Environment variable with extra secret names (comma-separated, matched case-insensitively).
SECRET_NAMES_ENV = "CLEANSLATE_SECRET_NAMES"

#: Secret values shorter than this are not looked for in free text (they would match
#: everywhere and hide nothing); they are still replaced where their name says what they are.
MIN_SCRUB_LEN = 4

_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY",
          "ACCESSKEY", "PRIVATEKEY", "SECRETKEY", "PASSPHRASE", "COOKIE", "SIGNATURE",
          "SSHPASS")
_EXACT = frozenset({"KEY", "AUTH", "PASS", "PW", "PAT", "SIG"})
# Secret only after another part: MYSQL_PWD is a password, PWD alone the working directory.
_NOT_FIRST = frozenset({"PWD"})
# A part after the secret one that makes the name a place or a measure, not the secret itself.
_NOT_THE_VALUE = frozenset({"PATH", "FILE", "FILES", "DIR", "THROUGHPUT", "LEN", "LENGTH",
                            "COUNT", "SIZE", "THRESHOLD", "LATENCY", "WATERMARK", "METRICS",
                            "MAP", "ID", "IDS", "JAR", "STDIN"})
# A part before the secret one that makes it a unit ("--kt-max-deferred-experts-per-token",
# "--bucket-time-to-first-token"): a measure, not the secret.
_UNIT_OF = frozenset({"PER", "FIRST", "LAST", "NEXT", "EACH"})
_SPLIT = re.compile(r"[_\-.]+")

# Lookbehinds make each pattern start only at the beginning of a word: without them, every
# position inside a long word is a new start and the scan is quadratic.
# A password may hold "/" (generated ones do); the bound keeps a text of many "://"s linear.
_URL_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)"
    r"(?:[^\s/]+|[^\s@]{1,256}?)@")
# A web URL's userinfo without a colon is a token (https://TOKEN@github.com/...); other schemes'
# is a user name (ssh://git@host, postgresql://postgres@host) and stays.
_URL_TOKEN = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<head>(?i:https?|wss?|git\+https)://)[^\s:/@?#]+@")
# A DSN without a scheme: Go's MySQL driver (user:pw@tcp(host:3306)/db, user:pw@/db).
_DSN_PASSWORD = re.compile(
    r"(?<![\w.\-~%+:/@])(?P<head>[\w.\-~%+]+:)[^\s@/]{1,256}@(?=[A-Za-z0-9]*\(|/)")
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
_SECRET_WORDS = ("token", "secret", "pass", "pw", "credential", "key", "auth", "pat", "sig",
                 "cookie")
_ASSIGNMENT_TEMPLATE = (
    r"(?<![\w.\-])(?P<q>[\"']?)(?=-{{0,2}}[\w.\-]*(?i:{words}))"
    r"(?P<name>(?P<dash>-{{1,2}})?[A-Za-z_][\w.\-]*)(?P=q)"
    # "--name value" for options only ("the token was" is prose), and not "--name --next".
    r"(?:[ \t]*[=:][ \t]*(?=[^\s,;])|(?(dash)[ \t]+(?=[^\s,;\-])|(?!)))")
# An unquoted value ends at a blank or ";", and at "," only where a blank or the end follows
# (", " separates a printed dict's items; "a,b" is one value).
_VALUE = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'|\[[^\]\n]{0,256}\]|[^\s,;]+(?:,+[^\s,;]+)*")
# An option's value (--api-key X, --password=X) in a command line ends at a blank only.
_OPTION_VALUE = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'|[^\s,]+(?:,+[^\s,]+)*")
# A URL query's value ends at the next parameter (?sv=..&sig=SECRET&se=..).
_QUERY_VALUE = re.compile(r"[^\s&#,;'\"]+")


@functools.lru_cache(maxsize=8)
def _assignment_pattern(extra: frozenset[str]) -> re.Pattern[str]:
    words = [*_SECRET_WORDS, *(re.escape(n) for n in sorted(extra))]
    return re.compile(_ASSIGNMENT_TEMPLATE.format(words="|".join(words)))


def _redact_assignments(text: str, extra: frozenset[str]) -> str:
    pattern = _assignment_pattern(extra)
    out: list[str] = []
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        start = m.end()
        out.append(text[pos:start])
        name = m.group("name")
        value = None
        if _is_secret(name, extra) or _odbc_pwd(name, text, start):
            query = m.start() > 0 and text[m.start() - 1] in "?&" and not m.group("q")
            value = (_QUERY_VALUE if query else _OPTION_VALUE if m.group("dash") else
                     _VALUE).match(text, start)
        if value is None:
            pos = start
        else:
            out.append(REDACTED)
            pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def _odbc_pwd(name: str, text: str, start: int) -> bool:
    """``Pwd=VALUE`` of an ODBC connection string (``...;Uid=u;Pwd=SECRET;``); ``PWD=/home/x``
    is the shell's working directory, not a secret."""
    return name.upper() == "PWD" and text[start:start + 1] not in ("/", "~", "$", "")


# -- programs whose short flags carry a password --------------------------------------------------
#
# A flag that is a password only for one program (``mysql -pSECRET``; ``docker run -p 8080:80``
# is a port): after a word naming the program, until a shell separator. ``glued``: the value
# follows the letter in the same word; ``apart``: the value is the next word.

@dataclass(frozen=True)
class _Rule:
    glued: str = ""
    apart: str = ""
    #: a subcommand that must come first (``docker login``)
    after: str | None = None
    #: the value is ``user:password``: only what follows the first colon is hidden
    userinfo: bool = False
    long: frozenset[str] = frozenset()


_MYSQL = _Rule(glued="p")
_RULES: dict[str, _Rule] = {
    "sshpass": _Rule(glued="p", apart="p"),
    **dict.fromkeys(("redis-cli", "valkey-cli", "keydb-cli"), _Rule(glued="a", apart="a")),
    **dict.fromkeys(("docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras",
                     "crane"), _Rule(glued="p", apart="p", after="login")),
    **dict.fromkeys(("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport",
                     "mongoimport", "mongostat", "mongotop", "mongofiles"),
                    _Rule(glued="p", apart="p")),
    **dict.fromkeys(("ldapsearch", "ldapmodify", "ldapadd", "ldapdelete", "ldapwhoami",
                     "ldappasswd", "ldapcompare", "ldapmodrdn", "ldapexop"),
                    _Rule(glued="w", apart="w")),
    **dict.fromkeys(("sqlcmd", "bcp"), _Rule(glued="P", apart="P")),
    **dict.fromkeys(("curl", "wget"), _Rule(glued="uU", apart="uU", userinfo=True,
                                            long=frozenset({"--user", "--proxy-user"}))),
}
#: Substrings of a text that may name one of the programs (cheap tests before a word scan).
_PROGRAM_HINTS = ("mysql", "mariadb", "sshpass", "-cli", "login", "mongo", "ldap", "sqlcmd",
                  "bcp", "curl", "wget")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "\n"})


def _rule_of(word: str) -> _Rule | None:
    base = word.strip("'\"`$(){}").rsplit("/", 1)[-1].lower().removesuffix(".exe")
    if not base or len(base.split(None, 1)) > 1:
        return None
    if base.startswith(("mysql", "mariadb")):
        return _MYSQL
    return _RULES.get(base)


def _flag_values(words: Sequence[str]) -> list[tuple[int, int]]:
    """``(index, offset)`` of every word of ``words`` whose text from ``offset`` on is a
    program's password (see :data:`_RULES`)."""
    hits: list[tuple[int, int]] = []
    if not any(map(" ".join(words).lower().__contains__, _PROGRAM_HINTS)):
        return hits
    rule: _Rule | None = None
    armed = False
    pending: str | None = None  # "value": the next word is a value; "user": user:password
    for i, word in enumerate(words):
        bare = word.lstrip("'\"`")
        quote = len(word) - len(bare)
        if pending is not None:
            # A required argument (getopt): the next word, even one that starts with "-".
            kind, pending = pending, None
            if bare:
                if kind == "user":
                    _after_colon(bare, quote, 0, i, hits)
                else:
                    hits.append((i, 0))
                if word.endswith(";"):
                    rule, armed = None, False
                continue
        if word in _SEPARATORS:
            rule, armed = None, False
            continue
        found = _rule_of(word)
        if found is not None:
            rule, armed = found, found.after is None
        elif rule is not None and not armed:
            armed = bare == rule.after
        elif rule is not None:
            pending = _flag(rule, bare, quote, i, hits)
        if word.endswith(";") and pending is None:
            rule, armed = None, False
    return hits


def _after_colon(word: str, quote: int, start: int, index: int,
                 hits: list[tuple[int, int]]) -> None:
    """``user:password`` from ``start``: the password is hidden (a bare user is not a secret;
    curl then asks for the password)."""
    colon = word.find(":", start)
    if colon >= 0 and colon + 1 < len(word):
        hits.append((index, quote + colon + 1))


def _flag(rule: _Rule, bare: str, quote: int, index: int,
          hits: list[tuple[int, int]]) -> str | None:
    """One word after a program: its password (added to ``hits``), or what the next word is
    (``"value"``, ``"user"``), or ``None``."""
    if rule.userinfo and bare.startswith("--"):
        name, eq, _ = bare.partition("=")
        if name in rule.long:
            if not eq:
                return "user"
            _after_colon(bare, quote, len(name) + 1, index, hits)
        return None
    if len(bare) < 2 or bare[0] != "-" or bare[1] == "-":
        return None
    letter = bare[1]
    if len(bare) == 2:
        if letter in rule.apart:
            return "user" if rule.userinfo else "value"
    elif letter in rule.glued:
        if rule.userinfo:
            _after_colon(bare, quote, 2, index, hits)
        else:
            hits.append((index, quote + 2))
    return None


_WORD = re.compile(r"\S+")
#: What the name of ``NAME=value`` / ``--name=value`` in a command line looks like (not a URL).
_NAME = re.compile(r"-{0,2}[A-Za-z_][\w.\-]*")
# A quoted value may span words ('my secret'): at most this many more words are taken.
_QUOTED_WORDS = 8


def _redact_programs(text: str) -> str:
    """:func:`_flag_values` on the words of a free text (a shell command)."""
    matches = list(_WORD.finditer(text))
    hits = _flag_values([m.group() for m in matches])
    if not hits:
        return text
    out: list[str] = []
    pos = 0
    for index, offset in hits:
        m = matches[index]
        if m.start() < pos:
            continue
        start, end = m.start() + offset, m.end()
        value = m.group()[offset:]
        quote = value[:1] if value[:1] in ("'", '"') else ""
        if quote and (len(value) == 1 or not value.endswith(quote)):
            for later in matches[index + 1:index + 1 + _QUOTED_WORDS]:
                end = later.end()
                if later.group().endswith(quote):
                    break
        out.append(text[pos:start])
        out.append(REDACTED)
        pos = end
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
    last = -1
    for i, part in enumerate(parts):
        if (part in _EXACT or part.endswith(_WORDS) or (i and part in _NOT_FIRST)) and \
                not (i and parts[i - 1] in _UNIT_OF):
            last = i
    return last >= 0 and not any(part in _NOT_THE_VALUE for part in parts[last + 1:])


def is_secret_name(name: str) -> bool:
    """Whether an environment variable or flag name (``HF_TOKEN``, ``--api-key``) names a secret."""
    return _is_secret(str(name), _extra_names())


def redact_url(url: str) -> str:
    """``postgresql://user:pw@host/db`` -> ``postgresql://user:***@host/db`` (any URL in the
    text)."""
    return _redact_urls(str(url))


def _hide_head(m: re.Match[str]) -> str:
    return m.group("head") + REDACTED + "@"


def _redact_urls(text: str) -> str:
    """URL passwords, web URLs' tokens (``https://TOKEN@host``) and DSN passwords
    (``user:pw@tcp(host)/db``)."""
    if "@" not in text:
        return text
    if "://" in text:
        text = _URL_PASSWORD.sub(_hide_head, text)
        text = _URL_TOKEN.sub(_hide_head, text)
    if "@/" in text or "(" in text:
        text = _DSN_PASSWORD.sub(_hide_head, text)
    return text


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
    words = [str(a) for a in argv]
    hits = dict(_flag_values(words))
    extra = _extra_names()  # once per command line, not per word
    out: list[str] = []
    hide_next = False
    for i, arg in enumerate(words):
        if i in hits:
            offset = hits[i]
            out.append(arg[:offset] + REDACTED)
            hide_next = False
            continue
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(REDACTED if arg else arg)
                continue
        if arg.startswith("-") and "=" not in arg and _is_secret(arg, extra):
            hide_next = True
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if eq and value and _NAME.fullmatch(name) and _is_secret(name, extra):
            out.append(f"{name}={REDACTED}")
            continue
        out.append(_redact_text(arg, extra))
    return out


def redact_text(text: str) -> str:
    """Free text (a log line, a detail, a shell command, a printed argument list) with URL
    passwords, authorization headers and ``NAME=value`` / ``'name': 'value'`` / ``--name
    value`` / ``name: value`` assignments of secret names replaced."""
    if not text:
        return text
    return _redact_text(str(text), _extra_names())


def _redact_text(text: str, extra: frozenset[str]) -> str:
    if not text:
        return text
    # Substring tests (C speed) skip the regular expressions on text that cannot match them.
    text = _redact_urls(text)
    low = text.lower()
    if any(map(low.__contains__, _PROGRAM_HINTS)):
        text = _redact_programs(text)
    if "authorization" in low or "bearer" in low or "basic" in low:
        text = _AUTH_HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    if any(map(low.__contains__, _SECRET_WORDS)) or any(n.lower() in low for n in extra):
        text = _redact_assignments(text, extra)
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
        if "@" not in s:
            return
        for pattern in (_URL_PASSWORD, _URL_TOKEN, _DSN_PASSWORD):
            for m in pattern.finditer(s):
                found.add(m.group(0)[len(m.group("head")):-1])

    def walk(v: Any, secret: bool, argv: bool = False) -> None:
        if isinstance(v, Mapping):
            for k, item in v.items():
                walk(item, secret or (isinstance(k, str) and is_secret_name(k)),
                     isinstance(k, str) and k in ARGV_KEYS)
        elif isinstance(v, (list, tuple)):
            strings = argv and all(isinstance(x, str) for x in v)
            if strings and not secret:
                found.update(v[i][offset:].strip("'\"") for i, offset in _flag_values(v))
            for i, item in enumerate(v):
                walk(item, secret)
                if strings and not secret:
                    if item.startswith("-") and "=" not in item and is_secret_name(item) and \
                            i + 1 < len(v) and not v[i + 1].startswith("-"):
                        found.add(v[i + 1])
                    name, eq, rest = item.partition("=")
                    if eq and rest and _NAME.fullmatch(name) and is_secret_name(name):
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
