"""``cleanslate sim``: the simulated engine (filled in by the sim issue)."""

from __future__ import annotations

import typer

from cleanslate.cli import app

sim_app = typer.Typer(help="The simulated engine: a test double and demo server, not a real one.")
app.add_typer(sim_app, name="sim")
