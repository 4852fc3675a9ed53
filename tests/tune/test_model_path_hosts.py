"""The model path check of a study runs on every host of a fleet, SSH hosts too, through each
host's executor (``test -e PATH`` as an argv): a path that exists here but not on a remote host
is refused naming that host, and a path that holds shell words is looked for as it is."""

from __future__ import annotations

import asyncio
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanslate.errors import InputError
from cleanslate.tune.controller import check_model_paths
from cleanslate.tune.study import StudySpec
from tests.hosts.sshd import Profile, Sshd, sshd_available, start_sshd

pytestmark = pytest.mark.slow  # an OpenSSH server and a session per check: 1-3 s here


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not sshd_available():
        pytest.skip("/usr/sbin/sshd is missing: apt-get install -y openssh-server")
    server = start_sshd(tmp_path_factory.mktemp("sshd"), {"plain": Profile()})
    try:
        yield server
    finally:
        server.stop()


def _spec(model: str, hosts: list[str]) -> StudySpec:
    return StudySpec.model_validate({"name": "paths", "engine": "sim", "model": model,
                                     "hosts": hosts, "space": {"x": [1]}, "concurrency": [1]})


def test_every_host_is_asked(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(sshd.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    remote = sshd.url("plain")
    here = tmp_path / "model"
    here.mkdir()
    # exists on both (the SSH server is this machine): no error
    asyncio.run(check_model_paths(_spec(str(here), ["local", remote]), "study.yaml:3"))
    # a path only the local host has: the SSH host is named (the test server shares this
    # machine's files, so the missing path is one that exists on neither but is asked of both)
    gone = tmp_path / "gone; touch pwned"
    with pytest.raises(InputError) as caught:
        asyncio.run(check_model_paths(_spec(str(gone), [remote]), "study.yaml:3"))
    assert caught.value.where == "study.yaml:3"
    assert "does not exist on" in caught.value.message and "127.0.0.1" in caught.value.message
    # the remote session starts in its user's home: a path run as shell words would touch there
    assert not (Path(pwd.getpwnam(sshd.user).pw_dir) / "pwned").exists()
    assert not gone.exists() and not Path("pwned").exists()
