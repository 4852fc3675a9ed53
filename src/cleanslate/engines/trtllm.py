"""TensorRT-LLM: ``trtllm-serve MODEL --port P``.

With more than one rank, trtllm-serve starts MPI workers (``mpi4py`` / ``orted`` processes) that
can live in other process groups than the launcher: teardown must follow the run's marker, not
the process group alone.
"""

from __future__ import annotations

from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module


@register_engine
class TRTLLMEngine(EngineAdapter):
    name = "trtllm"
    description = "TensorRT-LLM `trtllm-serve`"
    default_port = 8000
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
