"""``cleanslate sim``: the simulated engine (commands in :mod:`cleanslate.sim.cli`)."""

from __future__ import annotations

from cleanslate.cli import app
from cleanslate.sim.cli import sim_app

app.add_typer(sim_app, name="sim")

__all__ = ["sim_app"]
