"""The engine adapter contract, as checks a test suite runs on every adapter.

``tests/engines/test_contract.py`` runs :func:`check_engine` on every registered engine; an
adapter written outside cleanslate can be held to the same contract from its own tests::

    from cleanslate.testing.engine_contract import check_engine

    def test_my_engine_keeps_the_contract(tmp_path):
        check_engine(MyEngine, tmp_path)                     # constructor options, if any, after

Each ``check_*`` function states one clause of the contract in its docstring and raises
:class:`AssertionError` saying what broke it. No test framework is needed; no process is
started, no file is written outside ``artifacts``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from cleanslate.engines import (
    EngineAdapter,
    engine_class,
    match_engine,
    option_name,
    shm_patterns,
)
from cleanslate.errors import InputError
from cleanslate.probe.gpu import backend_names

#: What the checks launch: a model name and a port that no adapter has as a default.
MODEL = "contract-model"
PORT = 12345
#: Flags appended by every adapter after what it places itself, in this order.
FLAGS: dict[str, Any] = {"contract-flag": "v", "contract-switch": True, "contract-off": False}
FLAG_ARGS = ["--contract-flag", "v", "--contract-switch"]


def check_registered(cls: type[EngineAdapter]) -> None:
    """The registry answers the adapter's name with the adapter itself."""
    assert isinstance(cls.name, str) and cls.name, f"{cls.__qualname__}: no name"
    try:
        registered = engine_class(cls.name)
    except InputError:
        raise AssertionError(f"engine {cls.name!r} is not registered") from None
    assert registered is cls, f"engine {cls.name!r} is registered as another class"


def check_class_attributes(cls: type[EngineAdapter]) -> None:
    """A default port in 1-65535, a readiness path starting with ``/``, a description, reserved
    flags spelled with their dashes, a GPU backend hint that names a registered backend,
    boolean capabilities."""
    assert 0 < cls.default_port < 65536, f"{cls.name}: default port {cls.default_port}"
    assert cls.default_readiness_path.startswith("/"), f"{cls.name}: readiness path"
    assert isinstance(cls.description, str) and cls.description, f"{cls.name}: no description"
    for flag in cls.reserved_flags:
        assert flag.startswith("-"), f"{cls.name}: reserved flag {flag!r} without its dashes"
    assert cls.gpu_backend is None or cls.gpu_backend in backend_names(), (
        f"{cls.name}: GPU backend {cls.gpu_backend!r} is not registered")
    for flag in ("local_python", "argv_template", "simulated"):
        assert isinstance(getattr(cls, flag), bool), f"{cls.name}: {flag} is not a bool"


def check_argv(adapter: EngineAdapter) -> None:
    """``build_argv`` places the model and the port (the default one when none is given) and
    appends the user's flags last, ``false`` omitted; every item is a string."""
    argv = adapter.build_argv(MODEL, PORT, FLAGS)
    assert all(isinstance(a, str) for a in argv), f"{adapter.name}: {argv!r}"
    assert any(MODEL in a for a in argv), f"{adapter.name}: no model in {argv!r}"
    assert any(str(PORT) in a for a in argv), f"{adapter.name}: no port in {argv!r}"
    assert argv[-len(FLAG_ARGS):] == FLAG_ARGS, f"{adapter.name}: flags not last in {argv!r}"
    default = adapter.build_argv(MODEL)
    assert any(str(adapter.default_port) in a for a in default), (
        f"{adapter.name}: the default port is not in {default!r}")


def check_reserved_flags(adapter: EngineAdapter) -> None:
    """A user flag that repeats what the adapter places (port, host, model) is an
    :class:`InputError` that names the flag (``where="flags.NAME"``)."""
    reserved = set(adapter.reserved_flags)
    if adapter.model_flag is not None:
        reserved.add(adapter.model_flag)
    for flag in sorted(reserved):
        key = flag.lstrip("-")
        assert option_name(key) == flag, f"{adapter.name}: {flag!r} is not spelled as {key!r}"
        try:
            adapter.build_argv(MODEL, PORT, {key: "x"})
        except InputError as exc:
            assert exc.where == f"flags.{key}", f"{adapter.name}: where={exc.where!r}"
        else:
            raise AssertionError(f"{adapter.name}: the reserved flag {flag} was accepted")


def check_signature(adapter: EngineAdapter) -> None:
    """The signature is ``None`` or the engine's own; a process running the argv the adapter
    builds is recognised as this engine, and as no other."""
    signature = adapter.signature
    if signature is None:
        return
    assert signature.engine == adapter.name, f"{adapter.name}: signature of {signature.engine}"
    argv = adapter.build_argv(MODEL, PORT)
    assert signature.matches("contract-comm", argv), (
        f"{adapter.name}: its signature does not match its own argv {argv!r}")
    found = match_engine("contract-comm", argv)
    assert found == adapter.name, f"{adapter.name}: its argv is recognised as {found!r}"


def check_leftovers(cls: type[EngineAdapter]) -> None:
    """The ``/dev/shm`` globs are file-name patterns with a literal part (a bare ``*`` would
    report every file), all reported by ``check`` (:func:`cleanslate.engines.shm_patterns`);
    helper process names are non-empty."""
    reported = set(shm_patterns())
    for glob in cls.leftovers.shm_globs:
        assert isinstance(glob, str) and glob, f"{cls.name}: empty /dev/shm glob"
        assert "/" not in glob and "\0" not in glob, f"{cls.name}: {glob!r} is not a file name"
        assert glob.strip("*?[]!"), f"{cls.name}: {glob!r} matches any name"
        assert glob in reported, f"{cls.name}: {glob!r} is not among the collector's patterns"
    for name in cls.leftovers.process_names:
        assert isinstance(name, str) and name, f"{cls.name}: empty helper process name"


def check_readiness(adapter: EngineAdapter) -> None:
    """Readiness is a path under the server's base URL, ``http://127.0.0.1:PORT``."""
    assert adapter.readiness_path.startswith("/"), f"{adapter.name}: {adapter.readiness_path!r}"
    assert adapter.base_url(PORT) == f"http://127.0.0.1:{PORT}"
    assert adapter.readiness_url(PORT) == adapter.base_url(PORT) + adapter.readiness_path


def check_logs(adapter: EngineAdapter) -> None:
    """An empty log (a server that has not written yet) is no failure."""
    assert adapter.classify_log("") is None, f"{adapter.name}: an empty log is a crash"


def check_help(adapter: EngineAdapter) -> None:
    """The help command is ``None`` (flags are not validated) or a non-empty list of strings."""
    argv = adapter.help_argv()
    assert argv is None or (isinstance(argv, list) and argv
                            and all(isinstance(a, str) for a in argv)), (
        f"{adapter.name}: help_argv() returned {argv!r}")


def check_environment(cls: type[EngineAdapter], artifacts: Path) -> None:
    """``prepare_env`` keeps the user's variables, gives strings, and leaves this process's
    environment as it was."""
    before = dict(os.environ)
    env = cls.prepare_env({"CONTRACT_VARIABLE": "1"}, artifacts)
    assert dict(os.environ) == before, f"{cls.name}: prepare_env changed os.environ"
    assert env.get("CONTRACT_VARIABLE") == "1", f"{cls.name}: the user's env was dropped"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


def check_interpreter(cls: type[EngineAdapter], options: dict[str, Any]) -> None:
    """An engine whose default interpreter is ours (``local_python``) gets ``sys.executable``;
    a ``python`` option replaces it."""
    if not cls.local_python:
        return
    assert cls(**options).python == sys.executable, f"{cls.name}: not sys.executable"
    assert cls(**options, python="/opt/py").python == "/opt/py", f"{cls.name}: python ignored"


def check_template(cls: type[EngineAdapter], options: dict[str, Any]) -> None:
    """An engine started from an argv template cannot be built without its ``argv``."""
    if not cls.argv_template:
        return
    rest = {k: v for k, v in options.items() if k != "argv"}
    try:
        cls(**rest)
    except InputError:
        return
    raise AssertionError(f"{cls.name}: built without its argv template")


def check_engine(cls: type[EngineAdapter], artifacts: Path, **options: Any) -> None:
    """Every clause above, on the adapter built with ``options`` (its constructor's)."""
    check_registered(cls)
    check_class_attributes(cls)
    check_leftovers(cls)
    check_environment(cls, artifacts)
    check_interpreter(cls, options)
    check_template(cls, options)
    adapter = cls(**options)
    check_argv(adapter)
    check_reserved_flags(adapter)
    check_signature(adapter)
    check_readiness(adapter)
    check_logs(adapter)
    check_help(adapter)
