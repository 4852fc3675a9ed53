"""The command line run in this process (``cleanslate.cli.main`` with ``sys.argv``): an exit
code and what it printed, for input errors that are refused before any work (fast: no
interpreter start per case)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

import cleanslate.cli as cli_mod


@dataclass(frozen=True)
class Exit:
    code: int
    out: str
    err: str


def run_main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
             *args: str) -> Exit:
    """``cleanslate ARGS`` through :func:`cleanslate.cli.main`, as the console script runs it
    (an exception other than ``SystemExit`` escaping it fails the test: a traceback)."""
    monkeypatch.setattr(sys, "argv", ["cleanslate", *args])
    capsys.readouterr()
    code = 0
    try:
        cli_mod.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return Exit(code, captured.out, captured.err)
