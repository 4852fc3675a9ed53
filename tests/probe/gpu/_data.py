"""Access to the real outputs in ``tests/fixtures/nvidia-h200x2/`` (see its README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-h200x2"

#: The 22 fields of ``idle_query`` / ``busy_query``, in order: what the ``*_nounits`` variants
#: (``--format=csv,noheader,nounits``) were asked for.
QUERY_22_FIELDS: tuple[str, ...] = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.used", "memory.total",
    "memory.reserved", "memory.free", "utilization.gpu", "temperature.gpu", "power.draw",
    "persistence_mode", "compute_mode", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_event_reasons.active", "mig.mode.current", "pcie.link.gen.current",
    "pcie.link.width.current",
)  # fmt: skip

UUID0 = "GPU-00001000-0000-4000-8000-000000000001"
UUID1 = "GPU-00001001-0000-4000-8000-000000000002"


def exit_status(stem: str) -> int:
    """The exit status of a fixture command (``NAME.exit`` holds ``exit=N``)."""
    return int((FIXTURES / f"{stem}.exit").read_text().strip().removeprefix("exit="))


def output(stem: str) -> tuple[str, str, int]:
    """``(stdout, stderr, exit status)`` of one fixture command."""
    return (
        (FIXTURES / f"{stem}.out").read_text(),
        (FIXTURES / f"{stem}.err").read_text(),
        exit_status(stem),
    )


def nvml_dump(stem: str) -> dict[str, Any]:
    """A pynvml dump (``busy_nvml`` or ``orphans_nvml``) as a dict."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{stem}.out").read_text())
    return data
