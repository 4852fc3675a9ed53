"""Flag validation against the engine's own ``--help``, run on the target host before launch.

:func:`parse_help_options` reads the option names out of help text in the styles engines use:

- argparse (vLLM, SGLang, trtllm-serve's click is similar): ``  --tp-size TP_SIZE, --tp TP_SIZE``,
  ``  --enable-x, --no-enable-x``, ``  -h, --help``;
- click / typer, plain or in rich boxes (``transformers serve``): ``│ --port  INTEGER ...│``,
  ``--compile / --no-compile``, ``--flag  --no-flag``;
- llama.cpp: ``-ngl,  --gpu-layers, --n-gpu-layers N``.

Only lines that *start* with an option (after indentation and box borders) are read, so options
merely mentioned in a description do not count.

:func:`check_flags` raises :class:`InputError` for unknown flags with the closest valid
spellings (``difflib``), and :func:`validate_flags` runs the adapter's help command through an
:class:`~cleanslate.hosts.base.Executor`. When the engine is not installed on the host (the help
command cannot start, exits 127, or prints no option), validation is skipped with a note: the
launch will then fail on its own, and that failure is classified from the log.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cleanslate.engines._base import EngineAdapter
from cleanslate.engines._flags import Flags, flag_names
from cleanslate.errors import InputError
from cleanslate.hosts.base import Executor

_BOX = "│┃|║╎╏┆┇┊┋"
# An option token: -x or --long-name, optionally followed by =VALUE or [=VALUE].
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?)(?![\w*-])")
# Option lines are indented a little; wrapped descriptions a lot (argparse: 24, click: 34).
_MAX_INDENT = 12
# click's "--flag / --no-flag" and argparse's "--[no-]flag"
_NO_PREFIX = re.compile(r"--\[no-\]([\w.-]+)")


def _option_head(line: str) -> str | None:
    """The part of a help line that lists option spellings, or ``None`` if it lists none."""
    text = line.rstrip().rstrip(_BOX).rstrip()
    if text.lstrip()[:1] in set(_BOX):
        text = text.lstrip()[1:]
    stripped = text.lstrip()
    if len(text) - len(stripped) > _MAX_INDENT:
        return None
    text = stripped
    if not text.startswith("-") or text.startswith("---"):
        return None
    # The spellings end where the description starts: at a run of two or more spaces, except
    # that click/typer separate "--flag  --no-flag" and "-x  --long" with two spaces as well.
    parts = re.split(r"\s{2,}", text)
    head = parts[0]
    for part in parts[1:]:
        if part.startswith("-") and not part.startswith("---"):
            head += " " + part
        else:
            break
    return head


def parse_help_options(text: str) -> set[str]:
    """The option names (``--tp-size``, ``-c``) that a ``--help`` output declares."""
    options: set[str] = set()
    for line in text.splitlines():
        head = _option_head(line)
        if head is None:
            continue
        for match in _NO_PREFIX.finditer(head):
            options.update({f"--{match.group(1)}", f"--no-{match.group(1)}"})
        head = _NO_PREFIX.sub("", head)
        for match in _OPTION.finditer(head):
            token = match.group(1).rstrip(".,;:")
            # "-x" tokens in a metavar position ("--level -1") are not options: only take those
            # that start the head or follow a comma, slash or another option.
            before = head[: match.start()].rstrip()
            after_metavar = (
                bool(before)
                and before[-1] not in ",/"
                and not _OPTION.fullmatch(before.split()[-1])
            )
            if after_metavar and not token.startswith("--"):
                continue  # "-1" after a metavar is a value, not an option
            options.add(token)
    options.discard("--")
    return options


def closest(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` valid spellings closest to ``name`` (underscores read as dashes first)."""
    pool = sorted(set(valid))
    normalized = name.replace("_", "-")
    if normalized != name and normalized in pool:
        return [normalized]
    return difflib.get_close_matches(normalized, pool, n=n, cutoff=0.6)


def check_flags(flags: Flags | None, valid: set[str], *, engine: str,
                where: str = "flags", adapter: EngineAdapter | None = None) -> list[str]:
    """Raise :class:`InputError` naming every flag the engine would reject, with suggestions;
    return warnings for flags it accepts but that need a word (deprecated ones, abbreviations).

    With an ``adapter``, flags are spelled as that engine spells them (its multi-letter short
    options), a unique prefix of a long option is accepted where the engine's parser allows it
    (and an ambiguous one refused with both candidates, as argparse does), and flags the engine
    renamed or removed get version-aware messages ("removed in 0.5.20: use ...").
    """
    short = adapter.short_options if adapter is not None else frozenset()
    changes = adapter.flag_changes if adapter is not None else {}
    abbrev = adapter.allows_abbrev if adapter is not None else False
    lines: list[str] = []
    warnings: list[str] = []
    for name in flag_names(flags, short):
        change = changes.get(name)
        if name in valid:
            if change is not None and not change.removed:
                warnings.append(change.describe(name, engine))
            continue
        if change is not None:
            lines.append(change.describe(name, engine) + ("" if change.removed else
                         " (and this build does not list it)"))
            continue
        if abbrev and name.startswith("--"):
            matches = sorted(v for v in valid if v.startswith(name))
            if len(matches) == 1:
                warnings.append(f"{name} is taken by {engine} as {matches[0]} (a unique "
                                "prefix); write it in full to be safe across versions")
                continue
            if len(matches) > 1:
                lines.append(f"{name} is ambiguous: it could be {' or '.join(matches[:4])}"
                             + (f" (and {len(matches) - 4} more)" if len(matches) > 4 else ""))
                continue
        single = name.lstrip("-")
        if name.startswith("--") and f"-{single}" in valid:
            lines.append(f"{name} (did you mean -{single}? write the key with its dash, "
                         f"`-{single}:`)")
            continue
        near = closest(name, valid)
        lines.append(f"{name}" + (f" (did you mean {' or '.join(near)}?)" if near else ""))
    if lines:
        command = adapter.help_command() if adapter is not None else f"{engine} --help"
        raise InputError(
            f"unknown {engine} flag{'s' if len(lines) > 1 else ''}: " + "; ".join(lines),
            where=where,
            hint=f"the names come from `{command}` on the host; spell flags as the engine "
            "does, without leading dashes (mem-fraction-static: 0.9)",
        )
    return warnings


@dataclass(frozen=True)
class FlagValidation:
    """Outcome of :func:`validate_flags` when it did not raise.

    ``checked`` is ``False`` when validation was skipped; ``note`` then says why (engine not
    installed, help command failed, no help command for this engine).
    """

    checked: bool
    options: frozenset[str] = frozenset()
    note: str | None = None
    warnings: tuple[str, ...] = ()


async def engine_help_options(
    adapter: EngineAdapter, executor: Executor, *, timeout: float = 120.0
) -> tuple[set[str] | None, str | None]:
    """Run the adapter's help command on the host: (options, None) or (None, why not)."""
    argv = adapter.help_argv()
    if not argv:
        return None, f"engine {adapter.name} has no help command; flags not validated"
    result = await executor.run(argv, timeout=timeout)
    shown = " ".join(argv)
    if result.error is not None or result.returncode == 127:
        return (
            None,
            f"`{shown}` could not run on {executor.name} (engine not installed?); "
            "flags not validated",
        )
    if result.timed_out:
        return None, f"`{shown}` timed out after {timeout:.0f} s; flags not validated"
    text = (result.stdout + b"\n" + result.stderr).decode(errors="replace")
    options = parse_help_options(text)
    if result.returncode != 0 or len(options) < 2:
        return None, f"{result.describe_failure()}; flags not validated"
    return options, None


async def validate_flags(
    adapter: EngineAdapter,
    flags: Flags | None,
    executor: Executor,
    *,
    timeout: float = 120.0,
    where: str = "flags",
) -> FlagValidation:
    """Check ``flags`` against the engine's ``--help`` on the host of ``executor``.

    Raises :class:`InputError` (exit code 2) for unknown flags; returns a skipped
    :class:`FlagValidation` with a note when the help command is unavailable.
    """
    options, note = await engine_help_options(adapter, executor, timeout=timeout)
    if options is None:
        return FlagValidation(checked=False, note=note)
    warnings = check_flags(flags, options, engine=adapter.name, where=where, adapter=adapter)
    return FlagValidation(checked=True, options=frozenset(options), warnings=tuple(warnings))
