"""The simulated engine: an SGLang-like server with a simulated GPU (a test double and demo).

It is a *simulation*: no GPU is used and no model is loaded; token text is synthetic. It exists
so that every path of cleanslate (verify, launch, smoke, benchmark, crash, tear down, tune) runs
on a laptop and in CI, and to inject the failures real servers have.

- :mod:`cleanslate.sim.server`: the launcher and OpenAI-compatible API (``cleanslate sim serve``);
  its docstring documents the ground-truth file format.
- :mod:`cleanslate.sim.worker`: the worker processes (``sim::scheduler_TP0`` ...).
- :mod:`cleanslate.sim.ledger`: the simulated GPU memory ledger (stdlib only).
- :mod:`cleanslate.sim.model`: the performance model and ``QUICKSTART_SPACE``.
- :mod:`cleanslate.sim.faults`: ``--fault`` names and syntax.

This package's ``__init__`` imports nothing, so that workers start fast.
"""

from __future__ import annotations
