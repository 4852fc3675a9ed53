"""Which ports a check requires free without being asked (``check --default-ports``, on by
default): the default ports of the engines in scope, and the ports of the runs recorded for the
hosts checked. Pure: the recorded runs are read by the caller (``cli/check.py`` reads them only
from a store that exists and is the user's own)."""

from __future__ import annotations

from collections.abc import Iterable

from cleanslate.engines import engine_class, engine_names

#: The most recent recorded runs whose ports a check requires free.
MAX_RECORDED_RUNS = 500


def implicit_ports(engines: list[str] | None, recorded: Iterable[tuple[int, str]]
                   ) -> dict[int, str]:
    """``{port: why}`` for the default ports of ``engines`` (every registered engine when
    ``None``) and the ports of ``recorded`` runs (``(port, run id)``, oldest first; the last
    :data:`MAX_RECORDED_RUNS` count), e.g. ``{8000: "default port of vllm"}``. A recorded port
    outside 1-65535 (a store someone else wrote) is not a port and is left out."""
    by_port: dict[int, list[str]] = {}
    for name in engines or engine_names():
        by_port.setdefault(engine_class(name).default_port, []).append(name)
    reasons = {p: f"default port of {', '.join(sorted(n))}" for p, n in by_port.items()}
    runs: dict[int, list[str]] = {}
    for port, run_id in [r for r in recorded if 1 <= r[0] <= 65535][-MAX_RECORDED_RUNS:]:
        runs.setdefault(port, []).append(run_id)
    for port, ids in runs.items():
        named = ", ".join(ids[-3:]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        what = f"recorded run{'s' if len(ids) > 1 else ''} {named}"
        reasons[port] = f"{reasons[port]}; {what}" if port in reasons else what
    return reasons


__all__ = ["MAX_RECORDED_RUNS", "implicit_ports"]
