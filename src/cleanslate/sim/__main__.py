"""``python -m cleanslate.sim serve ...``: the same as ``cleanslate sim serve ...``."""

from __future__ import annotations

from cleanslate.cli import main as _cli_main


def main() -> None:
    import sys

    sys.argv = ["cleanslate", "sim", *sys.argv[1:]]
    _cli_main()


if __name__ == "__main__":
    main()
