"""Secrets kept out of what cleanslate writes and prints.

A serving host is full of secrets that are not ours: ``HF_TOKEN`` in a run's environment, a
server's ``--api-key``, a store URL's password, another user's ``curl -H 'Authorization: Bearer
...'``. Everything that leaves a process as a record (the store, ``--json``, reports, run folders,
progress lines) goes through the functions here first. A list of spellings is never finished,
so the rule is by structure, and where it can be, inverted (docs/security.md):

- **environments keep only what is known harmless**: a value is kept when its name is a knob
  the engines and their runtimes read (:data:`KNOWN_ENV`, :data:`KNOWN_ENV_PREFIXES`:
  ``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, ``VLLM_*``, ``SGLANG_*``, ``LLAMA_ARG_*``, ``HF_HOME``,
  ``PATH``...) or it is a number, a switch word, a path or a few short words
  (:func:`is_harmless_value`), and the name is not a secret's; every other value is ``***``
  (``SLACK_WEBHOOK_URL``, a JSON blob, a connection string, a generated password under any
  name);
- **shapes that are credentials whatever names them**: private key blocks (``-----BEGIN ...
  PRIVATE KEY-----``), JWTs (``eyJ...``.``...``.``...``), long random tokens
  (:func:`looks_like_token`: entropy, class changes, no words; hex digests are evidence and
  stay), URL passwords (``scheme://user:PASSWORD@host``), the userinfo of a web URL
  (``https://TOKEN@github.com``), a schemeless DSN's password (``user:PASSWORD@tcp(host)/db``),
  secret query parameters (``?sig=``, ``X-Amz-Signature=``, ``token=``), what follows
  ``Bearer`` or ``Basic`` and an ``Authorization:`` header's credentials;
- **secret names**: an environment variable, flag, JSON key or ``key=value`` item whose name,
  split on ``_``, ``-`` and ``.``, has a part that is or ends with ``TOKEN``, ``SECRET``,
  ``PASSWORD``, ``PASSWD``, ``CREDENTIAL(S)``, ``APIKEY``, ``ACCESSKEY``, ``PRIVATEKEY``,
  ``SECRETKEY``, ``ACCOUNTKEY``, ``PASSPHRASE``, ``COOKIE``, ``SIGNATURE``, ``JWT``, ``OAUTH``,
  ``WEBHOOK``... or is ``KEY``, ``AUTH``, ``PASS``, ``PW``, ``PAT``, ``SIG``, ``DSN``,
  ``BEARER``, or ``PWD`` after another part, unless a later part names a place or a measure
  (``PATH``, ``FILE``, ``THROUGHPUT``, ``ID``, ``BUDGET``, ``CONFIG``...: ``HF_TOKEN_PATH``,
  ``--api-key-file``) or the part before it makes it a unit or a special token (``PER``,
  ``FIRST``, ``BOS``, ``EOS``: ``--kt-max-deferred-experts-per-token``,
  ``tokenizer.ggml.add_bos_token``); or a name listed in ``CLEANSLATE_SECRET_NAMES``;
- **option names that may hold one** (a part of ``pass``, ``pwd``, ``secret``, ``token``,
  ``key``, ``auth``, ``cred``, ``cookie``, ``jwt``: ``--authkey``, ``-storepass``): the value is
  kept only when harmless (``--tokenizer org/model``, ``--max-num-batched-tokens 8192``);
- **positions**: ``set``/``config NAME VALUE`` for a secret NAME (``aws configure set
  aws_secret_access_key V``, ``git config credential.password V``), and the passwords of
  programs that take one in a short flag or a position, after a word naming the program:
  ``mysql -pSECRET``, ``sshpass -p``, ``redis-cli -a``, ``docker``/``az login -p``, ``mongosh
  -p``, ``ldapsearch -w``, ``sqlcmd -P``, ``curl -u user:SECRET``, ``smbclient -U
  user%SECRET``, ``lftp -u user,SECRET``, ``openssl -k``/``-K``, ``zip -P``, ``7z -pSECRET``,
  ``htpasswd -b FILE USER SECRET``, ``vault login TOKEN``, ``wandb login KEY``, ``sqlplus
  user/SECRET@db``.

Values are replaced by :data:`REDACTED`; names stay, so a reader still sees *that* a token was
set. The functions never raise on any text and never return the secret. Every pattern starts
only at the beginning of a word, so the cost is linear in the text's length (a process can
write a megabyte of argv, and every snapshot redacts every command line).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
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
          "SSHPASS", "JWT", "OAUTH", "OAUTH2", "WEBHOOK", "ACCOUNTKEY", "MASTERKEY",
          "SIGNINGKEY", "SHAREDKEY", "ENCRYPTIONKEY", "STOREPASS", "KEYPASS")
_EXACT = frozenset({"KEY", "AUTH", "PASS", "PW", "PAT", "SIG", "BEARER", "DSN", "SAS",
                    "PASSIN", "PASSOUT", "HMAC"})
# Secret only after another part: MYSQL_PWD is a password, PWD alone the working directory.
_NOT_FIRST = frozenset({"PWD"})
# A part after the secret one that makes the name a place or a measure, not the secret itself.
_NOT_THE_VALUE = frozenset({"PATH", "FILE", "FILES", "DIR", "THROUGHPUT", "LEN", "LENGTH",
                            "COUNT", "SIZE", "THRESHOLD", "LATENCY", "WATERMARK", "METRICS",
                            "MAP", "ID", "IDS", "JAR", "STDIN", "BUDGET", "BUDGETS", "POOL",
                            "CONFIG", "USAGE", "LIMIT", "TYPE", "MODE", "NUM", "RATIO",
                            "BUCKETS", "INDEX", "IDX"})
# A part before the secret one that makes it a unit ("--kt-max-deferred-experts-per-token",
# "--bucket-time-to-first-token"): a measure, not the secret.
# A special token's name is no secret either (GGUF's "tokenizer.ggml.add_bos_token", "eos_token").
_UNIT_OF = frozenset({"PER", "FIRST", "LAST", "NEXT", "EACH", "BOS", "EOS", "PAD", "UNK", "SEP",
                      "CLS", "MASK", "SPECIAL", "STOP", "OUTPUT", "INPUT"})
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
                 "cookie", "jwt", "webhook", "bearer", "dsn", "sas", "hmac")
_SECRET_HINTS = re.compile("|".join(_SECRET_WORDS))
_ASSIGNMENT_TEMPLATE = (
    r"(?<![\w.\-])(?P<q>[\"']?)(?=-{{0,2}}[\w.\-]*(?i:{words}))"
    r"(?P<name>(?P<dash>-{{1,2}})?[A-Za-z_][\w.\-]*)(?P=q)"
    # "--name value" for options only ("the token was" is prose), and not "--name --next".
    r"(?:[ \t]*[=:][ \t]*(?=[^\s,;])|(?(dash)[ \t]+(?=[^\s,;\-])|(?!)))")
# An unquoted value ends at a blank or ";", and at "," only where a blank or the end follows
# (", " separates a printed dict's items; "a,b" is one value).
_VALUE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|\[[^\]\n]{0,256}\]|[^\s,;]+(?:,+[^\s,;]+)*")
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
        secret = _is_secret(name, extra) or _odbc_pwd(name, text, start)
        # Option names that may hold a secret (--authkey X) only: in free text "x_tokens =
        # f(...)" is code in a traceback.
        if secret or (m.group("dash") and _secretish(name)):
            query = m.start() > 0 and text[m.start() - 1] in "?&" and not m.group("q")
            value = (_QUERY_VALUE if query else _OPTION_VALUE if m.group("dash") else
                     _VALUE).match(text, start)
            if value is not None and not secret and (
                    REDACTED in value.group() or
                    is_harmless_value(_unquoted(value.group().strip("()[]{}`").rstrip(".")))):
                value = None  # a name like "tokenizer" with a harmless value: kept
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
    #: the value is ``user<sep>password``: only what follows the first ``sep`` is hidden
    userinfo: bool = False
    sep: str = ":"
    long: frozenset[str] = frozenset()
    #: a positional argument is the secret: ``"first"`` (``vault login TOKEN``) or ``"last"``
    #: of two or more (``htpasswd -b FILE USER PASSWORD``), once :attr:`needs` was seen
    positional: str = ""
    #: a short flag letter that must have been given for :attr:`positional` (htpasswd's ``-b``)
    needs: str = ""


_MYSQL = _Rule(glued="p")
_SMB = _Rule(glued="U", apart="U", userinfo=True, sep="%", long=frozenset({"--user"}))
_ORACLE = _Rule(positional="first", userinfo=True, sep="/")
_RULES: dict[str, _Rule] = {
    "sshpass": _Rule(glued="p", apart="p"),
    **dict.fromkeys(("redis-cli", "valkey-cli", "keydb-cli"), _Rule(glued="a", apart="a")),
    **dict.fromkeys(("docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras",
                     "crane", "az"), _Rule(glued="p", apart="p", after="login")),
    **dict.fromkeys(("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport",
                     "mongoimport", "mongostat", "mongotop", "mongofiles"),
                    _Rule(glued="p", apart="p")),
    **dict.fromkeys(("ldapsearch", "ldapmodify", "ldapadd", "ldapdelete", "ldapwhoami",
                     "ldappasswd", "ldapcompare", "ldapmodrdn", "ldapexop"),
                    _Rule(glued="w", apart="w")),
    **dict.fromkeys(("sqlcmd", "bcp"), _Rule(glued="P", apart="P")),
    **dict.fromkeys(("curl", "wget"), _Rule(glued="uU", apart="uU", userinfo=True,
                                            long=frozenset({"--user", "--proxy-user"}))),
    **dict.fromkeys(("smbclient", "rpcclient", "smbcacls", "smbget", "smbtar", "smbmap",
                     "smbcquotas", "net", "mount.cifs"), _SMB),
    # lftp's own "open -u user,pw host" too (in lftp -e '...' and its scripts)
    **dict.fromkeys(("lftp", "open"), _Rule(glued="u", apart="u", userinfo=True, sep=",",
                                            long=frozenset({"--user"}))),
    "openssl": _Rule(apart="kK"),
    **dict.fromkeys(("zip", "unzip", "zipcloak"), _Rule(apart="P")),
    **dict.fromkeys(("7z", "7za", "7zr", "rar", "unrar"), _Rule(glued="p")),
    "htpasswd": _Rule(positional="last", needs="b"),
    "vault": _Rule(after="login", positional="first"),
    "wandb": _Rule(after="login", positional="first"),
    **dict.fromkeys(("sqlplus", "rman", "expdp", "impdp", "sqlldr"), _ORACLE),
}
#: Substrings of a text that may name one of the programs (cheap tests before a word scan).
_PROGRAM_HINTS = ("mysql", "mariadb", "sshpass", "-cli", "login", "mongo", "ldap", "sqlcmd",
                  "bcp", "curl", "wget", "smb", "client", "net", "cifs", "lftp", "open",
                  "zip", "7z", "rar", "htpasswd", "vault", "wandb", "sqlplus", "rman",
                  "expdp", "impdp", "sqlldr")
_HINTS = re.compile("|".join(map(re.escape, _PROGRAM_HINTS)))
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
    if not _HINTS.search(" ".join(words).lower()):
        return hits
    rule: _Rule | None = None
    armed = False
    pending: str | None = None  # "value": the next word is a value; "user": user:password
    positionals: list[int] = []
    flags_seen = ""

    def close() -> None:
        if rule is not None and rule.positional == "last" and len(positionals) >= 2 and \
                (not rule.needs or rule.needs in flags_seen):
            hits.append((positionals[-1], 0))

    for i, word in enumerate(words):
        bare = word.lstrip("'\"`")
        quote = len(word) - len(bare)
        if pending is not None:
            # A required argument (getopt): the next word, even one that starts with "-".
            kind, pending = pending, None
            if bare:
                if kind == "user" and rule is not None:
                    _after_sep(bare, quote, 0, i, hits, rule.sep)
                else:
                    hits.append((i, 0))
                if word.endswith(";"):
                    close()
                    rule, armed = None, False
                continue
        if word in _SEPARATORS:
            close()
            rule, armed = None, False
            continue
        found = _rule_of(word) if not armed or rule is None or not rule.positional else None
        if found is not None:
            close()
            rule, armed = found, found.after is None
            positionals, flags_seen = [], ""
        elif rule is not None and not armed:
            armed = bare == rule.after
        elif rule is not None:
            if bare.startswith("-") and len(bare) > 1:
                flags_seen += bare.lstrip("-") if not bare.startswith("--") else ""
                pending = _flag(rule, bare, quote, i, hits)
            elif rule.positional and bare and bare != "-" and "=" not in bare:
                positionals.append(i)
                if rule.positional == "first" and len(positionals) == 1:
                    if rule.userinfo:
                        _after_sep(bare, quote, 0, i, hits, rule.sep)
                    else:
                        hits.append((i, 0))
        if word.endswith(";") and pending is None:
            close()
            rule, armed = None, False
    close()
    return hits


def _after_sep(word: str, quote: int, start: int, index: int,
               hits: list[tuple[int, int]], sep: str = ":") -> None:
    """``user<sep>password`` from ``start``: the password is hidden (a bare user is not a
    secret; the program then asks for the password)."""
    at = word.find(sep, start)
    if at >= 0 and at + 1 < len(word):
        hits.append((index, quote + at + 1))


def _flag(rule: _Rule, bare: str, quote: int, index: int,
          hits: list[tuple[int, int]]) -> str | None:
    """One option word after a program: its password (added to ``hits``), or what the next
    word is (``"value"``, ``"user"``), or ``None``."""
    if rule.userinfo and bare.startswith("--"):
        name, eq, _ = bare.partition("=")
        if name in rule.long:
            if not eq:
                return "user"
            _after_sep(bare, quote, len(name) + 1, index, hits, rule.sep)
        return None
    if len(bare) < 2 or bare[0] != "-" or bare[1] == "-":
        return None
    letter = bare[1]
    if len(bare) == 2:
        if letter in rule.apart:
            return "user" if rule.userinfo else "value"
    elif letter in rule.glued:
        if rule.userinfo:
            _after_sep(bare, quote, 2, index, hits, rule.sep)
        else:
            hits.append((index, quote + 2))
    return None


_WORD = re.compile(r"\S+")
#: What the name of ``NAME=value`` / ``--name=value`` in a command line looks like (not a URL).
_NAME = re.compile(r"-{0,2}[A-Za-z_][\w.\-]*")
# A quoted value may span words ('my secret'): at most this many more words are taken.
_QUOTED_WORDS = 8


def _redact_programs(text: str) -> str:
    """:func:`_flag_values` on the words of each line of a free text (a shell command)."""
    if "\n" in text:
        return "".join(_redact_program_line(line) for line in text.splitlines(keepends=True))
    return _redact_program_line(text)


def _redact_program_line(text: str) -> str:
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


# -- values that are credentials whatever their name ----------------------------------------------
#
# A name says what a value is only when its writer chose a telling one; these shapes say it
# by themselves: a private key block, a JSON Web Token, a long random token.

_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY[A-Z ]{0,12}-----")
# header.payload[.signature...]: base64url JSON objects ("eyJ" is how '{"' starts).
_JWT = re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}"
                  r"(?:\.[A-Za-z0-9_\-]*)*")

#: A run of token characters (letters, digits, ``+ / _ ~ -``, ``=`` padding) at least this long
#: is examined as a possible random credential.
MIN_TOKEN_LEN = 20
#: Within a run, the pieces between ``-``, ``_`` and ``/`` at least this long are examined.
MIN_PIECE_LEN = 16
#: A piece is random when its Shannon entropy (bits per character) reaches this share of the
#: most its length allows (log2 of the length) ...
ENTROPY_RATIO = 0.75
#: ... its characters change class (lower, upper, digit) between neighbours at least this often
#: (``0.4`` for a piece without digits) ...
MIN_SWITCH_RATE = 0.25
#: ... and less than this share of it is made of words (camel-case or lower-case parts that
#: read like words, :func:`_word`: ``DeepseekV32ForCausalLM``, ``scheduler``).
MAX_WORD_SHARE = 0.5

_TOKEN_RUN = re.compile(rf"(?<![A-Za-z0-9+/_~\-])[A-Za-z0-9+/_~\-]{{{MIN_TOKEN_LEN},}}={{0,2}}")
_PIECE = re.compile(rf"[A-Za-z0-9+~]{{{MIN_PIECE_LEN},}}")
_HEX = re.compile(r"(?:0[xX])?(?:[0-9a-f]+|[0-9A-F]+)")
_WORDISH = re.compile(r"[A-Z]?[a-z]{2,}|[A-Z]{2,}(?![a-z])")
_CONSONANTS = re.compile(r"[bcdfghjklmnpqrstvwxz]{4,}")


def _class(ch: str) -> int:
    return 0 if ch.islower() else 1 if ch.isupper() else 2


def _random_piece(piece: str) -> bool:
    """Whether a piece of letters and digits looks generated rather than written (see
    :data:`ENTROPY_RATIO`). Hexadecimal is not: digests, commit ids, request and GPU ids,
    model revisions and cache names are hex and are evidence."""
    if _HEX.fullmatch(piece):
        return False
    alnum = [c for c in piece if c.isalnum()]
    if len(alnum) < MIN_PIECE_LEN:
        return False
    digits = any(c.isdigit() for c in alnum)
    upper = any(c.isupper() for c in alnum)
    lower = any(c.islower() for c in alnum)
    if digits + upper + lower < 2:
        return False
    switches = sum(_class(a) != _class(b) for a, b in itertools.pairwise(alnum))
    rate = switches / (len(alnum) - 1)
    if rate < MIN_SWITCH_RATE or (not digits and rate < 0.4):
        return False
    counts: dict[str, int] = {}
    for c in piece:
        counts[c] = counts.get(c, 0) + 1
    n = len(piece)
    entropy = -sum(k / n * math.log2(k / n) for k in counts.values())
    if entropy < ENTROPY_RATIO * math.log2(n):
        return False
    words = sum(len(w) for w in (m.group().lower() for m in _WORDISH.finditer(piece))
                if _word(w))
    return words < MAX_WORD_SHARE * n


def _word(part: str) -> bool:
    """A part that reads like a word: three letters or more, a fifth of them vowels, no four
    consonants in a row (``causal``, ``scheduler``; not ``xkqv``, ``bdfght``)."""
    vowels = sum(map(part.count, "aeiouy"))
    return len(part) >= 3 and vowels * 5 >= len(part) and not _CONSONANTS.search(part)


def looks_like_token(text: str) -> bool:
    """Whether ``text`` holds a long random token (an API key, a password generator's output,
    a base64 secret): a run of at least :data:`MIN_TOKEN_LEN` token characters with a piece
    that :func:`_random_piece` finds random."""
    return any(_token_run(m.group()) for m in _TOKEN_RUN.finditer(str(text)))


def _token_run(run: str) -> bool:
    return any(_random_piece(p) for p in _PIECE.findall(run.rstrip("=")))


def _hide_tokens(text: str) -> str:
    return _TOKEN_RUN.sub(lambda m: REDACTED if _token_run(m.group()) else m.group(), text)


def _hide_pem(text: str) -> str:
    """The body of every private key block (``-----BEGIN ... PRIVATE KEY-----``), up to its
    ``-----END`` line or, when cut off, the end of the text; the header and footer stay."""
    out: list[str] = []
    pos = 0
    while (i := text.find("-----BEGIN ", pos)) >= 0:
        m = _PEM_BEGIN.match(text, i)
        if m is None:
            out.append(text[pos:i + 11])
            pos = i + 11
            continue
        out.append(text[pos:m.end()])
        out.append(REDACTED)
        end = text.find("-----END ", m.end())
        pos = len(text) if end < 0 else end
    out.append(text[pos:])
    return "".join(out)


def _hide_shapes(text: str) -> str:
    """Private key blocks, JWTs and random tokens, whatever names them."""
    if "PRIVATE KEY" in text:
        text = _hide_pem(text)
    if "eyJ" in text:
        text = _JWT.sub(REDACTED, text)
    return _hide_tokens(text)


# -- values known to be harmless ------------------------------------------------------------------
#
# Environment variables are kept only when known to be harmless: the name is a knob the
# engines and their runtimes read (below), or the value is a number, a switch word, a path or a
# short word. Anything else, a name never seen with a value of any other shape, is hidden.

#: Environment variables whose values are kept (after the shape checks above): what the engine
#: adapters set and read, the runtimes under them, and the shell's own.
KNOWN_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_DISABLE_TELEMETRY", "HF_ENDPOINT", "HF_MODULES_CACHE",
    "TRANSFORMERS_CACHE", "TRANSFORMERS_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "USER",
    "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "PWD", "OLDPWD", "HOSTNAME",
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
    "LOCAL_WORLD_SIZE", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "NO_PROXY",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NUMEXPR_MAX_THREADS", "RAY_ADDRESS",
    "TIKTOKEN_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "XLA_FLAGS", "SHLVL",
})
#: Prefixes of knob families (``NCCL_SOCKET_IFNAME``, ``VLLM_ATTENTION_BACKEND``,
#: ``SGLANG_ENABLE_JIT_DEEPGEMM``, llama.cpp's ``LLAMA_ARG_CTX_SIZE``). A name of the family
#: that is a secret name (``VLLM_API_KEY``, ``LLAMA_ARG_API_KEY``) is still hidden.
KNOWN_ENV_PREFIXES = ("NCCL_", "VLLM_", "SGLANG_", "SGL_", "LLAMA_ARG_", "GGML_", "CUDA_",
                      "NVIDIA_", "CUBLAS_", "CUDNN_", "TORCH_", "TORCHINDUCTOR_", "TRITON_",
                      "OMP_", "KMP_", "MKL_", "GLOO_", "UCX_", "NVSHMEM_", "FLASHINFER_",
                      "TRTLLM_", "TLLM_", "HIP_", "ROCM_", "HSA_", "MIOPEN_", "LC_", "XDG_",
                      "SLURM_", "CLEANSLATE_", "OTEL_SERVICE_", "MALLOC_")

_NUMBER = re.compile(r"[-+]?(?:\d{1,20}(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3})?")
# A path: no scheme, no userinfo, no blank; PATH-like lists of them too.
_PATH = re.compile(r"(?:~|\.{1,2})?/[\w.+\-~/:,@%=]{0,1024}|[\w.\-]+(?:/[\w.+\-~]+)+/?")
# Short words and lists of them: "bfloat16", "eth0,eth1", "expandable_segments:True", "0,1".
_WORD_ITEM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-]{0,31}")
_ITEM_SPLIT = re.compile(r"[,:;=]")
_MAX_ITEM_SWITCHES = 4


def _plain_word(item: str) -> bool:
    """A word like ``bfloat16``, ``fp8_e4m3``, ``eth0``, ``INFO``; not ``S3cr3tPw0rd`` (more
    than :data:`_MAX_ITEM_SWITCHES` changes between letters and digits in one part)."""
    if not _WORD_ITEM.fullmatch(item):
        return False
    for part in re.split(r"[_.\-+]", item):
        kinds = [c.isdigit() for c in part if c.isalnum()]
        if sum(a != b for a, b in itertools.pairwise(kinds)) > _MAX_ITEM_SWITCHES:
            return False
        if len(part) >= 8 and any(c.isupper() for c in part[1:]) and \
                any(c.isdigit() for c in part):
            return False  # mixed case and digits in one part: generated, not a word
    return True


def is_harmless_value(value: str) -> bool:
    """Whether a value of an unknown variable or option is kept by its shape: empty, a number,
    a path (``/a/b``, ``./x``, ``org/model``, ``/a:/b``; no ``://``), or up to 16 short words
    (``true``, ``bfloat16``, ``eth0,eth1``, ``expandable_segments:True``; not free text with
    blanks). The shape checks
    (:func:`looks_like_token`, private keys, JWTs) come first, and a value holding ``***`` was
    already judged."""
    value = str(value)
    if not value or _NUMBER.fullmatch(value):
        return True
    if "://" in value or len(value) > 1024 or value != value.strip():
        return False
    if _PATH.fullmatch(value) and "@" not in value.split("/", 1)[0]:
        return True
    items = [i for i in _ITEM_SPLIT.split(value) if i]
    return len(value) <= 128 and 0 < len(items) <= 16 and all(map(_plain_word, items))


def _harmless_option(value: str) -> bool:
    """An option's value kept by its shape (:func:`is_harmless_value`), or a JSON object or
    list in which redaction found nothing (``--tokenizer-pool-extra-config '{"x": 1}'``: a
    secret key in it was already hidden, and ``***`` makes it not harmless)."""
    if is_harmless_value(value):
        return True
    if value[:1] not in ("{", "[") or REDACTED in value or len(value) > 65536:
        return False
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def is_known_env(name: str) -> bool:
    """Whether an environment variable is a knob whose value is kept (:data:`KNOWN_ENV`,
    :data:`KNOWN_ENV_PREFIXES`) unless the name is a secret's."""
    upper = str(name).upper()
    return (upper in KNOWN_ENV or upper.startswith(KNOWN_ENV_PREFIXES)) and \
        not is_secret_name(name)


# A part of an option's name that says its value may be one even where the name rule does not
# (``--authkey``, ``-storepass``, ``--keyring-pw``): such a value is kept only when harmless.
_SECRETISH = ("pass", "pwd", "secret", "token", "key", "auth", "cred", "cookie", "jwt")


_SECRETISH_RE = re.compile("|".join(_SECRETISH), re.IGNORECASE)


def _secretish(name: str) -> bool:
    return _SECRETISH_RE.search(name) is not None


def _scalar_secret(value: Any) -> bool:
    """Whether a value under a secret name is worth hiding (not unset, not a switch)."""
    return value not in (None, True, False, "")


def _env_value(name: str, value: str, scrub: Scrubber | None = None) -> str:
    """An environment variable's value as it is kept: hidden under a secret name; else with
    URL passwords, private keys, JWTs and tokens hidden, and kept only when the name is a known
    knob (:func:`is_known_env`) or the value harmless (:func:`is_harmless_value`)."""
    if not value:
        return value
    if is_secret_name(name):
        return REDACTED
    shown = scrub(value) if scrub is not None else redact_text(value)
    if shown is None:
        return value
    return shown if is_known_env(name) or is_harmless_value(shown) else REDACTED


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` in which a value is kept only when known to be harmless: a known
    knob's (:data:`KNOWN_ENV`) or a number, switch word, path or short word under any name that
    is not a secret's, each without a URL password, private key, JWT or token in it; every other
    value is ``***``."""
    return {k: _env_value(str(k), str(v)) for k, v in env.items()}


def _hide_unless_harmless(value: Any) -> Any:
    """A value under a name that may hold a secret (:data:`_SECRETISH`): strings kept only
    when harmless after redaction; numbers, switches and ``None`` kept."""
    if isinstance(value, Mapping):
        return {k: _hide_unless_harmless(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hide_unless_harmless(v) for v in value]
    if isinstance(value, str):
        shown = redact_text(value)
        return shown if _harmless_option(shown) else REDACTED
    return value


def redact_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of engine flags (``{api-key: sk-..}``) with secret values replaced (a list of
    them element by element), values of names that may hold one (``authkey``) kept only when
    harmless, and secrets in the text of the others."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        if is_secret_name(str(key)):
            out[key] = _hide_all(value)
        elif _secretish(str(key)):
            out[key] = _hide_unless_harmless(value)
        else:
            out[key] = redact_data(value)
    return out


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of a command line with secret values replaced: ``--api-key X``, ``--api-key=X``,
    ``HF_TOKEN=X``, ``set aws_secret_access_key X`` (a secret name as a word, then its value),
    the passwords of programs that take one in a short flag or a position (:data:`_RULES`),
    values of options whose name may hold a secret (``--authkey X``) unless harmless, and in
    every word URL passwords, authorization headers, private keys, JWTs and tokens. The word
    after a secret flag is taken as its value unless it is itself an option (starts with
    ``-``)."""
    words = [str(a) for a in argv]
    hits = dict(_flag_values(words))
    extra = _extra_names()  # once per command line, not per word
    out: list[str] = []
    hide_next = False
    unless_harmless = False
    for i, arg in enumerate(words):
        if i in hits:
            offset = hits[i]
            out.append(arg[:offset] + REDACTED)
            hide_next = unless_harmless = False
            continue
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                shown = _redact_text(arg, extra)
                out.append(REDACTED if arg and not (
                    unless_harmless and _harmless_option(_unquoted(shown))) else shown)
                unless_harmless = False
                continue
            unless_harmless = False
        if arg.startswith("-") and "=" not in arg and len(arg) > 1:
            if _is_secret(arg, extra):
                hide_next = True
                out.append(arg)
                continue
            if _NAME.fullmatch(arg) and _secretish(arg):
                hide_next = unless_harmless = True
                out.append(arg)
                continue
        name, eq, value = arg.partition("=")
        if eq and value and _NAME.fullmatch(name):
            if _is_secret(name, extra):
                out.append(f"{name}={REDACTED}")
                continue
            if name.startswith("-") and _secretish(name):
                shown = _redact_text(value, extra)
                out.append(f"{name}={shown if _harmless_option(_unquoted(shown)) else REDACTED}")
                continue
        if i and not arg.startswith("-") and _NAME.fullmatch(arg) and \
                (arg != arg.lower() or any(c in arg for c in "_.-")) and \
                _is_secret(arg, extra) and i + 1 < len(words) and \
                words[i + 1] and not words[i + 1].startswith("-"):
            hide_next = True  # aws configure set aws_secret_access_key VALUE
        out.append(_redact_text(arg, extra))
    return out


def redact_text(text: str) -> str:
    """Free text (a log line, a detail, a shell command, a printed argument list) with URL
    passwords, authorization headers, private keys, JWTs, random tokens, program passwords and
    ``NAME=value`` / ``'name': 'value'`` / ``--name value`` / ``name: value`` / ``set NAME
    value`` assignments of secret names replaced."""
    if not text:
        return text
    return _redact_text(str(text), _extra_names())


# "aws configure set NAME VALUE", "git config --global NAME VALUE" in free text.
_SET_NAME = re.compile(r"(?<![\w.\-])(?i:set|config)(?:[ \t]+--?[\w\-]+)*"
                       r"[ \t]+(?P<name>[A-Za-z_][\w.\-]*)[ \t]+(?=[^\s\-])")


def _redact_text(text: str, extra: frozenset[str]) -> str:
    if not text:
        return text
    # Substring tests (C speed) skip the regular expressions on text that cannot match them.
    text = _hide_shapes(_redact_urls(text))
    low = text.lower()
    if _HINTS.search(low):
        text = _redact_programs(text)
    if "authorization" in low or "bearer" in low or "basic" in low:
        text = _AUTH_HEADER.sub(_hide_credentials, text)
    if _SECRET_HINTS.search(low) or any(n.lower() in low for n in extra):
        text = _redact_assignments(text, extra)
        if "set" in low or "config" in low:
            text = _redact_set_names(text, extra)
    return text


# What follows a bare "Bearer" or "Basic" (not an Authorization header) that is not their
# credential but the start of an option or an assignment ("BEARER --HF_TOKEN x", "Bearer
# HF_TOKEN: x", "Basic f(api_key='x')"): left for the assignment pass, which hides its value
# (hiding the name here would keep the value).
_NOT_A_CREDENTIAL = re.compile(r"-{1,2}[A-Za-z]|.*[=:(]\Z", re.S)
_ASSIGNED_NEXT = re.compile(r"[ \t]*[=:]")


def _hide_credentials(m: re.Match[str]) -> str:
    head = m.group("head")
    value = m.group(0)[len(head):]
    if "authorization" not in head.lower() and (
            _NOT_A_CREDENTIAL.match(value) or _ASSIGNED_NEXT.match(m.string, m.end())):
        return m.group(0)
    return m.group("head") + REDACTED


def _redact_set_names(text: str, extra: frozenset[str]) -> str:
    """The value after ``set NAME`` where NAME is a secret's (``aws configure set
    aws_secret_access_key VALUE``, ``npm config set _authToken VALUE``)."""
    out: list[str] = []
    pos = 0
    while (m := _SET_NAME.search(text, pos)) is not None:
        out.append(text[pos:m.end()])
        pos = m.end()
        if _is_secret(m.group("name"), extra):
            value = _OPTION_VALUE.match(text, pos)
            if value is not None and value.end() > pos:
                out.append(REDACTED)
                pos = value.end()
    out.append(text[pos:])
    return "".join(out)


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
#: Keys whose mapping of strings is an environment (values kept only when known harmless:
#: :func:`redact_env`).
ENV_KEYS = frozenset({"env", "environ", "environment"})


def redact_data(value: Any, scrub: Scrubber | None = None, *, argv: bool = False) -> Any:
    """A copy of a JSON-like document (records, specs, check documents) with no secret: values
    under secret names hidden (all of their scalars), mappings under :data:`ENV_KEYS` kept only
    where known harmless (:func:`redact_env`), lists of strings under :data:`ARGV_KEYS`
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
            elif isinstance(k, str) and k in ENV_KEYS and isinstance(v, Mapping):
                out[key] = {redact_data(name, scrub) if isinstance(name, str) else name:
                            _env_value(name, item, scrub)
                            if isinstance(name, str) and isinstance(item, str)
                            else redact_data(item, scrub)
                            for name, item in v.items()}
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
    its own ``--api-key``): values under secret names, environment values the environment rule
    hides (under :data:`ENV_KEYS`), what :func:`redact_argv` hides of a command line (a list of
    strings under :data:`ARGV_KEYS`), and URL passwords in any string. Values shorter than
    :data:`MIN_SCRUB_LEN` are left out."""
    found: set[str] = set()

    def text(s: str) -> None:
        if "@" not in s:
            return
        for pattern in (_URL_PASSWORD, _URL_TOKEN, _DSN_PASSWORD):
            for m in pattern.finditer(s):
                found.add(m.group(0)[len(m.group("head")):-1])

    def walk(v: Any, secret: bool, argv: bool = False, env: bool = False) -> None:
        if isinstance(v, Mapping):
            for k, item in v.items():
                if env and isinstance(k, str) and isinstance(item, str) and not secret and \
                        _env_value(k, item) == REDACTED:
                    found.add(item)  # hidden by the environment rule: look for it elsewhere
                walk(item, secret or (isinstance(k, str) and is_secret_name(k)),
                     isinstance(k, str) and k in ARGV_KEYS,
                     isinstance(k, str) and k in ENV_KEYS)
        elif isinstance(v, (list, tuple)):
            strings = argv and all(isinstance(x, str) for x in v)
            if strings and not secret:
                for before, after in zip(v, redact_argv(v), strict=True):
                    found.update(_hidden_part(before, after))
            for item in v:
                walk(item, secret)
        elif isinstance(v, str):
            if secret:
                found.add(v)
            text(v)
        elif secret and isinstance(v, (int, float)) and not isinstance(v, bool):
            found.add(str(v))

    walk(value, False)
    return {v for v in found if len(v) >= MIN_SCRUB_LEN and v != REDACTED}


def _hidden_part(before: str, after: str) -> list[str]:
    """What of ``before`` its redaction ``after`` hid, when it hid one part (the whole word, or
    the rest after a kept prefix: ``-p***``, ``user:***``, ``NAME=***``)."""
    if before == after:
        return []
    if after == REDACTED:
        return [before.strip("'\"")]
    if after.endswith(REDACTED) and before.startswith(after[:-len(REDACTED)]):
        return [before[len(after) - len(REDACTED):].strip("'\"")]
    return []


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
    "ENV_KEYS",
    "KNOWN_ENV",
    "KNOWN_ENV_PREFIXES",
    "MIN_SCRUB_LEN",
    "REDACTED",
    "SECRET_NAMES_ENV",
    "Scrubber",
    "is_harmless_value",
    "is_known_env",
    "is_secret_name",
    "looks_like_token",
    "redact_argv",
    "redact_data",
    "redact_env",
    "redact_flags",
    "redact_text",
    "redact_url",
    "secret_values",
]
