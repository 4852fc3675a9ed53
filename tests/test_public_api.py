"""Every package of ``src/cleanslate`` curates its public names in ``__all__``, and every name it
lists resolves: eagerly imported, exported lazily through :mod:`cleanslate._lazy`, or (for
``cleanslate.testing``) a submodule. Importing a package stays light: ``cleanslate --help``
loads none of the heavy stacks."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys

import pytest

from tests._kit import SRC, module_files

MODULES = set(module_files())
PACKAGES = sorted(name for name, path in module_files().items() if path.name == "__init__.py")


def test_every_package_is_found() -> None:
    assert {"cleanslate.launch", "cleanslate.probe", "cleanslate.teardown",
            "cleanslate.verdict", "cleanslate.probe.gpu"} <= set(PACKAGES)
    assert (SRC / "cleanslate" / "launch" / "__init__.py").is_file()


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_resolves(package: str) -> None:
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    assert names, f"{package} has no __all__"
    assert len(set(names)) == len(names), f"{package}.__all__ repeats a name"
    for name in names:
        try:
            getattr(module, name)
        except AttributeError:
            importlib.import_module(f"{package}.{name}")  # a submodule (cleanslate.testing)
    assert set(names) <= set(dir(module)) | {
        n for n in names if importlib.util.find_spec(f"{package}.{n}") is not None}


def test_a_lazy_name_is_the_module_attribute_itself() -> None:
    import cleanslate.bench._runner as runner
    import cleanslate.launch
    import cleanslate.launch.lifecycle as lifecycle
    from cleanslate.bench import run_benchmark

    assert run_benchmark is runner.run_benchmark
    assert cleanslate.launch.start_server is lifecycle.start_server
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cleanslate.launch.nope  # noqa: B018


HEAVY = ("sqlalchemy", "optuna", "aiohttp", "numpy", "matplotlib", "asyncssh")


def test_importing_the_packages_loads_no_heavy_stack() -> None:
    """The command line's module and the light packages import none of the heavy stacks (the
    names that need them load on first use)."""
    code = ("import sys, cleanslate.cli, cleanslate.launch, cleanslate.tune, cleanslate.probe, "
            "cleanslate.verdict, cleanslate.teardown, cleanslate.sim, cleanslate.hosts, "
            "cleanslate.bench, cleanslate.engines\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def _private_module_of_another_package(importer: str, target: str) -> bool:
    """``target`` is a private module (a part after the package starting with ``_``) of a
    top-level package other than ``importer``'s. A private module directly in ``cleanslate/``
    (``cleanslate._lazy``, ``cleanslate._types``) is the house's own, there for every package."""
    parts = target.split(".")
    if len(parts) < 3 or parts[0] != "cleanslate":
        return False
    return (any(p.startswith("_") and p != "__init__" for p in parts[2:])
            and importer.split(".")[1:2] != parts[1:2])


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, module)`` for every import anywhere in ``tree``: eager, inside a function, under
    ``TYPE_CHECKING``; ``from pkg import _mod`` names ``pkg._mod`` when that is a module (a
    private function is not a module); a ``lazy_exports`` mapping names its modules."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: None if is_package else -1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if alias.name.startswith("_") and f"{base}.{alias.name}" in MODULES]
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports"
              and len(node.args) > 1):
            found += [(node.lineno, value.value) for value in ast.walk(node.args[1])
                      if isinstance(value, ast.Constant) and isinstance(value.value, str)]
    return found


def test_the_private_module_rule_sees_every_kind_of_import() -> None:
    code = ("from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from cleanslate.bench._models import Stats\n"
            "def f():\n    import cleanslate.store._trials\n"
            "from cleanslate.engines import _flags\n"
            "from . import _own\n"
            "from cleanslate._lazy import lazy_exports\n")
    imports = _imports(ast.parse(code), "cleanslate.report._data", False)
    private = {m for _, m in imports if _private_module_of_another_package(
        "cleanslate.report._data", m)}
    assert private == {"cleanslate.bench._models", "cleanslate.store._trials",
                       "cleanslate.engines._flags"}


def test_no_package_imports_another_packages_private_module() -> None:
    """A package's modules with a leading underscore are its own: another package uses the names
    its ``__init__`` exports (lazily where they are heavy), so a module can be moved or split
    inside its package without touching the rest of the house."""
    offenders = []
    for module, path in module_files().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, target in _imports(tree, module, path.name == "__init__.py"):
            if _private_module_of_another_package(module, target):
                offenders.append(f"{path.relative_to(SRC)}:{line}: {target}")
    assert offenders == [], f"{len(offenders)} imports of another package's private module:\n" \
        + "\n".join(offenders)
