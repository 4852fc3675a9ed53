"""Options the commands share (``cli/_options.py``): one check for ``--gpu-backend`` in every
command, before anything runs; ``--help`` in a pipe is not cut."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_cli

#: Every command that takes --gpu-backend, with the arguments it needs to get that far.
BACKEND_COMMANDS = [
    ("check",),
    ("clean", "--pid", "999999"),
    ("stop", "r-20260101-000000-abcd"),
    ("serve", "--engine", "sim", "--model", "sim", "--port", "1"),
    ("tune", "study.yaml"),
    ("worker", "study"),
    ("slurm", "submit", "study.yaml", "--dry-run"),
]


@pytest.mark.parametrize("args", BACKEND_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_an_unknown_gpu_backend_is_an_input_error_before_anything_runs(
        args: tuple[str, ...], tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    env = {"CLEANSLATE_STORE": f"sqlite:///{db}"}
    done = run_cli(*args, "--gpu-backend", "nvidai", env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown GPU backend 'nvidai'" in done.stderr and "--gpu-backend" in done.stderr
    assert "choose one of auto" in done.stderr and "Traceback" not in done.stderr
    if db.exists():  # nothing was recorded before the option was checked
        with sqlite3.connect(db) as conn:
            tables = [r[0] for r in conn.execute("select name from sqlite_master")]
            assert all(conn.execute(f"select count(*) from {t}").fetchone()[0] == 0
                       for t in tables if t.startswith("cs_"))


def test_the_shared_options_read_the_same_in_every_command() -> None:
    helps = {}
    for command in ("check", "clean", "stop", "serve", "tune", "worker"):
        text = run_cli(command, "--help", env={"COLUMNS": "200"}).stdout
        helps[command] = " ".join(text.split())
    for command, text in helps.items():
        assert "How GPUs are read: auto (the first that works)" in text, command
    for command in ("clean", "stop", "serve", "tune"):
        assert "default $CLEANSLATE_STORE, else sqlite:///cleanslate.db" in helps[command]


@pytest.mark.parametrize("command", ["", "bench", "check", "serve", "tune", "clean", "stop",
                                     "report", "doctor", "worker", "slurm submit"])
def test_help_in_a_pipe_cuts_nothing(command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "cleanslate", *command.split(), "--help"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout, [line for line in done.stdout.splitlines() if "…" in line]
    if command == "bench":
        assert "random:input_len=1024,output_len=" in done.stdout
