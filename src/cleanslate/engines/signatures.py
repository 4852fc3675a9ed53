"""Process signatures: how to tell that a process belongs to an inference engine.

Each engine adapter carries its own :class:`ProcessSignature` (``EngineAdapter.signature``);
this module holds the helpers that write one and re-exports the registry's lookups
(:func:`signatures`, :func:`require_signature`, :func:`match_engine`).

Engines rename their workers (``sglang::scheduler_TP0``, ``VLLM::EngineCore``) with
``prctl(PR_SET_NAME)`` and sometimes rewrite their argv too, while ``nvidia-smi`` keeps showing
the executable path. A signature therefore looks at **both** the kernel's ``comm`` and the full
command line, and a process matches when either does. The patterns below are anchored on word
boundaries so that ``pgrep -f``-style accidents (an editor on ``notes-about-vllm.txt``) are less
likely, but a process whose argv *runs* an engine module or binary always matches::

    signature = ProcessSignature.compile(
        "vllm", comm=r"^(VLLM::|vllm$)",
        cmdline=any_of(program("vllm"), python_module("vllm"), r"^VLLM::"))
"""

from __future__ import annotations

from cleanslate.engines._base import ProcessSignature, match_engine, require_signature, signatures

# An interpreter before the program: ``python3 -u``, ``/opt/venv/bin/python3.11``, ``uv run``.
_PY = r"(?:\S*/)?(?:python[\d.]*|uv\s+run)\s+(?:-\S+\s+)*"


def program(name: str) -> str:
    """The cmdline runs the executable ``name`` (a regex): ``vllm ...``, ``/opt/venv/bin/vllm
    ...`` or ``python3 -u /opt/venv/bin/vllm ...``, but not ``pip install vllm`` nor ``echo
    vllm``."""
    return r"^(?:" + _PY + r")?(?:\S*/)?" + name + r"(?:\s|$)"


def python_module(name: str) -> str:
    """The cmdline runs ``python -m name`` or ``python -m name.sub`` (``name`` is a regex)."""
    return r"(?:^|\s)-m\s*" + name + r"(?:\.\S*)?(?:\s|$)"


def any_of(*patterns: str) -> str:
    """A regex matching where any of ``patterns`` does."""
    return "|".join(patterns)


__all__ = [
    "ProcessSignature",
    "any_of",
    "match_engine",
    "program",
    "python_module",
    "require_signature",
    "signatures",
]
