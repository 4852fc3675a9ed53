"""The test OpenSSH server of ``tests/hosts`` (aliases ``plain``, ``nopy``, ...), for doctor over
SSH."""

from __future__ import annotations

from tests.hosts.conftest import ssh_home, sshd

__all__ = ["ssh_home", "sshd"]
