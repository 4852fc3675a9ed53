"""Hypothesis profiles for the fuzz suite, and its figures at the end of the session.

``CLEANSLATE_FUZZ=ci`` (the default) runs a fixed, derandomized set of inputs sized for CI;
``CLEANSLATE_FUZZ=deep`` runs ten times as many with fresh randomness, for a long local run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz._harness import TALLY

_COMMON = {
    "deadline": None,  # each input has its own time bound in the harness
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                              HealthCheck.data_too_large],
    "print_blob": True,
}
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("deep", derandomize=False, **_COMMON)
settings.load_profile(os.environ.get("CLEANSLATE_FUZZ", "ci"))

#: Multiplier of every test's example count.
SCALE = 10 if os.environ.get("CLEANSLATE_FUZZ") == "deep" else 1


@pytest.fixture(scope="session", autouse=True)
def _scratch_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fuzzed relative paths (``--store null``, ``--save-baseline '[/x]'``) land in a scratch
    folder, not in the repository."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("fuzzcwd"))
    try:
        yield
    finally:
        os.chdir(old)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TALLY.inputs:
        terminalreporter.write_line(TALLY.summary())
