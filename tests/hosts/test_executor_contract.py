"""The executor contract (:mod:`cleanslate.testing.executor_contract`) on every executor:
``LocalExecutor``, and ``SSHExecutor`` against a real OpenSSH server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cleanslate.hosts import Executor, LocalExecutor
from cleanslate.testing.executor_contract import *  # noqa: F403
from tests._kit import free_port

IMPLEMENTATIONS = ["local", "ssh"]


@pytest.fixture(params=IMPLEMENTATIONS)
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    if request.param == "local":
        yield LocalExecutor()
        return
    request.getfixturevalue("ssh_home")  # the client home of the test sshd (skips without it)
    from cleanslate.hosts.ssh import SSHExecutor

    yield SSHExecutor("plain")


@pytest.fixture(params=["ssh"])
def unreachable_executor(request: pytest.FixtureRequest) -> Executor:
    from cleanslate.hosts.ssh import SSHExecutor

    return SSHExecutor(f"ssh://root@127.0.0.1:{free_port()}?connect-timeout=3")
