"""``python -m cleanslate.sim serve ...``: the same as ``cleanslate sim serve ...``."""

from __future__ import annotations

from cleanslate.sim.cli import main

if __name__ == "__main__":
    main()
