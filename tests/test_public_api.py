"""Every package of ``src/cleanslate`` curates its public names in ``__all__``, and every name it
lists resolves: eagerly imported, exported lazily through :mod:`cleanslate._lazy`, or (for
``cleanslate.testing``) a submodule. Importing a package stays light: ``cleanslate --help``
loads none of the heavy stacks."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from tests.test_import_graph import SRC, module_files

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
