"""Errors users can act on, and the exit codes of every command.

An :class:`InputError` is a user mistake (a bad flag, a bad file, a bad value): the command line
prints its message, without a traceback, and exits with code 2. ``where`` names the place of the
mistake (``study.yaml:12`` or ``--gpus``) and ``hint`` says what to do about it. A pydantic
validation becomes one through :meth:`InputError.from_validation`, the one converter.

:class:`ExitCode` is the exit status of every command, ``cleanslate sim`` included; it is defined
here and nowhere else.

Standard library only: everything imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotation only: this module imports nothing outside the stdlib
    from pydantic import ValidationError

#: A location in a validated document, as pydantic gives it: field names and list indices.
Loc = tuple[int | str, ...]


class ExitCode(IntEnum):
    """The exit status of every command (``README.md``, ``docs/architecture.md``)."""

    #: clean, or the command did what it was asked
    OK = 0
    #: dirty, or the command failed (a server that did not start, failed requests)
    FAILED = 1
    #: a usage or input error: nothing was done, the message says what to change
    INPUT = 2
    #: unknown: the state could not be determined (host unreachable, probe failed or timed
    #: out); never reported as clean
    UNKNOWN = 3


class CleanslateError(Exception):
    """Base class of the errors this package raises on purpose."""


class InputError(CleanslateError):
    """Bad input from the user: exit code 2, never a traceback."""

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    @classmethod
    def from_validation(
        cls,
        exc: ValidationError,
        *,
        what: str | None = None,
        where: str | None = None,
        hint: str | None = None,
        limit: int = 1,
        options: Mapping[str, str] | None = None,
        default_option: Callable[[Loc], str | None] | None = None,
        line_of: Callable[[Loc], int | None] | None = None,
        scrub: Callable[[str], str] | None = None,
    ) -> InputError:
        """The errors of a pydantic validation as one :class:`InputError`.

        Each error reads ``location: message`` (``tp-size: Input should be ...``); pydantic's
        ``Value error,`` prefix and its internal ``function-...`` location parts are left out.
        ``what`` goes first (``not a cleanslate baseline: ...``). The first ``limit`` errors
        are listed (one per line when there are several), then how many more there were (not
        with ``options``: on the command line the first error is the one to fix).

        - ``options``: the command-line option of each field (``{"num_prompts":
          "--num-prompts"}``): an error's ``where`` becomes the option of the innermost field
          its location names (else ``default_option(location)``, else ``where``), and its
          message is phrased for that option (``must be at least 1, not 0``,
          ``unknown arrival 'bursty' (expected ...)``).
        - ``line_of``: the line of a location in the file ``where`` names (YAML): ``where``
          becomes ``file:line`` of the first error and each error says its line.
        - ``scrub``: applied to locations and messages (a store's records: no secret printed).
        """
        clean = scrub or (lambda text: text)
        errors = list(exc.errors())
        shown: list[str] = []
        first_where = where
        for index, err in enumerate(errors[: max(1, limit)]):
            loc: Loc = tuple(p for p in err["loc"]
                             if not (isinstance(p, str) and p.startswith("function-")))
            message = str(err["msg"]).removeprefix("Value error, ")
            place = ".".join(map(str, loc))
            if options is not None:
                field = next((p for p in reversed(loc) if isinstance(p, str) and p in options),
                             None)
                option = options[field] if field is not None else (
                    default_option(loc) if default_option is not None else None)
                message = _for_option(err, loc, message)
                place = ""
                if index == 0 and option is not None:
                    first_where = option
                elif option is not None:
                    place = option
            text = f"{clean(place)}: {clean(message)}" if place else clean(message)
            if line_of is not None:
                line = line_of(loc)
                if line is not None:
                    text += f" (line {line})"
                    if index == 0 and where is not None:
                        first_where = f"{where}:{line}"
            shown.append(text)
        if len(shown) == 1:
            # On the command line, the first error is the one to fix (the others follow from
            # it, e.g. a list left empty by its one bad item).
            more = len(errors) - 1 if options is None else 0
            body = shown[0] + (f" (and {more} more)" if more else "")
        else:
            body = f"{len(errors)} problems:" + "".join(f"\n  {text}" for text in shown)
            if len(errors) > len(shown):
                body += f"\n  ... and {len(errors) - len(shown)} more"
        message = f"{what}: {body}" if what else body
        return cls(message, where=first_where, hint=hint)


def _for_option(err: Mapping[str, Any], loc: Sequence[int | str], message: str) -> str:
    """A pydantic bound or choice error phrased for the command-line option that set it."""
    ctx = err.get("ctx") or {}
    value = err.get("input")
    kind = err.get("type")
    bounds = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "more than"),
              "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}
    if kind in bounds and bounds[kind][0] in ctx:
        key, words = bounds[kind]
        return f"must be {words} {_number(ctx[key])}, not {_number(value)}"
    if kind == "literal_error" and "expected" in ctx:
        field = next((str(p) for p in reversed(loc) if isinstance(p, str)), "value")
        return f"unknown {field.replace('_', ' ')} {value!r} (expected {ctx['expected']})"
    return message


def _number(value: object) -> str:
    """``0.0`` -> ``0``, ``0.001`` -> ``0.001``: a bound as a user would write it."""
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["CleanslateError", "ExitCode", "InputError", "Loc"]
