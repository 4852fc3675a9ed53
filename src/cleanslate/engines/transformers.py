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

from cleanslate.bench import no_metrics
from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines.signatures import ProcessSignature, program


@register_engine
class TransformersEngine(EngineAdapter):
    name = "transformers"
    description = "Hugging Face `transformers serve`"
    default_port = 8000
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
