"""Names shared by the rooms, defined once: the run marker's name and the registry of classes.

Standard library only: every package may import it. The stdlib-only host scripts
(``probe/_collect_script.py`` and the others shipped to a host's ``python3``) cannot import the
package and spell the marker's name themselves.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T", bound=type[Any])

#: The environment variable that marks every process of a run with its run id: the launcher
#: sets it, the probe reads it from ``/proc/N/environ``, the rules call a marked process a stray.
RUN_MARKER_ENV = "CLEANSLATE_RUN"


class Registry(dict[str, T]):
    """Classes by the name users write (engines, GPU backends): a name is registered once, by
    one class; a second class under the same name is a :class:`ValueError` (two classes for one
    name would silently disagree). Registering the same class again is harmless (a re-import)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def refuse_duplicate(self, name: str, cls: T) -> None:
        """A :class:`ValueError` when another class is registered as ``name``."""
        existing = self.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"{self.what} {name!r} is already registered by "
                             f"{existing.__module__}.{existing.__qualname__}")

    def add(self, name: str, cls: T) -> None:
        self.refuse_duplicate(name, cls)
        self[name] = cls
