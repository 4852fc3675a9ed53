"""``--accept-new-host-key`` is a parameter of the executors a command opens, not a setting of
the process: it records an unknown key for the hosts of that command, and a changed key is
still refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cleanslate.hosts import executor_for
from cleanslate.hosts.ssh import SSHExecutor
from tests.hosts.sshd import Sshd


def _check(sshd: Sshd, home: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "cleanslate", "check", "--json", "--host", "plain",
         "--gpu-backend", "none", "--engine", "llamacpp", *args],
        capture_output=True, text=True, timeout=60, check=False, env=sshd.client_env(home))
    verdicts = {h["verdict"] for h in json.loads(done.stdout)["hosts"]}
    return done.returncode, "unknown" if "unknown" in verdicts else "reached"


def test_the_flag_records_an_unknown_key_for_its_own_command(sshd: Sshd, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(sshd.home, home)
    known = home / ".ssh" / "known_hosts"
    known.write_text("")
    assert _check(sshd, home) == (3, "unknown") and known.read_text() == ""
    code, reached = _check(sshd, home, "--accept-new-host-key")
    assert reached == "reached", code
    assert known.read_text().split() == [f"[127.0.0.1]:{sshd.ports['plain']}",
                                         *sshd.host_key_pub.split()[:2]]
    assert _check(sshd, home)[1] == "reached"  # recorded: trusted from now on without the flag


def test_the_policy_belongs_to_the_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEANSLATE_SSH_ACCEPT_NEW", raising=False)
    opted = executor_for("ssh://u@127.0.0.1:1", accept_new_host_keys=True)
    plain = executor_for("ssh://u@127.0.0.1:1")
    by_url = executor_for("ssh://u@127.0.0.1:1?accept-new=1")
    assert isinstance(opted, SSHExecutor) and isinstance(plain, SSHExecutor)
    assert isinstance(by_url, SSHExecutor)
    assert opted.accept_new and by_url.accept_new
    assert not plain.accept_new  # one executor's opt-in is not another's
