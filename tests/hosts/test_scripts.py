"""One way to run a host script: the command, and every failure said in one form."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from cleanslate.hosts import CommandResult, LocalExecutor, ScriptResult, run_script
from cleanslate.hosts.scripts import parse_output, script_source


class Canned:
    """An executor that answers every command with one result and remembers what it ran."""

    name = "canned"
    python = "python3"
    is_local = False

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.ran: list[tuple[list[str], bytes | None]] = []

    async def run(self, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None) -> CommandResult:
        self.ran.append((list(argv), stdin))
        return self.result


def answer(stdout: bytes = b"", returncode: int | None = 0, *, stderr: bytes = b"",
           timed_out: bool = False) -> CommandResult:
    return CommandResult(("python3", "-I", "-S", "-", "{}"), returncode, stdout, stderr, 0.25,
                         timed_out=timed_out)


def run(result: CommandResult, payload: Mapping[str, object] | str = "{}",
        **kwargs: Any) -> tuple[ScriptResult[dict[str, Any]], Canned]:
    executor = Canned(result)
    done = asyncio.run(run_script(executor, "sim.ledger", payload, 5.0, output=dict,
                                  what="the reader", **kwargs))
    return done, executor


def test_the_source_goes_on_stdin_and_the_payload_as_json() -> None:
    done, executor = run(answer(b'{"ok": true}\n'), {"ports": [8000]})
    ((argv, stdin),) = executor.ran
    assert argv == ["python3", "-I", "-S", "-", '{"ports": [8000]}']
    assert stdin == script_source("sim.ledger")
    assert done.ok and done.output == {"ok": True} and done.elapsed_s == 0.25


def test_a_string_goes_as_it_is_and_site_packages_keep_their_flag() -> None:
    _, executor = run(answer(b"{}"), "/tmp/ledger", site_packages=True)
    assert executor.ran[0][0] == ["python3", "-I", "-", "/tmp/ledger"]


@pytest.mark.parametrize(("result", "why"), [
    (answer(timed_out=True, returncode=None), "timed out after 0.2 s"),
    (answer(returncode=3, stderr=b"Traceback\nValueError: boom\n"), "exited 3: ValueError: boom"),
    (answer(b""), "the reader printed nothing"),
    (answer(b"hello"), "the reader printed no JSON"),
    (answer(b'{"ok": true, "gpus": [{"ind'), "the reader printed truncated JSON (27 bytes)"),
    (answer(b"[1, 2]"), "the reader printed no JSON object"),
])
def test_every_failure_is_one_line(result: CommandResult, why: str) -> None:
    done, _ = run(result)
    assert not done.ok and done.output is None
    assert done.describe_failure().endswith(why)
    assert not done.no_python


@pytest.mark.parametrize("result", [
    answer(returncode=127, stderr=b"sh: python3: not found\n"),
    answer(returncode=2, stderr=b"env: 'python3': No such file or directory\n"),
])
def test_no_python_is_told_apart(result: CommandResult) -> None:
    done, _ = run(result)
    assert done.no_python and not done.ok


def test_parse_output_keeps_the_object() -> None:
    assert parse_output(b' {"a": [1]} \n') == ({"a": [1]}, None)


def test_a_real_script_on_this_machine(tmp_path: Any) -> None:
    done = asyncio.run(run_script(LocalExecutor(), "sim.ledger", str(tmp_path), 30.0,
                                  output=dict))
    assert done.ok, done.describe_failure()
    assert done.output is not None and json.loads(json.dumps(done.output))["ok"] is True
