"""cleanslate: verify, launch, benchmark, tear down and tune LLM inference servers.

The cycle of a trial is ``preflight -> verify clean -> launch -> ready -> smoke -> bench levels
-> teardown -> verify clean -> record``; each package of this distribution is one room of it:
``hosts`` (where commands run), ``probe`` (what is on a host), ``verdict`` (is it clean),
``engines``, ``teardown``, ``bench``, ``tune``, ``store``, ``report`` and ``sim`` (the simulated
engine, a test double and demo engine).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
