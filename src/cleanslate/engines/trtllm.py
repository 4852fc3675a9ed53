"""TensorRT-LLM: ``trtllm-serve MODEL --port P``.

With more than one rank, trtllm-serve starts MPI workers (``mpi4py`` / ``orted`` processes) that
can live in other process groups than the launcher: teardown must follow the run's marker, not
the process group alone.
"""

from __future__ import annotations

from cleanslate.bench import AdviceEntry, MetricMap, advice_book
from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._relax import Relaxer
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module

#: trtllm-serve's ``/prometheus/metrics`` with the ``trtllm_`` prefix
#: (``tensorrt_llm/metrics/collector.py`` of 2026). Older releases served only request
#: histograms without a prefix (``request_success_total``): no running, waiting or KV gauge,
#: and nothing a bare URL can recognise.
METRICS = MetricMap.build("trtllm", {
    "running": ("trtllm_num_requests_running",),
    "waiting": ("trtllm_num_requests_waiting",),
    "kv_usage": ("trtllm_kv_cache_utilization",),
    "prefix_hit_rate": ("trtllm_kv_cache_hit_rate",),
    "generation_tokens": ("trtllm_generation_tokens_total",),
    "prompt_tokens": ("trtllm_prompt_tokens_total",),
}, path="/prometheus/metrics",
    unmapped={"preemptions": "no preemption counter found in its collector",
              "waiting_capacity": "no reason label"})


#: What to try per bottleneck verdict, in trtllm-serve's flags (``docs/bench.md``, "Why: the
#: bottleneck verdict"); its server does not say its configuration, so no value is named.
ADVICE = advice_book({
    "running_cap": (
        AdviceEntry("--max_batch_size", "raise",
                    "requests queue behind the batch limit while the batch could grow"),
        AdviceEntry("--max_num_tokens", "raise", "a step's token budget also holds admission")),
    "kv_capacity": (
        AdviceEntry("--kv_cache_free_gpu_memory_fraction", "raise",
                    "more of the free GPU memory for the KV cache"),
        AdviceEntry("--max_batch_size", "lower", "fewer requests competing for room")),
    "compute": (
        AdviceEntry("--max_num_tokens", "check",
                    "a larger step budget prefills the waiting requests faster, a smaller one "
                    "stalls the decoding batch less"),),
})


#: Which flags relax each bottleneck, in the order a guided study tries them
#: (``docs/study.md``, "Guided: the rule table"); only the flags of ``trtllm-serve`` whose
#: names its advice already uses.
RELAXERS = (
    Relaxer("running_cap", "max_batch_size", "up",
            "requests queue behind the batch limit while the batch could grow"),
    Relaxer("running_cap", "max_num_tokens", "up", "a step's token budget also holds admission"),
    Relaxer("kv_capacity", "kv_cache_free_gpu_memory_fraction", "up",
            "more of the free GPU memory for the KV cache"),
    Relaxer("kv_capacity", "max_batch_size", "down", "fewer requests competing for room"),
    Relaxer("compute", "max_num_tokens", "up",
            "a larger step budget pays a step's fixed cost fewer times"),
    Relaxer("crashed", "kv_cache_free_gpu_memory_fraction", "down",
            "out of memory: leave more beside the KV cache", cause="oom"),
)


@register_engine
class TRTLLMEngine(EngineAdapter):
    name = "trtllm"
    description = "TensorRT-LLM `trtllm-serve`"
    default_port = 8000
    advice = ADVICE
    relaxers = RELAXERS
    metric_map = METRICS
    # its server answers no /server_info or /props that cleanslate reads
    config_flavour = "none"
    config_note = "TensorRT-LLM's server does not say its configuration"
    leftovers = Leftovers(
        shm_globs=("nccl-*", "vader*", "psm_*", "sem.mp-*", "trtllm*"),
        process_names=("trtllm-serve", "trtllm-llmapi-launch", "orted", "mpi4py"),
        notes="MPI workers may run in their own process groups",
    )
    signature = ProcessSignature.compile(
        "trtllm",
        r"^(trtllm-serve|trtllm-llmapi)",
        any_of(program("trtllm-serve"), program("trtllm-llmapi-launch"),
               python_module("tensorrt_llm")),
        "TensorRT-LLM trtllm-serve and its MPI workers",
    )

    def default_launch(self) -> tuple[str, ...]:
        return ("trtllm-serve",)
