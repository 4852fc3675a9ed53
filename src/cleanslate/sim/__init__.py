"""The simulated engine: an SGLang-like server with a simulated GPU (a test double and demo).

It is a *simulation*: no GPU is used and no model is loaded; token text is synthetic. It exists
so that every path of cleanslate (verify, launch, smoke, benchmark, crash, tear down, tune) runs
on a laptop and in CI, and to inject the failures real servers have.

- :mod:`cleanslate.sim.launcher`: the launcher that supervises the workers (``cleanslate sim
  serve``).
- :mod:`cleanslate.sim.api`: the OpenAI-compatible API; its docstring documents the ground-truth
  file format. The bytes it writes are :mod:`cleanslate.wire`'s, as the fake server's are.
- :mod:`cleanslate.sim.worker`: the worker processes (``sim::scheduler_TP0`` ...).
- :mod:`cleanslate.sim.engine`: the scheduler that the workers run (batches, KV, faults).
- :mod:`cleanslate.sim.ledger`: the simulated GPU memory ledger (stdlib only), which the ``sim``
  GPU backend of the probe reads.
- :mod:`cleanslate.sim.model`: the performance model (``docs/sim-model.md``) and the quickstart's
  space.
- :mod:`cleanslate.sim.faults`: ``--fault`` names and syntax.
- :mod:`cleanslate.sim.cli`: the ``cleanslate sim`` commands.

The names below load on first use: this package's ``__init__`` imports nothing, so that workers
start fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.sim.faults import FAULT_NAMES, Faults, parse_faults
    from cleanslate.sim.launcher import ServeOptions, serve
    from cleanslate.sim.ledger import SIM_GPU_DIR_ENV, ledger_dir
    from cleanslate.sim.model import SimModel, SimSettings, settings_from_flags

__getattr__, __dir__ = lazy_exports(__name__, {
    "FAULT_NAMES": "cleanslate.sim.faults",
    "Faults": "cleanslate.sim.faults",
    "parse_faults": "cleanslate.sim.faults",
    "SIM_GPU_DIR_ENV": "cleanslate.sim.ledger",
    "ledger_dir": "cleanslate.sim.ledger",
    "SimModel": "cleanslate.sim.model",
    "SimSettings": "cleanslate.sim.model",
    "settings_from_flags": "cleanslate.sim.model",
    "ServeOptions": "cleanslate.sim.launcher",
    "serve": "cleanslate.sim.launcher",
})

__all__ = [
    "FAULT_NAMES",
    "SIM_GPU_DIR_ENV",
    "Faults",
    "ServeOptions",
    "SimModel",
    "SimSettings",
    "ledger_dir",
    "parse_faults",
    "serve",
    "settings_from_flags",
]
