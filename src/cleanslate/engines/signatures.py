"""Process signatures: how to tell that a process belongs to an inference engine.

Engines rename their workers (``sglang::scheduler_TP0``, ``VLLM::EngineCore``) with
``prctl(PR_SET_NAME)`` and sometimes rewrite their argv too, while ``nvidia-smi`` keeps showing
the executable path. A signature therefore looks at **both** the kernel's ``comm`` and the full
command line, and a process matches when either does. The patterns are anchored on word
boundaries so that ``pgrep -f``-style accidents (an editor on ``notes-about-vllm.txt``) are less
likely, but a process whose argv *runs* an engine module or binary always matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cleanslate.errors import InputError


@dataclass(frozen=True)
class ProcessSignature:
    """Regexes over ``comm`` and the space-joined cmdline; either one matching is a match."""

    engine: str
    comm: re.Pattern[str]
    cmdline: re.Pattern[str]
    description: str = ""

    def matches(self, comm: str, cmdline: Sequence[str]) -> bool:
        if self.comm.search(comm):
            return True
        return bool(cmdline) and bool(self.cmdline.search(" ".join(cmdline)))


def _sig(engine: str, comm: str, cmdline: str, description: str) -> ProcessSignature:
    return ProcessSignature(engine, re.compile(comm), re.compile(cmdline), description)


# The engine's executable as the program run: ``vllm ...``, ``/opt/venv/bin/vllm ...`` or
# ``python3 -u /opt/venv/bin/vllm ...`` (not ``pip install vllm`` nor ``echo vllm``).
_PY = r"(?:\S*/)?(?:python[\d.]*|uv\s+run)\s+(?:-\S+\s+)*"


def _exe(name: str) -> str:
    return r"^(?:" + _PY + r")?(?:\S*/)?" + name + r"(?:\s|$)"


# ``python -m module`` or ``python -m module.sub``.
def _mod(name: str) -> str:
    return r"(?:^|\s)-m\s*" + name + r"(?:\.\S*)?(?:\s|$)"


_REGISTRY: dict[str, ProcessSignature] = {}


def register_signature(signature: ProcessSignature) -> ProcessSignature:
    """Add or replace the signature of an engine (engine adapters call this)."""
    _REGISTRY[signature.engine] = signature
    return signature


for _signature in (
    _sig(
        "sglang",
        r"^sglang(::|$)",
        "|".join([_exe("sglang"), _mod("sglang"), r"^sglang::"]),
        "SGLang launcher, schedulers (sglang::scheduler_TP0) and detokenizer",
    ),
    _sig(
        "vllm",
        r"^(VLLM::|vllm$|vllm::)",
        "|".join([_exe("vllm"), _mod("vllm"), r"^VLLM::"]),
        "vLLM API server, VLLM::EngineCore and VLLM::Worker processes",
    ),
    _sig(
        "trtllm",
        r"^(trtllm-serve|trtllm-llmapi)",
        "|".join([_exe("trtllm-serve"), _exe("trtllm-llmapi-launch"), _mod("tensorrt_llm")]),
        "TensorRT-LLM trtllm-serve and its MPI workers",
    ),
    _sig(
        "transformers",
        r"^transformers$",
        _exe(r"transformers(?:-cli)?\s+serve"),
        "Hugging Face `transformers serve`",
    ),
    _sig(
        "llamacpp",
        r"^llama-server$",
        _exe("llama-server"),
        "llama.cpp llama-server",
    ),
    _sig(
        "sim",
        r"^sim::",
        "|".join([_exe(r"cleanslate\s+sim\s+serve"),
                  r"(?:^|\s)-m\s*cleanslate\s+sim\s+serve(?:\s|$)",
                  _mod(r"cleanslate\.sim"), r"^sim::"]),
        "cleanslate's simulated engine (a test double, not a real server)",
    ),
):
    register_signature(_signature)


def signatures() -> list[ProcessSignature]:
    return list(_REGISTRY.values())


def get_signature(engine: str) -> ProcessSignature:
    try:
        return _REGISTRY[engine]
    except KeyError:
        raise InputError(
            f"unknown engine {engine!r}",
            where="--engine",
            hint="known engines: " + ", ".join(sorted(_REGISTRY)),
        ) from None


def match_engine(
    comm: str, cmdline: Sequence[str], engines: Iterable[str] | None = None
) -> str | None:
    """Return the first engine whose signature matches, or ``None``."""
    candidates = _REGISTRY.values() if engines is None else (get_signature(e) for e in engines)
    for signature in candidates:
        if signature.matches(comm, cmdline):
            return signature.engine
    return None
