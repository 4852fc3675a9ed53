"""SGLang: ``python -m sglang.launch_server --model-path M --port P``.

Processes (titles set with ``setproctitle`` in SGLang 0.5.23; the kernel's ``comm`` keeps the
first 15 characters, ``sglang::schedul``): the launcher (tokenizer manager + HTTP server) starts
``sglang::scheduler`` with suffixes ``_DP<d>``, ``_PP<p>``, ``_ATTN_CP<c>``, ``_MOE_DP<m>``,
``_TP<t>`` (only when tp > 1: one GPU shows plain ``sglang::scheduler``) and ``_EP<e>``,
``sglang::detokenizer``, ``sglang::data_parallel_controller``, ``sglang::detokenizer_router``,
``sglang::tokenizer_worker:<pid>``, and for diffusion models ``sgl_diffusion::scheduler...``.
Schedulers hold the GPU memory and can outlive the launcher under PID 1. ``/health`` answers 200
once the server is up (``/health_generate`` also runs one decode step; the smoke test does that
job here).

Flags: SGLang's parser takes a unique prefix of a long option (``--tp 2`` is ``--tp-size 2``),
so the validator does too, and refuses an ambiguous one as SGLang does. :data:`FLAG_CHANGES`
gives version-aware messages for flags the seeds of this project used that later versions
renamed (0.5.20 removed the ``--nsa-*`` backends and made ``--cuda-graph-max-bs`` ambiguous).

Metrics: SGLang serves ``/metrics`` only when launched with ``--enable-metrics``, so the adapter
adds it to every launch command unless the flags name it (``enable-metrics: false`` leaves the
endpoint off), and adds ``--enable-metrics-for-all-schedulers`` under DP attention
(``enable-dp-attention: true`` or ``attn-dp-size`` > 1), where only rank 0 would report.
"""

from __future__ import annotations

from typing import ClassVar

from cleanslate.bench import AdviceEntry, MetricMap, advice_book
from cleanslate.engines._base import EngineAdapter, FlagChange, Leftovers, register_engine
from cleanslate.engines._crash import W_DIED, CrashPattern, crash_pattern
from cleanslate.engines._flags import Flags, FlagValue
from cleanslate.engines._relax import Relaxer
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module

#: Flags that SGLang renamed, deprecated or removed (from 0.5.23's parser and changelog).
FLAG_CHANGES = {
    "--nsa-decode-backend": FlagChange("0.5.20", "--dsa-decode-backend", removed=True),
    "--nsa-prefill-backend": FlagChange("0.5.20", "--dsa-prefill-backend", removed=True),
    "--cuda-graph-max-bs": FlagChange(
        "0.5.20", "--cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill", removed=True),
    "--disable-cuda-graph": FlagChange(
        "0.5.20", "--cuda-graph-backend-decode disabled and --cuda-graph-backend-prefill "
        "disabled"),
    "--enable-dp-attention": FlagChange("0.5.20", "--attn-dp-size N"),
}

#: SGLang's ``/metrics`` (``python/sglang/srt/metrics/collector.py``): served only when the
#: server runs with ``--enable-metrics``, and under DP attention only rank 0's scheduler reports
#: unless ``--enable-metrics-for-all-schedulers``. Retractions are SGLang's preemptions (the
#: counter ``num_retracted_requests_total``; the older ``num_retracted_reqs`` is a gauge of the
#: last step, not a count, and is not read). The hit rate comes from ``cached_tokens_total`` over
#: ``prompt_tokens_total`` in the window, else from the ``cache_hit_rate`` gauge.
METRICS = MetricMap.build("sglang", {
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "kv_usage": ("sglang:token_usage",),
    "preemptions": ("sglang:num_retracted_requests_total",),
    "prefix_hits": ("sglang:cached_tokens_total",),
    "prefix_queries": ("sglang:prompt_tokens_total",),
    "prefix_hit_rate": ("sglang:cache_hit_rate",),
    "generation_tokens": ("sglang:generation_tokens_total",),
    "prompt_tokens": ("sglang:prompt_tokens_total",),
}, hint="SGLang serves /metrics only when launched with --enable-metrics",
    unmapped={"waiting_capacity": "SGLang does not say why a request waits"})


ENABLE_METRICS = "--enable-metrics"
ALL_SCHEDULERS = "--enable-metrics-for-all-schedulers"
#: The flags that turn DP attention on: the older switch, and the size that replaced it
#: (0.5.20; a size of 1 is no DP attention).
_DP_SWITCH = "enable-dp-attention"
_DP_SIZES = ("attn-dp-size", "attention-data-parallel-size")


def _given(flags: Flags | None) -> dict[str, FlagValue]:
    """The user's flags by their bare name (``--enable_metrics`` -> ``enable-metrics``)."""
    return {str(key).strip().lstrip("-").replace("_", "-"): value
            for key, value in (flags or {}).items()}


def dp_attention(flags: Flags | None) -> bool:
    """Whether ``flags`` turn on SGLang's DP attention: ``enable-dp-attention: true``, or an
    ``attn-dp-size`` above 1."""
    given = _given(flags)
    if given.get(_DP_SWITCH) not in (None, False, "false", "False", 0):
        return True
    for name in _DP_SIZES:
        try:
            if int(str(given.get(name, 1))) > 1:
                return True
        except ValueError:
            continue  # the engine's own parser says what is wrong with it
    return False


def metrics_args(flags: Flags | None, *, all_schedulers: bool = True) -> list[str]:
    """``--enable-metrics`` unless ``flags`` name it (``enable-metrics: false`` turns the
    endpoint off; ``true`` passes it among the user's flags), and, with ``all_schedulers``
    under DP attention, ``--enable-metrics-for-all-schedulers`` (else only DP rank 0's
    scheduler reports) unless named too or metrics are off."""
    given = _given(flags)
    named = "enable-metrics" in given
    if named and given["enable-metrics"] in (None, False):
        return []
    args = [] if named else [ENABLE_METRICS]
    if all_schedulers and dp_attention(flags) and ALL_SCHEDULERS.lstrip("-") not in given:
        args.append(ALL_SCHEDULERS)
    return args


#: What to try per bottleneck verdict, in SGLang's flags (``docs/bench.md``, "Why: the
#: bottleneck verdict"); the sim takes the same flags.
ADVICE = advice_book({
    "running_cap": (
        AdviceEntry("--max-running-requests", "raise",
                    "requests queue behind the cap while the batch could grow",
                    "max_running_requests"),
        AdviceEntry("--cuda-graph-max-bs", "check",
                    "keep it at or above the new cap, so the larger batch runs under CUDA "
                    "graphs", "cuda_graph_max_bs")),
    "kv_capacity": (
        AdviceEntry("--mem-fraction-static", "raise",
                    "more GPU memory for the KV cache (watch for out-of-memory at start)",
                    "mem_fraction_static"),
        AdviceEntry("--max-running-requests", "check",
                    "a cap near what the cache holds avoids retracting requests for room",
                    "max_running_requests"),
        AdviceEntry("--kv-cache-dtype", "set", "fp8_e5m2 halves the KV cache's bytes per token",
                    "kv_cache_dtype")),
    "compute": (
        AdviceEntry("--cuda-graph-max-bs", "check",
                    "a batch above it runs without CUDA graphs", "cuda_graph_max_bs"),
        AdviceEntry("--chunked-prefill-size", "check",
                    "larger chunks prefill the waiting requests faster, smaller ones stall "
                    "the decoding batch less", "chunked_prefill_size")),
    "dp_imbalance": (
        AdviceEntry("--load-balance-method", "set",
                    "spread requests over the DP ranks by load (minimum_tokens), not in turn",
                    "load_balance_method"),),
    "cache_inflated": (
        AdviceEntry("--disable-radix-cache", "enable",
                    "measure without the prefix cache", "disable_radix_cache"),),
})


#: Which flags relax each bottleneck, in the order a guided study tries them
#: (``docs/study.md``, "Guided: the rule table"); the sim takes the same flags. CUDA graphs on
#: is ``disable-cuda-graph`` off. A decode batch above ``cuda-graph-max-bs`` with CUDA graphs
#: on runs the eager path, whose failure (a Python exception in the sim's model and in the
#: founding story) the graphs off or a larger graph batch avoid.
RELAXERS = (
    Relaxer("running_cap", "max-running-requests", "up",
            "requests queue behind the cap while the batch could grow"),
    Relaxer("kv_capacity", "mem-fraction-static", "up", "more GPU memory for the KV cache"),
    Relaxer("kv_capacity", "kv-cache-dtype", "set",
            "fp8 halves the KV cache's bytes per token", value="fp8_e5m2"),
    Relaxer("kv_capacity", "kv-cache-dtype", "set",
            "fp8 halves the KV cache's bytes per token", value="fp8_e4m3"),
    Relaxer("kv_capacity", "max-running-requests", "down",
            "a cap near what the cache holds avoids retracting requests for room"),
    Relaxer("compute", "disable-cuda-graph", "off", "CUDA graphs shorten every decode step"),
    Relaxer("compute", "cuda-graph-max-bs", "up",
            "a batch above the graph limit runs without CUDA graphs",
            needs=(("disable-cuda-graph", False),), batch_limit=True),
    Relaxer("compute", "chunked-prefill-size", "up",
            "larger chunks pay the fixed cost of a prefill step fewer times"),
    Relaxer("crashed", "disable-cuda-graph", "on",
            "a batch beyond the captured graphs can raise (the founding story's crash): run "
            "without CUDA graphs",
            cause="python_exception"),
    Relaxer("crashed", "cuda-graph-max-bs", "up",
            "a batch beyond the captured graphs can raise: capture larger batches",
            cause="python_exception", needs=(("disable-cuda-graph", False),)),
    Relaxer("crashed", "max-running-requests", "down",
            "a batch beyond the captured graphs can raise: keep the batch within them",
            cause="python_exception"),
    Relaxer("crashed", "mem-fraction-static", "down",
            "out of memory: leave more beside the static pool for activations and graphs",
            cause="oom"),
    Relaxer("crashed", "chunked-prefill-size", "down",
            "out of memory: smaller prefill chunks need smaller activations", cause="oom"),
    Relaxer("crashed", "cuda-graph-max-bs", "down",
            "out of memory: fewer captured batch sizes hold less graph memory", cause="oom",
            needs=(("disable-cuda-graph", False),)),
    Relaxer("dp_imbalance", "load-balance-method", "set",
            "spread requests over the DP ranks by load, not in turn", value="minimum_tokens"),
)


@register_engine
class SGLangEngine(EngineAdapter):
    name = "sglang"
    description = "SGLang server (`python -m sglang.launch_server`)"
    default_port = 30000
    advice = ADVICE
    relaxers = RELAXERS
    default_model_flag = "--model-path"
    metric_map = METRICS
    # /server_info: the arguments, and the request cap in effect when it chose one itself
    config_flavour = "sglang"
    reserved_flags = ("--port", "--host", "--model-path", "--model")
    allows_abbrev = True
    flag_changes = FLAG_CHANGES
    leftovers = Leftovers(
        # sgl_shm_<kind>_<pid>_<rand>: multimodal (mm), message queues (mq), XPU tensors;
        # multi_tokenizer_args_<pid>; sglang_loads_*.shm (docs/engines.md cites the source).
        shm_globs=("nccl-*", "torch_*", "psm_*", "sem.mp-*", "sglang*", "sgl_shm_*",
                   "multi_tokenizer_args_*"),
        process_names=("sglang::scheduler", "sglang::detokenizer",
                       "sglang::data_parallel_controller", "sglang::detokenizer_router",
                       "sglang::tokenizer_worker", "sgl_diffusion::scheduler"),
        notes="schedulers survive their launcher under PID 1 and keep their GPU memory",
    )
    signature = ProcessSignature.compile(
        "sglang",
        r"^sglang(::|$)|^sgl_diffusion::",
        any_of(program("sglang"), python_module("sglang"), r"^sglang::", r"^sgl_diffusion::"),
        "SGLang launcher, schedulers (sglang::scheduler, sglang::scheduler_TP0), detokenizer, "
        "routers, tokenizer workers and sgl_diffusion schedulers",
    )
    crash_patterns: ClassVar[tuple[CrashPattern, ...]] = (
        # "Rank 0 scheduler is dead" says that a scheduler died, not why: a bare death
        crash_pattern("sglang-scheduler-dead", "killed", r"Rank \d+ scheduler is dead", W_DIED),
    )

    def default_launch(self) -> tuple[str, ...]:
        return (self.python, "-m", "sglang.launch_server")

    def implied_args(self, flags: Flags | None) -> list[str]:
        """``--enable-metrics`` (SGLang serves ``/metrics`` only with it) and, under DP
        attention, ``--enable-metrics-for-all-schedulers``: see :func:`metrics_args`."""
        return metrics_args(flags)
