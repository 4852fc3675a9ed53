"""cleanslate.redact: secret names, values in argv, env, flags, free text and documents; the cost
is linear in the text, and no function raises or returns a secret it was shown."""

from __future__ import annotations

import string
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cleanslate.redact import (
    REDACTED,
    SECRET_NAMES_ENV,
    Scrubber,
    is_secret_name,
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
    assert redact_env(env) == {"HF_TOKEN": REDACTED, "PATH": "/usr/bin", "EMPTY_TOKEN": "",
                               "DATABASE_URL": "postgresql://u:***@h/db"}
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
    assert set(scrub.values) == {"hf_abcdef", "hunter22", "sk-xyzw", "adm1n-k3y"}
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
    assert secret_values(doc) == {"hf_x1234", "pass5678", "sk-long1", "pgpass99", "12345678"}


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
                       cmdline=["python", "a." * (1 << 19), "--api-key", "sk-zzzz"],
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
