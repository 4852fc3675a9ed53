"""The forward to a remote run reaches the run for this user only (issue 23: a forward on
``127.0.0.1:<free port>`` let another local user send 38 requests into a recorded trial).

Against the real OpenSSH server of ``conftest.py``: a server on the host's loopback counts the
requests it gets; every endpoint the forward opens on this machine (a TCP listener, a Unix
socket) is tried by uid ``nobody`` (``runuser``), which must reach none, while this user's own
request arrives. Then the seam itself: :mod:`cleanslate.hosts.forward`'s URLs and connectors.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from cleanslate.hosts import forward
from cleanslate.hosts.ssh import SSHExecutor
from tests.hosts.sshd import Sshd

SYSTEM_PYTHON = "/usr/bin/python3"

# Tries each endpoint as the user it runs as: connect, send a request, read the answer.
_TRY = r"""
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    try:
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(3)
            s.connect(where)
        else:
            host, _, port = where.rpartition(":")
            s = socket.create_connection((host, int(port)), timeout=3)
        s.sendall(b"GET /injected HTTP/1.0\r\nHost: x\r\n\r\n")
        out[target] = "answered: " + s.recv(64).decode(errors="replace")
        s.close()
    except OSError as exc:
        out[target] = f"refused: {type(exc).__name__}"
print(json.dumps(out))
"""


def _tcp_listeners() -> set[str]:
    found = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name, encoding="ascii") as fh:
            for row in fh.read().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A":
                    addr, port = fields[1].rsplit(":", 1)
                    host = "127.0.0.1" if len(addr) == 8 else "::1"
                    found.add(f"tcp:{host}:{int(port, 16)}")
    return found


def _unix_listeners() -> set[str]:
    found = set()
    with open("/proc/net/unix", encoding="utf-8", errors="replace") as fh:
        for row in fh.read().splitlines()[1:]:
            fields = row.split()
            if len(fields) >= 8 and fields[3] == "00010000" and fields[7].startswith("/"):
                found.add(f"unix:{fields[7]}")
    return found


def _endpoints() -> set[str]:
    return _tcp_listeners() | _unix_listeners()


async def _counting_server() -> tuple[asyncio.Server, list[str]]:
    """An HTTP/1.0 server on 127.0.0.1 (the host's loopback: sshd runs here) that records the
    path of every request it gets."""
    seen: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        seen.append(line.decode(errors="replace").split(" ")[1] if b" " in line else "?")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


def test_another_local_user_cannot_reach_a_remote_runs_forward(sshd: Sshd,
                                                               ssh_home: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to connect as another user")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} (a Python nobody can run) is not installed")

    async def go() -> tuple[dict[str, str], list[str], set[str]]:
        server, seen = await _counting_server()
        port = server.sockets[0].getsockname()[1]
        executor = SSHExecutor("plain")
        try:
            await executor.connect()
            before = _endpoints()
            async with executor.forward_port(port) as url:
                opened = _endpoints() - before
                if urlsplit(url).port is not None:
                    opened.add(f"tcp:127.0.0.1:{urlsplit(url).port}")
                tried = await asyncio.to_thread(
                    subprocess.run, ["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-I",
                                     "-S", "-c", _TRY, *sorted(opened)],
                    capture_output=True, text=True, timeout=20)
                assert tried.returncode == 0, tried.stderr
                # this user's own request, as the clients send it
                async with aiohttp.ClientSession(connector=forward.connector_for(url)) as http, \
                        http.get(url + "/mine") as response:
                    assert response.status == 200
            return json.loads(tried.stdout), seen, opened
        finally:
            await executor.close()
            server.close()
            await server.wait_closed()

    results, seen, opened = asyncio.run(go())
    assert opened, "the forward opened no endpoint on this machine"
    assert all(r.startswith("refused") for r in results.values()), results
    assert seen == ["/mine"], f"the server got {seen}"


def test_forward_urls_resolve_only_through_the_seam(tmp_path: Path) -> None:
    """A forward's base URL names its socket for :func:`connector_for` and
    :func:`open_connection` only while it is registered; its host resolves nowhere, so a client
    that bypasses the seam fails instead of reaching the loopback; other URLs are TCP."""
    with forward.private_socket() as path:
        folder = os.stat(os.path.dirname(path))
        assert folder.st_mode & 0o777 == 0o700 and folder.st_uid == os.geteuid()
        url = forward.register(path)
        try:
            host = urlsplit(url).hostname or ""
            assert url.startswith("http://fwd-") and host.endswith(".cleanslate.invalid")
            assert forward.unix_socket_for(url) == path
            assert forward.unix_socket_for(url + "/v1/completions") == path
            assert forward.register(path) != url  # a fresh name each time

            async def go() -> None:
                unix = forward.connector_for(url, limit=0, ttl_dns_cache=300)
                tcp = forward.connector_for("http://127.0.0.1:8000", limit=0)
                try:
                    assert isinstance(unix, aiohttp.UnixConnector) and unix.path == path
                    assert isinstance(tcp, aiohttp.TCPConnector)
                    again = forward.same_connector(unix, force_close=True)
                    assert isinstance(again, aiohttp.UnixConnector) and again.path == path
                    await again.close()
                finally:
                    await unix.close()
                    await tcp.close()

            asyncio.run(go())
        finally:
            forward.unregister(url)
        assert forward.unix_socket_for(url) is None
        assert forward.unix_socket_for("http://fwd-0.cleanslate.invalid") is None
        assert forward.unix_socket_for("http://[bad") is None
    assert not os.path.exists(os.path.dirname(path))


def test_a_forward_is_served_over_its_socket(tmp_path: Path) -> None:
    """The clients' seam end to end, without SSH: a server on a Unix socket in the private
    folder answers requests sent to the registered URL, and the raw liveness connection
    reaches it too."""
    async def go() -> None:
        with forward.private_socket() as path:
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await reader.readline()
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                await writer.drain()
                writer.close()

            server = await asyncio.start_unix_server(handle, path)
            url = forward.register(path)
            try:
                assert stat.S_ISSOCK(os.stat(path).st_mode)
                async with aiohttp.ClientSession(connector=forward.connector_for(url)) as http, \
                        http.get(url + "/health") as response:
                    assert await response.read() == b"hello"
                _reader, writer = await forward.open_connection(url, "ignored", 1)
                writer.close()
            finally:
                forward.unregister(url)
                server.close()
                await server.wait_closed()

    asyncio.run(go())


def test_a_benchmark_and_a_smoke_test_run_through_the_ssh_forward(sshd: Sshd,
                                                                  ssh_home: Path) -> None:
    """What a remote trial sends, through the real forward: the smoke test, then two
    benchmark levels (the session's connector, its pool), all served by the fake OpenAI server
    on the host's loopback; and after the forward has closed, nothing reaches the server."""
    from cleanslate.bench import BenchConfig, ClosedLoop, RandomWorkload, run_benchmark
    from cleanslate.engines._smoke import smoke_test
    from tests.bench.conftest import fake_server

    async def go() -> tuple[Any, Any, int, str]:
        async with fake_server() as (server_url, stats):
            port = urlsplit(server_url).port
            assert port is not None
            executor = SSHExecutor("plain")
            try:
                async with executor.forward_port(port) as url:
                    smoke = await smoke_test(url, "m", request_timeout=20)
                    config = BenchConfig(url=url, model="m",
                                         workload=RandomWorkload(input_len=8, output_len=5),
                                         loads=(ClosedLoop(concurrency=1),
                                                ClosedLoop(concurrency=4)), num_prompts=12)
                    result = await run_benchmark(config)
                served = stats.requests
                async with aiohttp.ClientSession(connector=forward.connector_for(url)) as http:
                    try:
                        async with http.get(url + "/health") as response:
                            after = f"answered {response.status}"
                    except aiohttp.ClientError as exc:
                        after = f"refused: {type(exc).__name__}"
            finally:
                await executor.close()
            return smoke, result, served, after

    smoke, result, served, after = asyncio.run(go())
    assert smoke.passed, smoke.detail
    assert [lv.completed for lv in result.levels] == [12, 12] and not result.partial
    assert served == len(smoke.outputs) + 24
    assert after.startswith("refused"), after
