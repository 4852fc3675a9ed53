"""cleanslate.redact: secret names, values in argv, env, flags, free text and documents; the cost
is linear in the text, and no function raises or returns a secret it was shown."""

from __future__ import annotations

import json
import re
import string
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cleanslate.redact import (
    REDACTED,
    SECRET_NAMES_ENV,
    Scrubber,
    is_secret_name,
    looks_like_token,
    redact_argv,
    redact_data,
    redact_env,
    redact_flags,
    redact_text,
    redact_url,
    secret_values,
)

# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY",
    "PGPASSWORD", "MYSQL_PWD_PASSWD", "--api-key", "--hf-token", "--admin-api-key", "api_key",
    "X-Api-Key", "SECRET_KEY_BASE", "GOOGLE_APPLICATION_CREDENTIALS", "--password", "auth",
    "pw", "--pass", "WANDB_APIKEY", "db.password", "hf_token",
])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "TOKENIZERS_PARALLELISM", "--max-num-batched-tokens", "--ssl-keyfile", "--tokenizer",
    "total_token_throughput", "HF_TOKEN_PATH", "--api-key-file", "--ssl-key-file",
    "total_output_tokens", "sid", "pgid", "marker", "--port", "MONKEY", "", "-", "--",
    "--kv-cache-dtype", "--max-prefill-tokens", "keyword", "passage",
    # SGLang tunables whose names hold TOKEN or PASS before a measure (a study may search them)
    "--tbo-token-distribution-threshold", "--prefill-delayer-token-usage-low-watermark",
    "--bucket-inter-token-latency", "--enable-forward-pass-metrics",
    # a level's GPU energy per output token (bench's GpuTelemetry): stored as "***" it made the
    # trial record unreadable
    "joules_per_output_token", "input_token",
])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_user_listed_names_are_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not is_secret_name("MY_VAR")
    monkeypatch.setenv(SECRET_NAMES_ENV, " my-var , --other_flag")
    assert is_secret_name("MY_VAR") and is_secret_name("--my-var")
    assert is_secret_name("OTHER_FLAG") and is_secret_name("--other-flag")
    assert redact_text("MY_VAR=s3cr3tv4lue") == f"MY_VAR={REDACTED}"
    assert redact_argv(["x", "--my-var", "v4lue"]) == ["x", "--my-var", REDACTED]


# -- values ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://u:hunter2@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql+psycopg://u:p@ss@h/db", "postgresql+psycopg://u:***@h/db"),
    ("redis://:pw123@cache:6379/0", "redis://:***@cache:6379/0"),
    ("http://host:8000/v1/models", "http://host:8000/v1/models"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("see https://a:b@c.d and ftp://x:y@z", "see https://a:***@c.d and ftp://x:***@z"),
])
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_env_and_flags() -> None:
    env = {"HF_TOKEN": "hf_abc123", "PATH": "/usr/bin", "EMPTY_TOKEN": "",
           "DATABASE_URL": "postgresql://u:pw@h/db"}
    # An unknown name keeps no URL (a webhook's path is its secret); a known knob keeps its
    # value with the URL password hidden.
    assert redact_env({**env, "HTTPS_PROXY": "http://u:pw@proxy:3128"}) == {
        "HF_TOKEN": REDACTED, "PATH": "/usr/bin", "EMPTY_TOKEN": "", "DATABASE_URL": REDACTED,
        "HTTPS_PROXY": "http://u:***@proxy:3128"}
    flags = {"api-key": ["sk-1", "sk-2"], "hf-token": 123456, "enable-auth": True,
             "port": 8000, "model": "m", "password": None, "env": {"HF_TOKEN": "hf_x"}}
    assert redact_flags(flags) == {"api-key": [REDACTED, REDACTED], "hf-token": REDACTED,
                                   "enable-auth": True, "port": 8000, "model": "m",
                                   "password": None, "env": {"HF_TOKEN": REDACTED}}


@pytest.mark.parametrize(("argv", "expected"), [
    (["vllm", "serve", "m", "--api-key", "sk-x", "--port", "8"],
     ["vllm", "serve", "m", "--api-key", REDACTED, "--port", "8"]),
    (["x", "--hf-token=hf_y", "HF_TOKEN=z"], ["x", f"--hf-token={REDACTED}",
                                             f"HF_TOKEN={REDACTED}"]),
    (["x", "--api-key", "--port", "8"], ["x", "--api-key", "--port", "8"]),
    (["x", "--api-key"], ["x", "--api-key"]),
    (["x", "--api-key", ""], ["x", "--api-key", ""]),
    # A process that rewrote its argv as one string (setproctitle).
    (["python -m sglang.launch_server --api-key sk-abc --port 30000"],
     [f"python -m sglang.launch_server --api-key {REDACTED} --port 30000"]),
    (["python s.py --api-key=sk-abc"], [f"python s.py --api-key={REDACTED}"]),
    (["curl", "-H", "Authorization: Bearer abc.def", "-H", "X-Api-Key: k123"],
     ["curl", "-H", f"Authorization: Bearer {REDACTED}", "-H", f"X-Api-Key: {REDACTED}"]),
    (["psql", "postgresql://u:pw@h/db"], ["psql", "postgresql://u:***@h/db"]),
    (["x", "--ssl-keyfile", "/k.pem", "--max-num-batched-tokens", "8192"],
     ["x", "--ssl-keyfile", "/k.pem", "--max-num-batched-tokens", "8192"]),
])
def test_redact_argv(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("HF_TOKEN=hf_secret123 started", "HF_TOKEN=*** started"),
    ("api-key: sk-abc", "api-key: ***"),
    ("export OPENAI_API_KEY='sk-a b'", "export OPENAI_API_KEY=***"),
    # vLLM prints its non-default arguments as a dict, SGLang its ServerArgs as a repr.
    ("non-default args: {'model': 'm', 'api_key': ['sk-1', 'sk-2'], 'port': 8000}",
     "non-default args: {'model': 'm', 'api_key': ***, 'port': 8000}"),
    ("server_args=ServerArgs(model_path='m', api_key='sk-3', port=1)",
     "server_args=ServerArgs(model_path='m', api_key=***, port=1)"),
    ('{"api_key": "sk-4", "total_token_throughput": 12.5}',
     '{"api_key": ***, "total_token_throughput": 12.5}'),
    ("curl -H 'Authorization: Bearer abc.def' x", "curl -H 'Authorization: Bearer ***' x"),
    ("authorization: bearer abc", "authorization: bearer ***"),
    ("Proxy-Authorization: Basic dXNlcjpwYXNz", "Proxy-Authorization: Basic ***"),
    ('"Authorization": "tok123"', '"Authorization": "***"'),
    ("API_KEY=-abc", "API_KEY=***"),
    ("--api-key --port 8", "--api-key --port 8"),
    ("the token was rejected", "the token was rejected"),
    ("HF_TOKEN_PATH=/x/y", "HF_TOKEN_PATH=/x/y"),
    ("total_token_throughput=4521.3", "total_token_throughput=4521.3"),
    ("connect postgresql://u:pw@h/db failed", "connect postgresql://u:***@h/db failed"),
    ("", ""),
])
def test_redact_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_scrubber_hides_known_values_anywhere() -> None:
    scrub = Scrubber.for_run({"HF_TOKEN": "hf_abcdef", "DB": "postgresql://u:hunter22@h/d"},
                             {"api-key": "sk-xyzw", "pw": "abc"},
                             ["srv", "--admin-api-key", "adm1n-k3y"])
    assert set(scrub.values) == {"hf_abcdef", "hunter22", "sk-xyzw", "adm1n-k3y",
                                 "postgresql://u:hunter22@h/d"}
    text = "loaded hf_abcdef; key sk-xyzw; admin adm1n-k3y; pw hunter22; abc stays"
    out = scrub(text)
    assert out is not None
    for secret in scrub.values:
        assert secret not in out
    assert "abc stays" in out  # shorter than MIN_SCRUB_LEN: not looked for in text
    assert scrub(None) is None and scrub("") == ""


def test_redact_data_document() -> None:
    doc = {
        "env": {"HF_TOKEN": "hf_x1234", "PATH": "/bin"},
        "flags": {"api-key": "sk-abcd", "max-num-seqs": 64},
        "argv": ["vllm", "serve", "--api-key", "sk-abcd"],
        "levels": [{"total_token_throughput": 123.4, "p99_ttft_ms": 5.0}],
        "findings": [{"message": "stray `python srv.py --api-key other1`",
                      "evidence": {"cmdline": ["python", "srv.py", "--token", "other1"]}}],
        "log_tail": "started with sk-abcd",
        "space": {"hf-token": ["a1234", "b1234"], "n": [1, 2]},
        "pid": 12, "ok": True, "none": None,
    }
    scrub = Scrubber(secret_values(doc))
    out = redact_data(doc, scrub)
    text = repr(out)
    for secret in ("hf_x1234", "sk-abcd", "other1", "a1234", "b1234"):
        assert secret not in text
    assert out["levels"] == doc["levels"]
    assert out["space"]["n"] == [1, 2] and out["pid"] == 12 and out["ok"] is True
    assert out["env"]["PATH"] == "/bin"
    assert redact_data(out, Scrubber(secret_values(out))) == out


def test_only_command_lines_hide_the_word_after_a_secret_flag() -> None:
    """A list of file names (``shm_before``) is not a command line: a name ``--token`` made by
    another user must not hide the next name (teardown compares those names)."""
    doc = {"shm_before": ["--token", "victim_file"], "argv": ["x", "--token", "tok12345"]}
    out = redact_data(doc, Scrubber(secret_values(doc)))
    assert out == {"shm_before": ["--token", "victim_file"], "argv": ["x", "--token", REDACTED]}
    assert secret_values(doc) == {"tok12345"}


def test_secret_values() -> None:
    doc = {"env": {"HF_TOKEN": "hf_x1234", "X": "postgresql://u:pass5678@h/d"},
           "argv": ["a", "--api-key", "sk-long1", "PGPASSWORD=pgpass99"],
           "flags": {"api-key": 12345678, "short": "ab"}, "pw": "abc"}
    assert secret_values(doc) == {"hf_x1234", "pass5678", "sk-long1", "pgpass99", "12345678",
                                  "postgresql://u:pass5678@h/d"}


# -- cost -----------------------------------------------------------------------------------------

_ADVERSARIAL = {
    "one long word": "a" * (1 << 18),
    "dotted word": "a." * (1 << 17),
    "dashed word": "-a" * (1 << 17),
    "unclosed lists": "key=[" * (1 << 16),
    "unclosed quotes": "key=\"" * (1 << 16),
    "url without @": "x://a:" + "b" * (1 << 18),
    "many secret words": "key " * (1 << 16),
    "many assignments": "token=a " * (1 << 15),
    "headers": "Authorization: " * (1 << 14),
    # issue 23's spellings: DSNs, passwords holding "/", program flags, quoted values, queries
    "DSN starts": "(a:" * (1 << 16),
    "URL passwords without @": "x://a:" + "b/" * (1 << 17),
    "many URLs": "x://a:b/" * (1 << 15),
    "web tokens without @": "https://a" * (1 << 15),
    "mysql -p": "mysql -px " * (1 << 15),
    "unclosed quoted values": "sshpass -p '" * (1 << 14),
    "query parameters": "?sig=a&" * (1 << 15),
    "path assignments": "path=" * (1 << 16),
    # issue 35's shapes: key blocks, JWTs, token runs, set/config names, positional programs
    "unclosed key blocks": "-----BEGIN PRIVATE KEY-----" * (1 << 13),
    "key headers that do not match": "-----BEGIN " * (1 << 14),
    "JWT starts": "eyJabcd." * (1 << 15),
    "one random token": "aB3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ" * (1 << 13),
    "token runs": "aB3dE5gH7jK9mN1pQ3sT5vX7 " * (1 << 14),
    "set names": "set api_key " * (1 << 14),
    "config options": "config --global --x " * (1 << 13),
    "htpasswd positionals": "htpasswd -b " + "x " * (1 << 16),
    "vault logins": "vault login " * (1 << 14),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(_ADVERSARIAL))
def test_redact_text_is_linear_on_hostile_text(kind: str) -> None:
    """A process can write up to a megabyte of argv and every snapshot redacts every command
    line: 256 KiB of the worst text takes well under a second (quadratic patterns took
    minutes)."""
    text = _ADVERSARIAL[kind]
    started = time.perf_counter()
    redact_text(text)
    redact_argv([text])
    assert time.perf_counter() - started < 3.0


@pytest.mark.timeout(120)
def test_snapshot_process_with_a_megabyte_argv_is_cheap() -> None:
    from cleanslate.probe.snapshot import ProcessInfo

    started = time.perf_counter()
    info = ProcessInfo(pid=5, ppid=1, pgid=5, sid=5, state="S", comm="x",
                       cmdline=("python", "a." * (1 << 19), "--api-key", "sk-zzzz"),
                       create_time=1.0)
    assert time.perf_counter() - started < 5.0
    assert info.cmdline[-1] == REDACTED


# -- properties -----------------------------------------------------------------------------------

_SECRET_NAMES = st.sampled_from([
    "HF_TOKEN", "OPENAI_API_KEY", "PGPASSWORD", "api-key", "api_key", "hf-token", "SECRET",
    "aws_secret_access_key", "db_password", "AUTH", "x-api-key", "Access_Token",
    "GITHUB_TOKEN", "client_secret", "pw",
])
_VALUE_CHARS = string.ascii_letters + string.digits + "_-.~+/=:@!%^*#$&?"
_VALUES = st.text(alphabet=_VALUE_CHARS, min_size=6, max_size=40).filter(
    lambda v: not v.startswith("-") and REDACTED not in v)
_FILLER = st.text(alphabet=string.ascii_letters + string.digits + " .:/()[]{}'\"\t\n",
                  max_size=40)
_FORMS = st.sampled_from([
    "{n}={v}", "--{n} {v}", "--{n}={v}", "{n}: {v}", "{n}:{v}", "'{n}': '{v}'",
    '"{n}": "{v}"', "{n}='{v}'", '{n}="{v}"', "export {n}={v}", "-{n} {v}",
    "{{'{n}': ['{v}']}}", "Namespace({n}='{v}', port=1)", "{n} = {v}",
])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=_SECRET_NAMES, value=_VALUES, form=_FORMS, before=_FILLER, after=_FILLER)
def test_text_never_keeps_a_value_after_a_secret_name(name: str, value: str, form: str,
                                                      before: str, after: str) -> None:
    assume(value not in before and value not in after and value not in name)
    text = f"{before} {form.format(n=name, v=value)} {after}"
    assert value not in redact_text(text)


@settings(max_examples=300, deadline=None)
@given(name=_SECRET_NAMES, value=_VALUES, others=st.lists(_FILLER, max_size=6),
       at=st.integers(min_value=0, max_value=6), joined=st.booleans())
def test_argv_never_keeps_a_value_after_a_secret_flag(name: str, value: str, others: list[str],
                                                      at: int, joined: bool) -> None:
    assume(all(value not in o for o in others) and value not in name)
    flag = name if name.startswith("-") or not joined else f"--{name}"
    secret = [f"{flag}={value}"] if joined else [f"--{name.lstrip('-')}", value]
    argv = [*others[:at], *secret, *others[at:]]
    assert all(value not in a for a in redact_argv(argv))
    # The same command line rewritten as one string (setproctitle-style).
    assert value not in redact_argv([" ".join(argv)])[0]


@settings(max_examples=200, deadline=None)
@given(name=_SECRET_NAMES, value=_VALUES,
       other=st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=8),
                             st.text(max_size=20), max_size=5))
def test_env_and_flags_never_keep_a_secret_value(name: str, value: str,
                                                 other: dict[str, str]) -> None:
    assume(all(value not in v and value not in k for k, v in other.items()))
    assert value not in repr(redact_env({**other, name: value}))
    assert value not in repr(redact_flags({**other, name: value}))
    assert value not in repr(redact_flags({**other, name: [value, value]}))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_text_functions_never_raise(text: str) -> None:
    assert isinstance(redact_text(text), str)
    assert isinstance(redact_url(text), str)
    assert isinstance(is_secret_name(text), bool)
    assert all(isinstance(a, str) for a in redact_argv([text, text]))
    out = Scrubber([text])(text + " x")
    assert isinstance(out, str)


@settings(max_examples=300, deadline=None)
@given(doc=_JSON)
def test_redact_data_never_raises_and_is_idempotent(doc: Any) -> None:
    once = redact_data(doc, Scrubber(secret_values(doc)))
    twice = redact_data(once, Scrubber(secret_values(once)))
    assert twice == once


# -- the spelling table (issue 23) ----------------------------------------------------------------
#
# Every spelling of a secret that redaction must hide, as the places that hold one give it: an
# environment (a study's ``env:``, a run's record), engine flags, a command line (another
# process's argv, also rewritten as one string by setproctitle) and free text (a log line). Each
# row is (what, where, input); the secret is ``S3CR3T`` (made unique per row) wherever it appears.
# Figures (issue 23): on the code before the fix, 32 of 52 spellings leaked; after it, 0 of 52.

_S = "S3CR3T"

SPELLINGS: list[tuple[str, str, Any]] = [
    # environment names
    ("HF_TOKEN", "env", {"HF_TOKEN": _S}),
    ("OPENAI_API_KEY", "env", {"OPENAI_API_KEY": _S}),
    ("PGPASSWORD", "env", {"PGPASSWORD": _S}),
    ("SSHPASS", "env", {"SSHPASS": _S}),
    ("MYSQL_PWD", "env", {"MYSQL_PWD": _S}),
    ("GITHUB_PAT", "env", {"GITHUB_PAT": _S}),
    ("*_PASSPHRASE", "env", {"GPG_PASSPHRASE": _S}),
    ("*_KEY_PASSPHRASE", "env", {"SSH_KEY_PASSPHRASE": _S}),
    ("*_COOKIE", "env", {"SESSION_COOKIE": _S}),
    ("*_COOKIE (camel)", "env", {"JupyterCookie": _S, "jupyter_cookie": _S}),
    # environment values: URLs, DSNs, connection strings
    ("postgres:// userinfo", "env", {"DATABASE_URL": f"postgres://user:{_S}@h:5432/db"}),
    ("password with / in a URL", "env", {"DB": f"postgresql://u:ab/{_S}@h/db"}),
    ("mongodb+srv:// userinfo", "env",
     {"MONGO_URI": f"mongodb+srv://u:{_S}@cluster0.x.mongodb.net/db?retryWrites=true"}),
    ("redis:// password only", "env", {"REDIS_URL": f"redis://:{_S}@cache:6379/0"}),
    ("ADO Password=", "env",
     {"MSSQL": f"Server=tcp:h,1433;Database=d;User Id=u;Password={_S};Encrypt=True;"}),
    ("ODBC Pwd=", "env", {"ODBC": f"Driver={{ODBC Driver 18}};Server=h;Uid=u;Pwd={_S};"}),
    ("MySQL DSN user:pw@tcp()", "env", {"MYSQL_DSN": f"app:{_S}@tcp(db:3306)/app?tls=true"}),
    ("MySQL DSN user:pw@/db", "env", {"MYSQL_DSN": f"app:{_S}@/app"}),
    ("Azure SAS sig=", "env",
     {"BLOB": f"https://a.blob.core.windows.net/c/b?sv=2022-11-02&se=2026&sp=r&sig={_S}%3D"}),
    ("AWS X-Amz-Signature", "env",
     {"URL": f"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256"
             f"&X-Amz-Date=20260101T000000Z&X-Amz-Signature={_S}&X-Amz-Expires=60"}),
    ("AWS X-Amz-Credential", "env",
     {"URL": f"https://b.s3.amazonaws.com/k?X-Amz-Credential={_S}%2F20260101&X-Amz-Expires=60"}),
    ("token= query parameter", "env", {"HOOK": f"https://h/hook?x=1&token={_S}&y=2"}),
    ("access_token= query parameter", "env", {"HOOK": f"wss://h/ws?access_token={_S}"}),
    ("https://TOKEN@ userinfo", "env", {"REPO": f"https://{_S}@github.com/org/repo.git"}),
    # flags
    ("--api-key", "flags", {"api-key": _S}),
    ("sshpass flag", "flags", {"sshpass": _S}),
    ("passphrase flag", "flags", {"key-passphrase": _S}),
    # command lines
    ("--api-key X", "argv", ["vllm", "serve", "m", "--api-key", _S]),
    ("Authorization: Bearer", "argv", ["curl", "-H", f"Authorization: Bearer {_S}", "http://h"]),
    ("mysql -pSECRET", "argv", ["mysql", "-uroot", f"-p{_S}", "-h", "db", "app"]),
    ("mysql --password=", "argv", ["mysql", f"--password={_S}", "app"]),
    ("mysqldump -pSECRET", "argv", ["/usr/bin/mysqldump", "-u", "root", f"-p{_S}", "app"]),
    ("mariadb -pSECRET", "argv", ["mariadb", f"-p{_S}"]),
    ("sudo mysql -pSECRET", "argv", ["sudo", "mysql", f"-p{_S}"]),
    ("sshpass -p SECRET", "argv", ["sshpass", "-p", _S, "ssh", "u@h"]),
    ("sshpass -pSECRET", "argv", ["sshpass", f"-p{_S}", "ssh", "u@h"]),
    ("SSHPASS=x sshpass -e", "argv", ["env", f"SSHPASS={_S}", "sshpass", "-e", "ssh", "h"]),
    ("redis-cli -a SECRET", "argv", ["redis-cli", "-h", "h", "-a", _S, "ping"]),
    ("redis-cli --pass SECRET", "argv", ["redis-cli", "--pass", _S, "ping"]),
    ("docker login -p SECRET", "argv", ["docker", "login", "-u", "u", "-p", _S, "r.io"]),
    ("docker login -pSECRET", "argv", ["docker", "login", "-u", "u", f"-p{_S}", "r.io"]),
    ("docker login --password", "argv", ["docker", "login", "--password", _S, "r.io"]),
    ("podman login -p", "argv", ["podman", "login", "-p", _S, "quay.io"]),
    ("git https://TOKEN@", "argv", ["git", "clone", f"https://{_S}@github.com/o/r"]),
    ("git x-access-token:TOKEN@", "argv",
     ["git", "clone", f"https://x-access-token:{_S}@github.com/o/r"]),
    ("curl -u user:pw", "argv", ["curl", "-u", f"user:{_S}", "https://h"]),
    ("curl --user=user:pw", "argv", ["curl", f"--user=user:{_S}", "https://h"]),
    ("mongosh -p", "argv", ["mongosh", "--username", "u", "-p", _S]),
    ("bash -c 'mysql -pSECRET'", "argv", ["bash", "-c", f"mysql -uroot -p{_S} app"]),
    ("bash -c \"sshpass -p 'quoted secret'\"", "argv",
     ["bash", "-c", f"sshpass -p 'quoted {_S}' ssh h"]),
    # free text
    ("log line with a DSN", "text", f"connecting to postgres://u:{_S}@h/db failed"),
    ("a printed argument dict", "text", f"args: {{'sshpass': '{_S}', 'port': 1}}"),
]


def _leaks(where: str, value: Any, secret: str) -> bool:
    """Whether ``secret`` survives the redaction of ``value`` as ``where`` holds it."""
    outs: list[Any]
    if where == "env":
        outs = [redact_env(value), redact_data({"env": value})]
    elif where == "flags":
        outs = [redact_flags(value), redact_data({"flags": value})]
    elif where == "argv":
        outs = [redact_argv(value), redact_argv([" ".join(value)]),
                redact_data({"argv": value})]
    else:
        outs = [redact_text(value), redact_data({"detail": value})]
    return any(secret in repr(out) for out in outs)


def _unique(value: Any, n: int) -> tuple[Any, str]:
    secret = f"{_S}{n:02d}x"
    if isinstance(value, str):
        return value.replace(_S, secret), secret
    if isinstance(value, list):
        return [v.replace(_S, secret) for v in value], secret
    return {k: v.replace(_S, secret) for k, v in value.items()}, secret


def test_spelling_table_leaks_nothing() -> None:
    leaked = []
    for n, (what, where, value) in enumerate(SPELLINGS):
        value, secret = _unique(value, n)
        if _leaks(where, value, secret):
            leaked.append(what)
    print(f"{len(SPELLINGS)} spellings, {len(leaked)} leaked")
    assert leaked == [], f"{len(leaked)} of {len(SPELLINGS)} spellings leaked: {leaked}"


# What must survive redaction: measures, places and switches named like secrets, user names,
# ports, other programs' short flags (docs/security.md).
SURVIVORS: list[tuple[str, str, Any]] = [
    ("env", "env", {"PWD": "/home/u/x", "OLDPWD": "/tmp", "PATH": "/usr/bin",
                    "HF_TOKEN_PATH": "/run/t", "TOKENIZERS_PARALLELISM": "false"}),
    ("flags", "flags", {"tbo-token-distribution-threshold": 0.48, "max-num-batched-tokens": 8192,
                        "api-key-file": "/k", "speculative-token-map": "/m.pt",
                        "long-prefill-token-threshold-adaptive": True,
                        "kt-max-deferred-experts-per-token": 4,
                        "bucket-time-to-first-token": "0.1,0.5",
                        "prefill-delayer-token-usage-low-watermark": 0.2,
                        "bucket-inter-token-latency": "1,2",
                        "return-tokens-as-token-ids": True, "pad-token-id": 0,
                        "eos_token_id": 2}),
    ("argv", "argv", ["python", "-m", "sglang.launch_server", "--tbo-token-distribution-threshold",
                      "0.48", "--speculative-token-map", "/m.pt", "--kt-max-deferred-experts-"
                      "per-token", "4", "--bucket-time-to-first-token", "0.1", "--model-path",
                      "/models/m", "--ssl-keyfile", "/k.pem"]),
    ("docker run -p", "argv", ["docker", "run", "-p", "8080:80", "-pfoo", "img"]),
    ("mysql -P port", "argv", ["mysql", "-P", "3306", "-h", "db", "-p", "app"]),
    ("-p of other programs", "argv", ["python", "-pfoo", "-p", "bar", "mkdir", "-p", "/a/b"]),
    ("docker login --password-stdin", "argv", ["docker", "login", "--password-stdin",
                                               "registry.example.com"]),
    ("ssh user", "argv", ["git", "clone", "ssh://git@github.com/o/r", "git@github.com:o/r"]),
    ("URL user", "text", "postgresql://postgres@db:5432/app http://127.0.0.1:8000/v1/models"),
    ("a URL query", "text", "https://h/x?sv=2022-11-02&se=2026-01-01&sp=r&design=1&path=/a"),
    ("prose", "text", "the token was rejected; sig handlers ok; a pat on the back"),
    ("an e-mail", "text", "mail alice@example.com, from bob:x"),
]


@pytest.mark.parametrize(("what", "where", "value"), SURVIVORS, ids=[r[0] for r in SURVIVORS])
def test_measures_places_and_other_flags_survive(what: str, where: str, value: Any) -> None:
    if where == "env":
        assert redact_env(value) == value
    elif where == "flags":
        assert redact_flags(value) == value
    elif where == "argv":
        assert redact_argv(value) == value
        assert redact_argv([" ".join(value)]) == [" ".join(value)]
    else:
        assert redact_text(value) == value


@pytest.mark.parametrize(("argv", "expected"), [
    (["mysql", "-uroot", "-pS3cr3t!", "app"], ["mysql", "-uroot", f"-p{REDACTED}", "app"]),
    (["sshpass", "-p", "pw12", "ssh", "h"], ["sshpass", "-p", REDACTED, "ssh", "h"]),
    (["docker", "login", "-u", "me", "-p", "pw12", "r"],
     ["docker", "login", "-u", "me", "-p", REDACTED, "r"]),
    (["curl", "-u", "me:pw12", "x"], ["curl", "-u", f"me:{REDACTED}", "x"]),
    (["redis-cli", "-a", "pw12", "ping"], ["redis-cli", "-a", REDACTED, "ping"]),
])
def test_program_flags_keep_the_flag_and_hide_the_value(argv: list[str],
                                                        expected: list[str]) -> None:
    assert redact_argv(argv) == expected
    assert secret_values({"argv": argv}) & {"S3cr3t!", "pw12"}


@pytest.mark.parametrize(("text", "expected"), [
    ("sshpass -p 'my secret words' ssh h", f"sshpass -p {REDACTED} ssh h"),
    ("mysql -p\"pw 1\" app; ls -p x", f"mysql -p{REDACTED} app; ls -p x"),
    ("https://acct.blob/c?sv=1&sig=abc%3D&se=2", f"https://acct.blob/c?sv=1&sig={REDACTED}&se=2"),
    ("Uid=u;Pwd=abc12;Encrypt=1", f"Uid=u;Pwd={REDACTED};Encrypt=1"),
    ("app:pw12@tcp(db:3306)/x", f"app:{REDACTED}@tcp(db:3306)/x"),
    ("https://ghp_abc@github.com/o/r", f"https://{REDACTED}@github.com/o/r"),
])
def test_text_forms(text: str, expected: str) -> None:
    assert redact_text(text) == expected


# Other processes' command lines as a snapshot reads them from /proc (what `check --json`, a
# baseline and a teardown's targets hold): the command-line rows of the spelling table, each a
# real process.
_PROCESS_ROWS = [(what, value) for what, where, value in SPELLINGS if where == "argv"]


def test_other_processes_command_lines_are_redacted_in_a_snapshot(procs: Any) -> None:
    import asyncio
    import sys

    from cleanslate.hosts.local import LocalExecutor
    from cleanslate.probe.gpu.none import NoGpuBackend
    from cleanslate.probe.host import probe_host

    secrets: dict[str, str] = {}
    started = []
    for n, (what, value) in enumerate(_PROCESS_ROWS):
        argv, secret = _unique(value, n)
        secrets[secret] = what
        # python ignores the words after -c's code: /proc shows them as the process's argv
        started.append(procs.python("import time; time.sleep(60)", *argv).pid)
    snapshot = asyncio.run(probe_host(LocalExecutor(python=sys.executable), NoGpuBackend(),
                                      timeout=20))
    seen = {p.pid: p for p in snapshot.processes}
    assert all(pid in seen for pid in started)
    text = snapshot.model_dump_json()
    leaked = [what for secret, what in secrets.items() if secret in text]
    print(f"{len(secrets)} command lines, {len(leaked)} leaked")
    assert leaked == []


def test_a_studys_secrets_are_not_stored(tmp_path: Any) -> None:
    """A study's ``env:`` and ``launch`` holding every environment and command-line spelling,
    saved to a real SQLite store: no secret is in the database file, nor in what it returns."""
    from cleanslate.store import Store, StudyStatus

    env: dict[str, str] = {}
    launch: list[str] = []
    secrets: dict[str, str] = {}
    for n, (what, where, value) in enumerate(SPELLINGS):
        unique, secret = _unique(value, n)
        if where == "env":
            env.update({f"{k}_{n}" if not k.isupper() or k in env else k: v
                        for k, v in unique.items()})
        elif where == "argv":
            launch += [*unique, ";"]
        else:
            continue
        secrets[secret] = what
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    store = Store(f"sqlite:///{folder}/s.db")
    try:
        store.save_study("s", {"name": "s", "engine": "sim", "env": env, "launch": launch},
                         StudyStatus.RUNNING)
        returned = repr(store.study("s"))
    finally:
        store.close()
    raw = b"".join(f.read_bytes() for f in folder.iterdir() if f.is_file())
    leaked = [what for secret, what in secrets.items()
              if secret.encode() in raw or secret in returned]
    print(f"{len(secrets)} study secrets, {len(leaked)} stored")
    assert leaked == []


# -- redaction by structure (issue 35) ------------------------------------------------------------
#
# Both sides of the rule: a table of secret spellings (tests/data/redaction_cases.json, plus the
# table above) of which none may survive any output, and engine command lines, environments and
# logs without a secret (tests/data/engine_command_lines.json, the engines' real help texts and
# logs) of which nothing may be masked. ``python benchmarks/redaction_table.py`` prints the same
# figures with the token detector's rates.

DATA = Path(__file__).parent / "data"
ENGINE_DATA = Path(__file__).parent / "engines" / "data"


def _table() -> list[tuple[str, str, Any, str]]:
    """Every spelling: (what, where, input, secret)."""
    rows = json.loads((DATA / "redaction_cases.json").read_text())["rows"]
    table = [(r["what"], r["where"], r["input"], r["secret"]) for r in rows]
    for n, (what, where, value) in enumerate(SPELLINGS):
        unique, secret = _unique(value, n)
        table.append((what, where, unique, secret))
    return table


def _outputs(where: str, value: Any) -> list[Any]:
    """Everything redaction makes of ``value`` as ``where`` holds it."""
    if where == "env":
        return [redact_env(value), redact_data({"env": value})]
    if where == "flags":
        return [redact_flags(value), redact_data({"flags": value})]
    if where == "argv":
        return [redact_argv(value), redact_argv([" ".join(value)]), redact_data({"argv": value})]
    if where == "text":
        return [redact_text(value), redact_data({"detail": value})]
    return [redact_data(value)]


def test_redaction_table_leaks_nothing() -> None:
    """The 15 spellings issue 35 found leaking and at least 150 more: the secret is in no
    output of redact_env, redact_flags, redact_argv (also as one setproctitle string),
    redact_text and redact_data."""
    table = _table()
    leaked = [what for what, where, value, secret in table
              if any(secret in json.dumps(out) or secret in repr(out)
                     for out in _outputs(where, value))]
    places = Counter(where for _, where, _, _ in table)
    print(f"redaction table: {len(table)} spellings ({dict(places)}), {len(leaked)} leaked")
    assert len(table) >= 150
    assert leaked == [], f"{len(leaked)} of {len(table)} spellings leaked: {leaked}"


def test_redaction_table_is_not_stored(tmp_path: Path) -> None:
    """The whole table in one run record (its env, flags, argv, detail and log tail), saved to
    a real SQLite store and read back: no secret in the database's bytes nor in the record."""
    from cleanslate.store import RunRecord, RunStatus, Store

    env: dict[str, str] = {}
    flags: dict[str, Any] = {}
    argv: list[str] = ["cleanslate-test"]
    texts: list[str] = []
    table = _table()
    for n, (_, where, value, _) in enumerate(table):
        if where == "env":
            env.update({k if k not in env else f"{k}_{n}": v for k, v in value.items()})
        elif where == "flags":
            flags.update({k if k not in flags else f"{k}-{n}": v for k, v in value.items()})
        elif where == "argv":
            argv += [*value, ";"]
        elif where == "text":
            texts.append(value)
        else:
            flags[f"document-{n}"] = value
    record = RunRecord(id="r-35", host="local", engine="sim", model="m", argv=tuple(argv),
                       flags=flags, env=env, marker="r-35", port=30000, url="http://h:1",
                       log_path="/runs/r-35/server.log", artifacts_dir="/runs/r-35",
                       status=RunStatus.FAILED, detail="\n".join(texts[:len(texts) // 2]),
                       log_tail="\n".join(texts[len(texts) // 2:]))
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    store = Store(f"sqlite:///{folder}/s.db")
    try:
        store.save_run(record)
        returned = store.get_run("r-35").model_dump_json()
    finally:
        store.close()
    raw = b"".join(f.read_bytes() for f in folder.iterdir() if f.is_file())
    leaked = [what for what, _, _, secret in table
              if secret.encode() in raw or secret in returned]
    print(f"one run record holding {len(table)} spellings: {len(leaked)} stored")
    assert leaked == []


@pytest.mark.parametrize(("argv", "expected"), [
    (["smbclient", "//fs/s", "-U", "alice%Pw0rd!x"], ["smbclient", "//fs/s", "-U", "alice%***"]),
    (["htpasswd", "-b", "/etc/.htpasswd", "alice", "Pw0rd!x"],
     ["htpasswd", "-b", "/etc/.htpasswd", "alice", REDACTED]),
    (["htpasswd", "-c", "/etc/.htpasswd", "alice"], ["htpasswd", "-c", "/etc/.htpasswd", "alice"]),
    (["aws", "configure", "set", "aws_secret_access_key", "Pw0rd!x"],
     ["aws", "configure", "set", "aws_secret_access_key", REDACTED]),
    (["aws", "configure", "set", "region", "us-east-1"],
     ["aws", "configure", "set", "region", "us-east-1"]),
    (["az", "login", "-u", "me", "-p", "Pw0rd!x"], ["az", "login", "-u", "me", "-p", REDACTED]),
    (["lftp", "-u", "alice,Pw0rd!x", "ftp.h"], ["lftp", "-u", "alice,***", "ftp.h"]),
    (["openssl", "enc", "-k", "Pw0rd!x", "-in", "f"],
     ["openssl", "enc", "-k", REDACTED, "-in", "f"]),
    (["vault", "login", "s.Pw0rdPw0rd"], ["vault", "login", REDACTED]),
    (["vault", "login", "-method=github"], ["vault", "login", "-method=github"]),
    (["npm", "config", "set", "//r.io/:_authToken=Pw0rd!x"],
     ["npm", "config", "set", "//r.io/:_authToken=***"]),
    (["python", "x.py", "--authkey", "Pw0rd!x9Q"], ["python", "x.py", "--authkey", REDACTED]),
    (["python", "x.py", "--authkey", "/run/key"], ["python", "x.py", "--authkey", "/run/key"]),
    (["sqlplus", "scott/Pw0rd!x@orcl"], ["sqlplus", "scott/***"]),
    (["vllm", "serve", "m", "--tokenizer-pool-extra-config", '{"pool": 2}'],
     ["vllm", "serve", "m", "--tokenizer-pool-extra-config", '{"pool": 2}']),
    (["x", "--authkey", '{"password": "Pw0rd!x"}'], ["x", "--authkey", REDACTED]),
])
def test_positional_and_program_forms(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(("name", "value", "kept"), [
    ("CI_JOB_JWT", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", False),
    ("SLACK_BOT_OAUTH", "xoxb-1-2-abc", False),
    ("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T0/B0/abc", False),
    ("JWT", "abc", False),
    ("AZURE_STORAGE_CONNECTION_STRING", "AccountName=a;AccountKey=abc==;", False),
    ("APP_THING", "https://example.com/x", False),   # a URL under an unknown name
    ("APP_THING", "two words", False),                # free text under an unknown name
    ("APP_THING", "S3cr3tPw0rd", False),              # mixed case and digits: generated
    ("APP_THING", "4096", True),
    ("APP_THING", "true", True),
    ("APP_THING", "/srv/models/llama", True),
    ("APP_THING", "meta-llama/Llama-3.1-8B-Instruct", True),
    ("APP_THING", "bfloat16", True),
    ("APP_THING", "eth0,eth1", True),
    ("NCCL_SOCKET_IFNAME", "^docker0,lo", True),     # a knob: kept whatever its shape
    ("VLLM_API_KEY", "k", False),                     # a knob family, but a secret's name
    ("HTTPS_PROXY", "http://u:pw@proxy:3128", True),  # kept, its password hidden
])
def test_environment_keeps_only_harmless_values(name: str, value: str, kept: bool) -> None:
    out = redact_env({name: value})[name]
    assert (out != REDACTED) is kept
    if name == "HTTPS_PROXY":
        assert out == "http://u:***@proxy:3128"


def test_shapes_are_hidden_whatever_the_name() -> None:
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    assert redact_text(f"k: {pem}") == \
        f"k: -----BEGIN PRIVATE KEY-----{REDACTED}-----END PRIVATE KEY-----"
    assert redact_text("-----BEGIN RSA PRIVATE KEY-----\nMIIE cut") == \
        f"-----BEGIN RSA PRIVATE KEY-----{REDACTED}"
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    assert redact_text(f"token {jwt} ok") == f"token {REDACTED} ok"
    assert redact_text('{"private_key": "a\\"b", "n": 1}') == '{"private_key": ***, "n": 1}'
    assert redact_text("use ghp_R4nd0mT0k3nV4lu3Xy9Qz81Lk2Jm5Np7Bc3 now") == \
        f"use {REDACTED} now"


@pytest.mark.parametrize("token", [
    "ghp_8fKq2LmN4pR7sT1vX3zB5dF6hJ9kM0nQ2wE4", "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",
    "sk-proj-Ab3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ3kM5nP7qR9tV1",
    "xoxb-1234567890-1234567890123-Ab3dE5gH7jK9mN1pQ3sT5vX7",
    "Rk8vQ2xLp9sT4wYb7NcF1mZd6HjG3aKe5UuXoVi0", "npm_Ab3dE5gH7jK9mN1pQ3sT5vX7zB9dF1hJ3kM5",
])
def test_random_tokens_are_tokens(token: str) -> None:
    assert looks_like_token(token)


@pytest.mark.parametrize("word", [
    "DeepseekV32ForCausalLM", "Qwen2.5-Coder-32B-Instruct-AWQ", "scheduler_DP0_TP1_EP1",
    "6f6073b423013f6a7d4d9f39144961bfbfbc386b", "GPU-37a88d38-c361-3f15-077c-e1be989b431f",
    "cmpl-8dae205dba90785e-0-bab6df1d", "r-20261206-011500-a1b2",
    "models--meta-llama--Llama-3.3-70B-Instruct", "nvmlDeviceGetP2PStatus",
    "max_num_batched_tokens", "DeepSeek-R1-0528-UD-Q2_K_XL-00001-of-00006",
])
def test_identifiers_and_digests_are_not_tokens(word: str) -> None:
    assert not looks_like_token(word)


def _help_argv(path: Path) -> list[str]:
    """Every option of an engine's real ``--help`` (but those named as secrets) with a typical
    value for its metavar: a choice, a path, a model name, a number or a word."""
    option = re.compile(r"^\s{0,12}\[?(--?[A-Za-z][\w.\-]*)(?:[ =]\[?(\{[^}\s]*\}|[A-Z][A-Z0-9_|"
                        r"<>.\-]*)\b)?")
    seen: set[str] = set()
    argv: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        m = option.match(line)
        if m is None or m.group(1) in seen or m.group(1) in ("-h", "--help") or \
                is_secret_name(m.group(1)):
            continue
        name, meta = m.group(1), (m.group(2) or "")
        seen.add(name)
        argv.append(name)
        low = meta.lower()
        if meta.startswith("{"):
            argv.append(meta.strip("{}").split(",")[0])
        elif any(w in low or w in name for w in ("path", "file", "dir", "template")):
            argv.append("/models/x/tokenizer_config.json")
        elif "model" in low or "model" in name or "tokenizer" in name:
            argv.append("meta-llama/Llama-3.1-8B-Instruct")
        elif meta:
            argv.append("4" if any(w in low for w in ("size", "num", "len", "n", "token",
                                                       "port", "seed", "ratio", "time"))
                        else "auto")
    return argv


def _engine_command_lines() -> list[list[str]]:
    from cleanslate.engines.llamacpp import LlamaCppEngine
    from cleanslate.engines.sglang import SGLangEngine
    from cleanslate.engines.vllm import VLLMEngine

    data = json.loads((DATA / "engine_command_lines.json").read_text())
    lines = [*data["captured"], *data["typical"]]
    lines += [_help_argv(ENGINE_DATA / name) for name in (
        "help_vllm_api_server_all.txt", "help_sglang_0.5.23.txt", "help_llama_server.txt")]
    lines += [
        VLLMEngine().build_argv("meta-llama/Llama-3.1-8B-Instruct", 8000, {
            "tensor-parallel-size": 2, "max-model-len": 32768, "gpu-memory-utilization": 0.9,
            "kv-cache-dtype": "fp8", "max-num-batched-tokens": 8192, "enable-prefix-caching":
            True, "compilation-config": {"level": 3}, "tokenizer": "meta-llama/Llama-3.1-8B",
            "api-key-file": "/run/secrets/k", "revision": "0e9e39f249a16976918f6564b8830bc8"}),
        SGLangEngine().build_argv("/models/GLM-5-NVFP4", 30000, {
            "tp-size": 8, "mem-fraction-static": 0.88, "kv-cache-dtype": "fp8_e4m3",
            "max-running-requests": 256, "cuda-graph-max-bs-decode": 256, "tokenizer-path":
            "/models/GLM-5-NVFP4", "tbo-token-distribution-threshold": 0.48,
            "speculative-num-draft-tokens": 4}, host="0.0.0.0"),
        LlamaCppEngine().build_argv("/models/m-Q4_K_M.gguf", 8080, {
            "c": 8192, "np": 4, "ngl": 99, "fa": "on", "cache-type-k": "q8_0",
            "override-kv": "tokenizer.ggml.add_bos_token=bool:false"}),
    ]
    return lines


def test_engine_command_lines_keep_every_value() -> None:
    """Real and typical vLLM, SGLang and llama.cpp command lines, every option of their real
    help texts, and what the adapters build: nothing masked, as argv, as one string and in a
    document."""
    lines = _engine_command_lines()
    words = sum(len(argv) for argv in lines)
    changed = [(argv[i], new) for argv in lines
               for i, new in enumerate(redact_argv(argv)) if new != argv[i]]
    changed += [("joined", argv[0]) for argv in lines
                if redact_argv([" ".join(argv)]) != [" ".join(argv)]]
    changed += [("document", argv[0]) for argv in lines if redact_data({"argv": argv}) !=
                {"argv": argv}]
    print(f"{len(lines)} engine command lines, {words} words: {len(changed)} masked")
    assert changed == []


def test_engine_environments_keep_every_value() -> None:
    envs = json.loads((DATA / "engine_command_lines.json").read_text())["environments"]
    masked = [(k, v) for env in envs for k, v in env.items() if redact_env(env)[k] != v]
    masked += [("document", str(env)) for env in envs
               if redact_data({"env": env}) != {"env": env}]
    print(f"{sum(map(len, envs))} engine environment values: {len(masked)} masked")
    assert masked == []


def test_engine_logs_keep_every_line() -> None:
    """The engines' real logs (tests/engines/data, tests/fixtures): evidence and log tails
    come through whole."""
    root = Path(__file__).parent
    files = sorted([*ENGINE_DATA.glob("*.log"), *(root / "fixtures").rglob("*.log"),
                    *(root / "fixtures").rglob("*.out")])
    lines = [line for f in files for line in f.read_text(errors="replace").splitlines()]
    changed = [line for line in lines if redact_text(line) != line]
    print(f"{len(files)} engine logs, {len(lines)} lines: {len(changed)} changed")
    assert len(lines) > 1000 and changed == []


@pytest.mark.parametrize("text", [
    "BEARER --HF_TOKEN s3cr3tvalue", "Bearer -pw s3cr3tvalue", "BEARER HF_TOKEN: s3cr3tvalue",
    "BEARER HF_TOKEN = s3cr3tvalue", "BEARER Namespace(HF_TOKEN='s3cr3tvalue', port=1)",
    "Authorization: s3cr3tvalue:", "Authorization: Bearer s3cr3tvalue", "Bearer s3cr3tvalue",
])
def test_a_bare_scheme_word_does_not_hide_a_name_and_keep_its_value(text: str) -> None:
    """A word "Bearer" before an option or an assignment: hiding the option's name as the
    credential kept the value after it (found by hypothesis: 'BEARER --HF_TOKEN 000000')."""
    assert "s3cr3tvalue" not in redact_text(text)

