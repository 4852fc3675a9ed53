"""Servers that close kept-alive connections without saying so.

``llama-server`` closes the connection after each streamed response but sends no ``Connection:
close``; an HTTP/1.1 client that keeps connections for reuse (aiohttp's pool) then writes its
next request into a dead socket and fails with ``ServerDisconnectedError`` or ``ClientOSError:
Can not write request body``, although the server is fine.

The rule here: a request that fails on a **reused** connection **before any response byte** is
retried once on a new connection (a one-shot session whose connector never reuses). From then on
the session's connector closes every connection after its response instead of pooling it, so
the session stops reusing connections to that server. aiohttp has no public switch for that on
a live connector (a request's ``Connection: close`` header is not honoured, and a response puts
its connection back by itself at the end of the body): :func:`note_retry` sets the connector's
force-close flag (``BaseConnector._force_close``, aiohttp 3.9 to 3.14), and
``tests/bench/test_keepalive.py`` fails if a new aiohttp stops honouring it.

Whether a connection was reused comes from aiohttp's own trace signal (:func:`trace_config`,
attached by every session the bench and the smoke test make). A failure on a *new* connection,
or after the response began, is the server's and is never retried. Retries are counted
(``RequestRecord.retried``, ``LevelResult.connection_retries``) and reported.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp

from cleanslate.hosts.forward import same_connector


@dataclass
class KeepAlive:
    """What one session learned about its server: ``closes_silently`` once a stale reused
    connection was seen; ``retries`` counts the requests sent again because of it."""

    closes_silently: bool = False
    retries: int = 0


_STATES: weakref.WeakKeyDictionary[aiohttp.ClientSession, KeepAlive] = (
    weakref.WeakKeyDictionary())


def state_of(session: aiohttp.ClientSession) -> KeepAlive:
    state = _STATES.get(session)
    if state is None:
        state = _STATES[session] = KeepAlive()
    return state


async def _on_reuse(_session: aiohttp.ClientSession, ctx: Any, _params: Any) -> None:
    request_ctx = getattr(ctx, "trace_request_ctx", None)
    if isinstance(request_ctx, dict):
        request_ctx["reused"] = True


def trace_config() -> aiohttp.TraceConfig:
    """The trace that tells a request whether its connection came from the pool."""
    config = aiohttp.TraceConfig()
    config.on_connection_reuseconn.append(_on_reuse)
    return config


def request_context() -> dict[str, bool]:
    """A fresh per-request context for ``session.post(..., trace_request_ctx=...)``; the
    caller sets ``responded`` once the response headers arrived."""
    return {"reused": False, "responded": False}


def is_stale(exc: BaseException, ctx: dict[str, bool]) -> bool:
    """Whether ``exc`` is a write into (or a read from) a kept-alive connection the server had
    already closed: a disconnect or socket error on a reused connection before any response."""
    if ctx.get("responded") or not ctx.get("reused"):
        return False
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False  # could not connect at all: not a stale connection
    return isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)


def note_retry(session: aiohttp.ClientSession) -> None:
    """Count a retry and stop the session from reusing connections (see the module doc)."""
    state = state_of(session)
    state.closes_silently = True
    state.retries += 1
    connector = session.connector
    if connector is not None and hasattr(connector, "_force_close"):
        connector._force_close = True


def fresh_session(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """A one-shot session like ``session`` whose connector never reuses a connection."""
    # The same destination: a forward's Unix socket stays the socket.
    return aiohttp.ClientSession(connector=same_connector(session.connector, force_close=True),
                                 timeout=session.timeout)


__all__ = ["KeepAlive", "fresh_session", "is_stale", "note_retry",
           "request_context", "state_of", "trace_config"]
