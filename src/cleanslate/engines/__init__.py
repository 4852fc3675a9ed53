"""Engines: how each inference server is recognised, launched and diagnosed.

One adapter class per engine (``sglang``, ``vllm``, ``trtllm``, ``transformers``, ``llamacpp``,
``command``, ``sim``), registered under the name users write in YAML, carries everything the
rest of cleanslate knows about that engine: launch argv, readiness, crash patterns, flag
validation, its process signature, its ``/dev/shm`` leftovers and helper processes, its run
environment and GPU backend (:mod:`cleanslate.engines._base`), and which of its flags relax
each bottleneck (:class:`Relaxer` rows, :func:`relaxers`). Other packages ask the registry
(:func:`match_engine`, :func:`shm_patterns`, :func:`engine_class`) instead of naming engines::

    adapter = get_engine("vllm", launch=[python, "-m", "vllm.entrypoints.openai.api_server"])
    argv = adapter.build_argv(model, port, {"max-model-len": 512, "enforce-eager": True})
    ready = adapter.readiness_url(port)            # GET -> 200 when ready
    crash = adapter.classify_log(log_text)         # Crash(cause, line, line_number) | None
    await validate_flags(adapter, flags, executor) # InputError on unknown flags
    result = await smoke_test(adapter.base_url(port), model,
                              chat=adapter.supports_chat, completions=adapter.supports_completions)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

# The engine modules register their adapters when imported.
from cleanslate.engines import command as command
from cleanslate.engines import llamacpp as llamacpp
from cleanslate.engines import sglang as sglang
from cleanslate.engines import sim as sim
from cleanslate.engines import transformers as transformers
from cleanslate.engines import trtllm as trtllm
from cleanslate.engines import vllm as vllm
from cleanslate.engines._base import (
    RUNTIME_SHM_GLOBS,
    EngineAdapter,
    Leftovers,
    ProcessSignature,
    engine_class,
    engine_names,
    find_signature,
    get_engine,
    match_engine,
    metric_maps,
    register_engine,
    require_signature,
    shm_patterns,
    signatures,
)
from cleanslate.engines._crash import (
    CRASH_CAUSES,
    GENERIC_PATTERNS,
    Crash,
    CrashCause,
    CrashPattern,
    classify_text,
    crash_pattern,
    log_message,
)
from cleanslate.engines._flags import Flags, FlagValue, flag_args, option_name
from cleanslate.engines._help import (
    FlagValidation,
    check_flags,
    engine_help_options,
    parse_help_options,
    validate_flags,
)
from cleanslate.engines._relax import (
    RELAX_DIRECTIONS,
    RelaxDirection,
    Relaxer,
    register_relaxers,
    relax_engines,
    relaxers,
)

if TYPE_CHECKING:
    from cleanslate.engines._smoke import (
        PromptOutput,
        SmokeCause,
        SmokeResult,
        smoke_test,
    )
    from cleanslate.outputs import has_nan_marker, is_degenerate

# The smoke test needs aiohttp: it loads when used, which keeps `cleanslate check` quick.
__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("PromptOutput", "SmokeCause", "SmokeResult", "smoke_test"),
                    "cleanslate.engines._smoke"),
    **dict.fromkeys(("has_nan_marker", "is_degenerate"), "cleanslate.outputs")})


def classify_log(engine: str, text: str, *, returncode: int | None = None) -> Crash | None:
    """Classify a failure of ``engine`` from its log ``text`` (and exit status, if known).

    Returns the cause and the root-cause line, or ``None`` when the log shows no failure. The
    engine's own patterns are used with the generic ones; an unknown engine name is an
    :class:`~cleanslate.errors.InputError`. Usable on a partial log (while a server starts).
    """
    adapter_cls = engine_class(engine)
    patterns = (*adapter_cls.crash_patterns, *GENERIC_PATTERNS)
    return classify_text(text, patterns, returncode=returncode, engine=engine)


__all__ = [
    "CRASH_CAUSES",
    "GENERIC_PATTERNS",
    "RELAX_DIRECTIONS",
    "RUNTIME_SHM_GLOBS",
    "Crash",
    "CrashCause",
    "CrashPattern",
    "EngineAdapter",
    "FlagValidation",
    "FlagValue",
    "Flags",
    "Leftovers",
    "ProcessSignature",
    "PromptOutput",
    "RelaxDirection",
    "Relaxer",
    "SmokeCause",
    "SmokeResult",
    "check_flags",
    "classify_log",
    "classify_text",
    "crash_pattern",
    "engine_class",
    "engine_help_options",
    "engine_names",
    "find_signature",
    "flag_args",
    "get_engine",
    "has_nan_marker",
    "is_degenerate",
    "log_message",
    "match_engine",
    "metric_maps",
    "option_name",
    "parse_help_options",
    "register_engine",
    "register_relaxers",
    "relax_engines",
    "relaxers",
    "require_signature",
    "shm_patterns",
    "signatures",
    "smoke_test",
    "validate_flags",
]
