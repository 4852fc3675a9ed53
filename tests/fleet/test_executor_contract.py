"""The executor contract (:mod:`cleanslate.testing.executor_contract`) on a namespaced fleet
host: a command's process tree, its timeout and its files live in the host's own PID and mount
namespaces, and the contract holds there as on any SSH host."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cleanslate.hosts import Executor
from cleanslate.testing.executor_contract import *  # noqa: F403
from tests._kit import free_port
from tests.fleet.hosts import Fleet

pytestmark = pytest.mark.slow


@pytest.fixture
def executor(fleet_env: Fleet) -> Iterator[Executor]:
    from cleanslate.hosts.ssh import SSHExecutor

    yield SSHExecutor("fleet-a")


@pytest.fixture
def unreachable_executor() -> Executor:
    from cleanslate.hosts.ssh import SSHExecutor

    return SSHExecutor(f"ssh://root@127.0.0.1:{free_port()}?connect-timeout=3")
