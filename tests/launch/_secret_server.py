"""A server that takes an API key: ``_secret_server.py [--leak] --api-key KEY SIM-ARGS...``.

It stands for any engine with ``--api-key`` (SGLang, vLLM): it drops the key and becomes the
simulated engine (``os.execv``, so the key leaves its command line). With ``--leak`` it instead
writes its token and key into its log, as a crashing engine might, and exits 1.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    args = sys.argv[1:]
    leak = "--leak" in args
    args = [a for a in args if a != "--leak"]
    key = ""
    if "--api-key" in args:
        at = args.index("--api-key")
        key = args[at + 1]
        del args[at : at + 2]
    if leak:
        token = os.environ.get("HF_TOKEN", "")
        print(f"loading with HF_TOKEN={token} and api key {key}", file=sys.stderr)
        print(f"RuntimeError: the hub refused token {token} (key {key})", file=sys.stderr)
        sys.exit(1)
    os.execv(sys.executable, [sys.executable, "-m", "cleanslate.sim", "serve", *args])


if __name__ == "__main__":
    main()
