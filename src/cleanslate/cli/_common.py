"""Helpers shared by the command modules: consoles, exit codes, option parsing."""

from __future__ import annotations

from rich.console import Console

from cleanslate.errors import InputError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_UNKNOWN = 3

console = Console(highlight=False)
console_err = Console(stderr=True, highlight=False)


def parse_int_list(value: str | None, *, option: str) -> list[int] | None:
    """Parse ``"0,1,3"`` into ``[0, 1, 3]``; ``None`` stays ``None``."""
    if value is None or value.strip() == "":
        return None
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise InputError(
                f"{part!r} is not an integer", where=option, hint="write a list like 0,1,2"
            ) from None
    return out
