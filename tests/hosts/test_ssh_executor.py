"""``SSHExecutor`` against a real OpenSSH server on 127.0.0.1 (see ``conftest.py``)."""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from pathlib import Path

import pytest

from cleanslate.errors import InputError
from cleanslate.hosts import LocalExecutor, executor_for
from cleanslate.hosts.ssh import RELAY, SSHExecutor, parse_target
from tests.hosts.conftest import pid_alive
from tests.hosts.sshd import Sshd


def test_parse_target_forms() -> None:
    t = parse_target("ssh://alice@gpu-7.example:2222?accept-new=1&connect-timeout=3")
    assert (t.user, t.host, t.port, t.accept_new, t.connect_timeout) == (
        "alice", "gpu-7.example", 2222, True, 3.0)
    assert t.display == "ssh://alice@gpu-7.example:2222"
    t = parse_target("ssh://[::1]:22")
    assert (t.user, t.host, t.port, t.accept_new) == (None, "::1", 22, None)
    assert parse_target("gpu1") == parse_target("gpu1")
    t = parse_target("bob@gpu1")
    assert (t.user, t.host, t.port) == ("bob", "gpu1", None)
    for bad in ("http://x", "ssh://x:notaport", "ssh://u@x?foo=1", "a b", "@x",
                "ssh://x?connect-timeout=-1"):
        with pytest.raises(InputError):
            parse_target(bad)


def test_executor_for() -> None:
    assert isinstance(executor_for(None), LocalExecutor)
    assert isinstance(executor_for("local"), LocalExecutor)
    remote = executor_for("ssh://root@127.0.0.1:2222")
    assert isinstance(remote, SSHExecutor)
    assert (remote.name, remote.python, remote.is_local) == (
        "ssh://root@127.0.0.1:2222", "python3", False)


def test_command_line_is_wrapped_in_a_remote_timeout() -> None:
    ex = SSHExecutor("ssh://h")
    line = ex.command_line(["python3", "-c", "print('a b')"], 7.5, env={"X": "1 2"})
    words = shlex.split(line)
    assert words[:4] == ["timeout", "-s", "KILL", "7.500"]
    assert words[4:8] == ["sh", "-c", RELAY, "sh"]
    assert words[8:] == ["env", "--", "X=1 2", "python3", "-c", "print('a b')"]


def test_run_stdin_env_exit_codes(sshd: Sshd, ssh_home: Path) -> None:
    async def go() -> None:
        ex = SSHExecutor("plain")
        r = await ex.run(["sh", "-c", "cat; echo \"$A\"; echo err >&2; exit 3"], timeout=10,
                         stdin=b"in\n", env={"A": "x y"})
        assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (3, b"in\nx y\n", b"err\n",
                                                                   False)
        missing = await ex.run(["no-such-command-here"], timeout=10)
        assert missing.returncode == 127
        await ex.close()

    asyncio.run(go())


@pytest.mark.slow  # 5.4-5.7 s measured
def test_one_connection_per_host_and_loop(sshd: Sshd, ssh_home: Path) -> None:
    # $SSH_CONNECTION names the client's port: one connection means one port for every command,
    # also when commands run concurrently; a second event loop opens its own.
    async def ports(ex: SSHExecutor) -> set[str]:
        results = await asyncio.gather(*(
            ex.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=10) for _ in range(12)))
        assert all(r.ok for r in results), [r.describe_failure() for r in results]
        return {r.stdout.split()[1].decode() for r in results}

    ex = SSHExecutor("plain")
    first = asyncio.run(ports(ex))
    second = asyncio.run(ports(ex))
    assert len(first) == 1
    assert len(second) == 1
    # The same target through its URL shares the connection of the alias.
    url = SSHExecutor(sshd.url("plain"))

    async def both() -> set[str]:
        return (await ports(ex)) | (await ports(url))

    assert len(asyncio.run(both())) == 1


def test_user_and_port_from_ssh_config(sshd: Sshd, ssh_home: Path) -> None:
    async def go() -> bytes:
        r = await SSHExecutor(f"{sshd.user}@nopy").run(["sh", "-c", "echo $PATH"], timeout=10)
        assert r.ok, r.describe_failure()
        return r.stdout

    assert b"nopy-bin" in asyncio.run(go())


def test_proxy_jump(sshd: Sshd, ssh_home: Path) -> None:
    config = ssh_home / ".ssh" / "config"
    original = config.read_text()
    config.write_text(original + (
        f"Host via-jump\n    HostName 127.0.0.1\n    Port {sshd.ports['nopy']}\n"
        f"    User {sshd.user}\n    IdentityFile ~/.ssh/id_ed25519\n    ProxyJump plain\n"))
    try:
        async def go() -> bytes:
            r = await SSHExecutor("via-jump").run(["sh", "-c", "echo $PATH"], timeout=10)
            assert r.ok, r.describe_failure()
            return r.stdout

        assert b"nopy-bin" in asyncio.run(go())
    finally:
        config.write_text(original)


def test_files(sshd: Sshd, ssh_home: Path, tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "spec.json"

    async def go() -> None:
        ex = SSHExecutor("plain")
        await ex.write_file(str(target), b"0123456789", mode=0o600)
        assert target.read_bytes() == b"0123456789"
        assert target.stat().st_mode & 0o777 == 0o600
        assert await ex.read_file(str(target)) == b"0123456789"
        assert await ex.read_file(str(target), max_bytes=4, tail=True) == b"6789"
        assert await ex.read_file(str(target), max_bytes=4) == b"0123"
        with pytest.raises(FileNotFoundError):
            await ex.read_file(str(tmp_path / "missing"))

    asyncio.run(go())


def test_hanging_command_is_ended_on_the_host(sshd: Sshd, ssh_home: Path,
                                              tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def go() -> None:
        ex = SSHExecutor("plain")
        started = time.monotonic()
        r = await ex.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 300"], timeout=1.0)
        elapsed = time.monotonic() - started
        assert r.timed_out and r.returncode is None
        assert elapsed < 1.0 + 3.0
        assert "timed out" in r.describe_failure()

    asyncio.run(go())
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pid), f"PID {pid} outlived its remote timeout"


def test_unreachable_host_is_a_failed_command_not_an_exception(ssh_home: Path) -> None:
    from tests._kit import free_port

    async def go() -> None:
        ex = SSHExecutor(f"ssh://root@127.0.0.1:{free_port()}?connect-timeout=3")
        started = time.monotonic()
        r = await ex.run(["true"], timeout=10)
        assert time.monotonic() - started < 3.5
        assert r.returncode is None and not r.ok
        assert r.error is not None and "host unreachable" in r.error
        assert "refused" in r.error.lower()

    asyncio.run(go())


def test_connect_timeout_on_a_silent_port(ssh_home: Path) -> None:
    # A socket that accepts TCP but never speaks SSH: only the connect timeout ends the wait.
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]

        async def go() -> None:
            ex = SSHExecutor(f"ssh://root@127.0.0.1:{port}?connect-timeout=1.5")
            started = time.monotonic()
            r = await ex.run(["true"], timeout=10)
            elapsed = time.monotonic() - started
            assert 1.4 < elapsed < 3.0, elapsed
            assert r.error is not None and "within 1.5 s" in r.error

        asyncio.run(go())


def test_env_controls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEANSLATE_SSH_ACCEPT_NEW", "1")
    monkeypatch.setenv("CLEANSLATE_SSH_CONNECT_TIMEOUT", "4")
    ex = SSHExecutor("gpu1")
    assert ex.accept_new and ex.connect_timeout == 4.0
    assert not SSHExecutor("ssh://gpu1?accept-new=0").accept_new
    monkeypatch.delenv("CLEANSLATE_SSH_ACCEPT_NEW")
    assert not SSHExecutor("gpu1").accept_new
    assert os.environ.get("CLEANSLATE_SSH_ACCEPT_NEW") is None


def test_connect_timeout_from_ssh_config(ssh_home: Path) -> None:
    import socket

    config = ssh_home / ".ssh" / "config"
    original = config.read_text()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        config.write_text(original + (
            f"Host silent\n    HostName 127.0.0.1\n    Port {silent.getsockname()[1]}\n"
            "    ConnectTimeout 1\n"))
        try:
            async def go() -> float:
                started = time.monotonic()
                r = await SSHExecutor("silent").run(["true"], timeout=10)
                assert r.error is not None and "within 1 s" in r.error, r.error
                return time.monotonic() - started

            assert asyncio.run(go()) < 2.5
        finally:
            config.write_text(original)
