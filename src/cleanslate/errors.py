"""Errors users can act on.

An :class:`InputError` is a user mistake (a bad flag, a bad file, a bad value): the command line
prints its message, without a traceback, and exits with code 2. ``where`` names the place of the
mistake (``study.yaml:12`` or ``--gpus``) and ``hint`` says what to do about it.
"""

from __future__ import annotations


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
