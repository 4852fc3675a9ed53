"""The one lazy-import helper: a package exports names whose modules load on first use.

A package whose public names need a heavy stack (Optuna, SQLAlchemy, aiohttp, numpy, asyncssh)
lists them here instead of importing them, so that importing the package, or a light module of
it, stays quick (``cleanslate --help``, ``cleanslate check``)::

    if TYPE_CHECKING:                      # what the type checker and readers see
        from cleanslate.tune.study import StudySpec

    __getattr__, __dir__ = lazy_exports(__name__, {"StudySpec": "cleanslate.tune.study"})

The mapping is the truth at run time; the ``TYPE_CHECKING`` imports repeat it for the type
checker. ``tests/test_import_graph.py`` reads the mapping as imports of those modules (a lazy
import is still a dependency), and ``tests/test_public_api.py`` checks that every name resolves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package`` that import ``names[name]``
    (an absolute module name) the first time ``name`` is read, and cache the value in the
    package's namespace. Any other name is an :class:`AttributeError`, as for any module."""
    where = dict(names)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *where})

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
