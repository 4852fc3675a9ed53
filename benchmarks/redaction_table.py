"""Redaction by structure (issue 35): both sides of the rule, and the token detector's rates.

- **leaks**: the spelling table of ``tests/test_redact.py`` (``tests/data/redaction_cases.json``
  and the table of issue 23): how many secrets survive any output of redact_env, redact_flags,
  redact_argv (also as one setproctitle string), redact_text and redact_data, by place;
- **masked**: engine command lines (captured, typical, every option of the vLLM, SGLang and
  llama.cpp help texts, what the adapters build), engine environments and the engines' real
  logs: how many words, values and lines redaction changes (none should change);
- **tokens**: :func:`cleanslate.redact.looks_like_token` on ``--tokens`` generated tokens of 13
  formats (GitHub, Hugging Face, OpenAI, Slack, AWS secret and access key, Google, GitLab, npm,
  base64, base62, lower-case base36), seeded; and on every distinct run of 20 or more token
  characters in this repository's docs, tests, fixtures and sources (the words redaction meets:
  identifiers, model names, digests, paths), which should not be tokens.

    python benchmarks/redaction_table.py [--tokens 300]
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import test_redact as cases  # noqa: E402

from cleanslate.redact import _TOKEN_RUN, looks_like_token  # noqa: E402

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
B64U = B62 + "-_"


def _tokens(rng: random.Random, n: int) -> dict[str, list[str]]:
    def g(alphabet: str, k: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(k))

    formats: dict[str, Callable[[], str]] = {
        "github ghp_": lambda: "ghp_" + g(B62, 36),
        "hugging face hf_": lambda: "hf_" + g(string.ascii_letters, 34),
        "openai sk-proj-": lambda: "sk-proj-" + g(B64U, 48),
        "slack xoxb-": lambda: "xoxb-1234567890-1234567890123-" + g(B62, 24),
        "aws secret key": lambda: g(B64, 40),
        "aws access key id": lambda: "AKIA" + g(string.ascii_uppercase + string.digits, 16),
        "google AIza": lambda: "AIza" + g(B64U, 35),
        "gitlab glpat-": lambda: "glpat-" + g(B64U, 20),
        "npm npm_": lambda: "npm_" + g(B62, 36),
        "base64 88": lambda: g(B64, 88),
        "base62 20": lambda: g(B62, 20),
        "base36 24": lambda: g(string.ascii_lowercase + string.digits, 24),
        "base36 32": lambda: g(string.ascii_lowercase + string.digits, 32),
    }
    return {name: [make() for _ in range(n)] for name, make in formats.items()}


def _repository_words() -> set[str]:
    words: set[str] = set()
    for pattern in ("docs/**/*.md", "tests/**/*.txt", "tests/**/*.log", "tests/**/*.out",
                    "tests/**/*.py", "src/**/*.py", "examples/**/*.yaml"):
        for path in ROOT.glob(pattern):
            if path.name == "redaction_cases.json" or path.name == "test_redact.py":
                continue  # the secrets themselves
            words.update(_TOKEN_RUN.findall(path.read_text(errors="replace")))
    return words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300, help="tokens per format")
    args = parser.parse_args()

    started = time.perf_counter()
    table = cases._table()
    leaked: Counter[str] = Counter()
    for _, where, value, secret in table:
        if any(secret in json.dumps(out) or secret in repr(out)
               for out in cases._outputs(where, value)):
            leaked[where] += 1
    places = Counter(where for _, where, _, _ in table)
    print(f"leaks: {len(table)} spellings, {sum(leaked.values())} leaked")
    for place, count in sorted(places.items()):
        print(f"  {place:9} {count:4} spellings, {leaked[place]} leaked")

    lines = cases._engine_command_lines()
    from cleanslate.redact import redact_argv, redact_env, redact_text
    words = sum(map(len, lines))
    masked = sum(a != b for argv in lines for a, b in zip(argv, redact_argv(argv), strict=True))
    envs = json.loads((cases.DATA / "engine_command_lines.json").read_text())["environments"]
    values = sum(map(len, envs))
    masked_env = sum(redact_env(env)[k] != v for env in envs for k, v in env.items())
    logs = [line for f in sorted([*cases.ENGINE_DATA.glob("*.log"),
                                  *(ROOT / "tests" / "fixtures").rglob("*.log"),
                                  *(ROOT / "tests" / "fixtures").rglob("*.out")])
            for line in f.read_text(errors="replace").splitlines()]
    changed = sum(redact_text(line) != line for line in logs)
    print(f"masked: {len(lines)} engine command lines ({words} words): {masked}; "
          f"{values} engine environment values: {masked_env}; "
          f"{len(logs)} engine log lines: {changed}")

    tokens = _tokens(random.Random(35), args.tokens)
    caught = {name: sum(map(looks_like_token, made)) for name, made in tokens.items()}
    total = sum(map(len, tokens.values()))
    print(f"tokens: {sum(caught.values())} of {total} generated tokens found "
          f"({100 * sum(caught.values()) / total:.1f} %)")
    for name, made in tokens.items():
        print(f"  {name:18} {caught[name]:4} of {len(made)}")
    repo = _repository_words()
    flagged = sorted(w for w in repo if looks_like_token(w))
    print(f"  repository words of 20+ token characters: {len(repo)}, "
          f"{len(flagged)} taken for tokens: {flagged[:12]}")
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
