"""Run a stdlib-only script of this package on a host and read the JSON object it prints.

Every script goes the same way: its source, read once from the package, on the stdin of
``executor.python -I -S - ARG`` (on stdin, not in argv, so the script's command line stays
short in the process table that a concurrent probe lists), with its one argument ``ARG``: the
payload as JSON, or a string as it is. What can go wrong is said in one form,
:meth:`ScriptResult.describe_failure`: a timeout, a non-zero exit, no ``python3`` on the host
(:attr:`ScriptResult.no_python`, where the probe falls back to ``ps`` and ``ls``), no JSON,
truncated JSON, or JSON that is not an object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar, cast

from cleanslate.hosts.base import CommandResult, Executor

_Output = TypeVar("_Output", bound=Mapping[str, Any])


@cache
def script_source(name: str) -> bytes:
    """The source of the script ``name``: a module's name under ``cleanslate``
    (``probe._collect_script`` is ``cleanslate/probe/_collect_script.py``)."""
    package, _, module = f"cleanslate.{name}".rpartition(".")
    return resources.files(package).joinpath(f"{module}.py").read_bytes()


def script_argv(executor: Executor, payload: Mapping[str, object] | str, *,
                site_packages: bool = False) -> list[str]:
    """The command that runs a script sent on stdin; ``site_packages`` for a script that
    imports an optional package of the host's Python (the doctor's ``pynvml``)."""
    arg = payload if isinstance(payload, str) else json.dumps(payload)
    return [executor.python, "-I", *(() if site_packages else ("-S",)), "-", arg]


def no_python(result: CommandResult) -> bool:
    """Whether the command failed because the host has no such Python (exit 127, or a shell's
    ``not found``), as opposed to one that timed out or a host that cannot be reached."""
    if result.timed_out or result.returncode is None:
        return False
    if result.returncode == 127:
        return True
    text = result.stderr.decode(errors="replace").lower()
    return result.returncode != 0 and "python" in text and (
        "not found" in text or "no such file" in text)


@dataclass(frozen=True)
class ScriptResult(Generic[_Output]):
    """What a script did: its output (``None`` when it failed), and why it failed."""

    what: str
    command: CommandResult
    output: _Output | None = None
    unparsed: str | None = None

    @property
    def ok(self) -> bool:
        return self.output is not None

    @property
    def no_python(self) -> bool:
        """The host has no ``python3`` to run the script (the probe's fallback case)."""
        return no_python(self.command)

    @property
    def elapsed_s(self) -> float:
        return self.command.elapsed_s

    def describe_failure(self) -> str:
        """One line saying why there is no output, for findings and errors."""
        if not self.command.ok:
            return self.command.describe_failure()
        return f"{self.what} {self.unparsed or 'printed no JSON'}"


def parse_output(stdout: bytes) -> tuple[Mapping[str, Any] | None, str | None]:
    """A script's JSON object, or why there is none (``printed no JSON`` and the like)."""
    text = stdout.decode(errors="replace").strip()
    if not text:
        return None, "printed nothing"
    try:
        data = json.loads(text)
    except ValueError:
        if text.startswith(("{", "[")) and not text.endswith(("}", "]")):
            return None, f"printed truncated JSON ({len(stdout)} bytes)"
        return None, "printed no JSON"
    if not isinstance(data, dict):
        return None, "printed no JSON object"
    return data, None


async def run_script(executor: Executor, name: str, payload: Mapping[str, object] | str,
                     timeout: float, *, output: type[_Output], what: str | None = None,
                     site_packages: bool = False) -> ScriptResult[_Output]:
    """Run the script ``name`` (see :func:`script_source`) on the executor's host with
    ``timeout`` seconds; ``output`` is the shape of the object it prints, ``what`` names it in
    failures (``the doctor's host script``). Never raises for a host-side failure."""
    what = what or f"the host script {name}"
    command = await executor.run(script_argv(executor, payload, site_packages=site_packages),
                                 timeout=timeout, stdin=script_source(name))
    if not command.ok:
        return ScriptResult(what, command)
    data, unparsed = parse_output(command.stdout)
    return ScriptResult(what, command, cast(_Output | None, data), unparsed)


__all__ = ["ScriptResult", "no_python", "parse_output", "run_script", "script_argv",
           "script_source"]
