"""Where this machine reaches a launched server: the private end of an SSH forward, and the one
seam every HTTP client goes through to use it.

A TCP port on ``127.0.0.1`` is reachable by every local user: a forward listening there let
another user send requests into a recorded trial (issue 23: 38 injected requests skewed one).
So :meth:`cleanslate.hosts.ssh.SSHExecutor.forward_port` listens on a **Unix socket** in a
folder of its own, mode 0700 (:func:`private_socket`): only this user (and root) can connect.

An HTTP client cannot name a Unix socket in a URL, so the forward yields a base URL whose host
names it: ``http://fwd-<random>.cleanslate.invalid`` (:func:`register`). The name is known only
to this process (a table here maps it to the socket) and resolves nowhere (``.invalid``, RFC
2606): a client that does not go through :func:`connector_for` fails to connect instead of
reaching whatever listens on the loopback. Every client of a launched server (readiness,
smoke test, benchmark sessions and their liveness probe) makes its connector with
:func:`connector_for` and opens raw connections with :func:`open_connection`; for any other
URL they are the usual TCP ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import aiohttp

#: The domain of forwarded base URLs (``.invalid`` never resolves).
DOMAIN = "cleanslate.invalid"
#: Longest Unix socket path (``sun_path`` is 108 bytes on Linux, with its NUL).
MAX_SOCKET_PATH = 107

# host name of a forwarded base URL -> the Unix socket that reaches it
_SOCKETS: dict[str, str] = {}


def _socket_root() -> str:
    """Where the private folders go: ``$XDG_RUNTIME_DIR`` (this user's, 0700) when it is this
    user's own and short enough, else the system's temporary folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() \
                and not st.st_mode & 0o077 and len(runtime) < 64:
            return runtime
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) < 64 else "/tmp"


@contextlib.contextmanager
def private_socket(name: str = "s") -> Iterator[str]:
    """A path for a Unix socket in a new folder only this user can enter (0700, made by
    ``mkdtemp``: nobody else can have made it or swapped it), removed with what it holds when
    the context ends."""
    folder = tempfile.mkdtemp(prefix="cleanslate-fwd-", dir=_socket_root())
    try:
        os.chmod(folder, 0o700)  # mkdtemp's mode already; said, not assumed
        path = os.path.join(folder, name)
        if len(path.encode()) > MAX_SOCKET_PATH:
            raise OSError(f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes")
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def register(socket_path: str) -> str:
    """A base URL that :func:`connector_for` sends to ``socket_path``
    (``http://fwd-<random>.cleanslate.invalid``); :func:`unregister` forgets it."""
    host = f"fwd-{secrets.token_hex(8)}.{DOMAIN}"
    _SOCKETS[host] = socket_path
    return f"http://{host}"


def unregister(base_url: str) -> None:
    _SOCKETS.pop(urlsplit(base_url).hostname or "", None)


def unix_socket_for(url: str) -> str | None:
    """The Unix socket a URL's host stands for (a live forward of this process), or ``None``
    for any other URL (reached over TCP as it says)."""
    try:
        host = urlsplit(str(url)).hostname
    except ValueError:
        return None
    return _SOCKETS.get(host or "")


def connector_for(url: str, **kwargs: Any) -> aiohttp.BaseConnector:
    """The aiohttp connector that reaches ``url``: a ``UnixConnector`` on the forward's socket
    for a forwarded base URL, else a ``TCPConnector``. ``kwargs`` go to either (``limit``,
    ``force_close``; ``ttl_dns_cache`` only to the TCP one)."""
    import aiohttp

    path = unix_socket_for(url)
    if path is None:
        return aiohttp.TCPConnector(**kwargs)
    kwargs.pop("ttl_dns_cache", None)
    return aiohttp.UnixConnector(path=path, **kwargs)


def same_connector(connector: aiohttp.BaseConnector | None, **kwargs: Any
                   ) -> aiohttp.BaseConnector:
    """A new connector to where ``connector`` connects (a session's, for a one-shot retry)."""
    import aiohttp

    if isinstance(connector, aiohttp.UnixConnector):
        return aiohttp.UnixConnector(path=connector.path, **kwargs)
    return aiohttp.TCPConnector(**kwargs)


async def open_connection(url: str, host: str, port: int
                          ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to where ``url`` is served (``host``/``port`` as the URL says, used
    when it is not a forward)."""
    path = unix_socket_for(url)
    if path is not None:
        return await asyncio.open_unix_connection(path)
    return await asyncio.open_connection(host, port)


__all__ = ["DOMAIN", "connector_for", "open_connection", "private_socket", "register",
           "same_connector", "unix_socket_for", "unregister"]
