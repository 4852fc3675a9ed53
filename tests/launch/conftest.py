"""Shared by the ``launch`` tests: a store, a simulated GPU ledger and the CLI environment of one
test (``Lab``, and its fixture ``lab``, which stops any run a failing test left)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult, recorded_rows, run_cli


class Lab:
    """One test's store, simulated GPU ledger and CLI environment."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = f"sqlite:///{root}/cs.db"
        self.env = {"CLEANSLATE_SIM_GPU_DIR": str(root / "gpus")}
        (root / "gpus").mkdir()

    def cli(self, *args: str, timeout: float = 120) -> CliResult:
        return run_cli(*args, env=self.env, timeout=timeout)

    def serve(self, port: int, *engine_flags: str, extra: tuple[str, ...] = ()) -> CliResult:
        return self.cli("serve", "--engine", "sim", "--model", "sim", "--port", str(port),
                        "--store", self.store, "--detach", "--json", "--ready-timeout", "60",
                        "--smoke-timeout", "5", *extra, "--", "--tp-size", "2", *engine_flags)

    def stop(self, run_id: str, *extra: str) -> CliResult:
        return self.cli("stop", run_id, "--store", self.store, "--json", "--deadline", "20",
                        "--gpu-backend", "sim", *extra)

    def check(self, *extra: str) -> dict[str, Any]:
        result = self.cli("check", "--gpu-backend", "sim", "--engine", "sim", "--json", *extra)
        return dict(result.json())

    def runs(self) -> list[dict[str, Any]]:
        return recorded_rows(self.root / "cs.db")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    yield lab
    for run in lab.runs():
        if run["status"] in ("starting", "ready"):
            lab.stop(run["id"], "--grace", "2")


def served(result: CliResult) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(result.json())
