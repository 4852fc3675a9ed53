"""The store's fixtures: each test on a fresh SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cleanslate.store import Store

IMPLEMENTATIONS = ("sqlite", "postgresql")


@pytest.fixture(params=IMPLEMENTATIONS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database: a new SQLite file, or a new PostgreSQL database (dropped
    after the test)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cleanslate.db'}"
        return
    import psycopg

    server: str = request.getfixturevalue("postgres_url")
    name = f"cs_contract_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = Store(store_url)
    yield opened
    opened.close()
