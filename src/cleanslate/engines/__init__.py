"""Engines: how each inference server is recognised, launched and diagnosed.

:mod:`cleanslate.engines.signatures` says how to recognise an engine's processes; the engine
adapters (launch argv, readiness, crash signatures) build on it.
"""

from __future__ import annotations

from cleanslate.engines.signatures import (
    ProcessSignature,
    get_signature,
    match_engine,
    register_signature,
    signatures,
)

__all__ = [
    "ProcessSignature",
    "get_signature",
    "match_engine",
    "register_signature",
    "signatures",
]
