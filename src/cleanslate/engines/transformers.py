"""Hugging Face ``transformers serve MODEL --port P``.

A single process (with many threads); SIGTERM frees its GPU memory within a second on an H200
(``docs/validation/h200-transformers.md``: it exited 0.44-0.72 s after SIGTERM, and the first
probe after that read the memory free). Readiness is ``GET /health``: ``GET /v1/models``
answered 500 with a preloaded model, so it is not a readiness signal for this engine. Its CLI is
typer, so ``--help`` is a rich box table; :mod:`cleanslate.engines._help` reads both that and
argparse output.
Useful flags: ``device``, ``dtype``, ``continuous-batching``, ``cb-use-cuda-graph``,
``cb-max-memory-percent``, ``attn-implementation``, ``compile``.
"""

from __future__ import annotations

from cleanslate.bench import AdviceEntry, advice_book, no_metrics
from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._relax import Relaxer
from cleanslate.engines.signatures import ProcessSignature, program

#: What to try per bottleneck verdict, in ``transformers serve``'s flags (``docs/bench.md``,
#: "Why: the bottleneck verdict"); it serves no metrics, so its verdicts come from the client's
#: figures and GPU telemetry (``likely`` at best).
ADVICE = advice_book({
    "running_cap": (
        AdviceEntry("--continuous-batching", "enable",
                    "without it requests are served one batch at a time"),),
    "kv_capacity": (
        AdviceEntry("--cb-max-memory-percent", "raise",
                    "more GPU memory for the continuous-batching cache"),),
    "compute": (
        AdviceEntry("--cb-use-cuda-graph", "enable", "CUDA graphs shorten each decode step"),
        AdviceEntry("--attn-implementation", "check", "a faster attention kernel")),
    "unknown": (
        AdviceEntry("--concurrency", "set",
                    "transformers serve has no metrics endpoint, so a verdict reads the "
                    "client's figures and GPU telemetry alone and is at best likely: measure "
                    "several levels (-c 1,4,16,64) on the GPU's own host (--gpus) so the rules "
                    "can compare them"),),
})


#: Which flags relax each bottleneck, in the order a guided study tries them
#: (``docs/study.md``, "Guided: the rule table"; names from ``../shared/GPU.md``).
RELAXERS = (
    Relaxer("running_cap", "continuous-batching", "on",
            "without it requests are served one batch at a time"),
    Relaxer("kv_capacity", "cb-max-memory-percent", "up",
            "more GPU memory for the continuous-batching cache"),
    Relaxer("compute", "cb-use-cuda-graph", "on", "CUDA graphs shorten every decode step"),
    Relaxer("compute", "compile", "on", "a compiled model takes shorter steps"),
    Relaxer("crashed", "cb-max-memory-percent", "down",
            "out of memory: leave more beside the cache", cause="oom"),
)


@register_engine
class TransformersEngine(EngineAdapter):
    name = "transformers"
    description = "Hugging Face `transformers serve`"
    default_port = 8000
    advice = ADVICE
    relaxers = RELAXERS
    leftovers = Leftovers(notes="a single process; nothing known to outlive it")
    signature = ProcessSignature.compile(
        "transformers", r"^transformers$", program(r"transformers(?:-cli)?\s+serve"),
        "Hugging Face `transformers serve`")
    # Its request models reject unknown fields: ``ignore_eos`` / ``min_tokens`` get HTTP 422.
    accepts_ignore_eos = False
    # It serves no Prometheus endpoint: the observation says "no engine metrics" once.
    metric_map = no_metrics("transformers", "transformers serve has no metrics endpoint")
    config_flavour = "none"
    config_note = "transformers serve does not say its configuration"

    def default_launch(self) -> tuple[str, ...]:
        return ("transformers", "serve")
