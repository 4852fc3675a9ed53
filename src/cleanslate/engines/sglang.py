"""SGLang: ``python -m sglang.launch_server --model-path M --port P``.

Processes: the launcher (tokenizer manager + HTTP server) starts ``sglang::scheduler_TP<n>``
(one per tensor-parallel rank, ``sglang::scheduler_DP<d>_TP<n>_EP<e>`` with data parallelism)
and ``sglang::detokenizer``; schedulers hold the GPU memory and can outlive the launcher under
PID 1. ``/health`` answers 200 once the server is up (``/health_generate`` also runs one decode
step; the smoke test does that job here).
"""

from __future__ import annotations

from typing import ClassVar

from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._crash import W_DIED, CrashPattern, crash_pattern
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module


@register_engine
class SGLangEngine(EngineAdapter):
    name = "sglang"
    description = "SGLang server (`python -m sglang.launch_server`)"
    default_port = 30000
    default_model_flag = "--model-path"
    reserved_flags = ("--port", "--host", "--model-path", "--model")
    leftovers = Leftovers(
        shm_globs=("nccl-*", "torch_*", "psm_*", "sem.mp-*", "sglang*"),
        process_names=("sglang::scheduler", "sglang::detokenizer", "sglang::data_parallel"),
        notes="schedulers survive their launcher under PID 1 and keep their GPU memory",
    )
    signature = ProcessSignature.compile(
        "sglang",
        r"^sglang(::|$)",
        any_of(program("sglang"), python_module("sglang"), r"^sglang::"),
        "SGLang launcher, schedulers (sglang::scheduler_TP0) and detokenizer",
    )
    crash_patterns: ClassVar[tuple[CrashPattern, ...]] = (
        # "Rank 0 scheduler is dead" says that a scheduler died, not why: a bare death
        crash_pattern("sglang-scheduler-dead", "killed", r"Rank \d+ scheduler is dead", W_DIED),
    )

    def default_launch(self) -> tuple[str, ...]:
        return (self.python, "-m", "sglang.launch_server")
