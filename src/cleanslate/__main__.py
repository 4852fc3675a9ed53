from __future__ import annotations

from cleanslate.cli import main

main()
