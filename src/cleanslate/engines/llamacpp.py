"""llama.cpp: ``llama-server -m MODEL --port P`` (default port 8080).

``/health`` answers 503 while the model loads and 200 once it is ready. The OpenAI endpoints
``/v1/completions`` and ``/v1/chat/completions`` are both served. Its help is a plain list of
``-x, --long-name VALUE`` lines, which the argparse-style reader handles.
"""

from __future__ import annotations

from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines.signatures import ProcessSignature, program


@register_engine
class LlamaCppEngine(EngineAdapter):
    name = "llamacpp"
    description = "llama.cpp `llama-server`"
    default_port = 8080
    default_model_flag = "-m"
    reserved_flags = ("--port", "--host", "-m", "--model")
    leftovers = Leftovers(notes="a single process")
    signature = ProcessSignature.compile(
        "llamacpp", r"^llama-server$", program("llama-server"), "llama.cpp llama-server")

    def default_launch(self) -> tuple[str, ...]:
        return ("llama-server",)
