"""A SQLite store or an artifacts folder reached through a folder link that another user planted
is refused (issue 35, item 5): SQLite creates and writes the file where the link points, so
``--store sqlite:////tmp/shared/app.db`` with ``/tmp/shared -> /var/lib/app`` (a link of
``nobody``) made cleanslate's tables in root's own database. A link of one's own is followed."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from cleanslate.errors import InputError
from cleanslate.store import Store
from tests._kit import NOBODY, as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant as nobody")


@pytest.fixture(autouse=True)
def _own_artifacts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEANSLATE_ARTIFACTS", raising=False)
    monkeypatch.delenv("CLEANSLATE_STORE", raising=False)


def _roots_database(tmp_path: Path) -> Path:
    """Root's own SQLite database (one table of its own), mode 0600, in a folder of root's."""
    folder = tmp_path / "app"
    folder.mkdir(mode=0o700)
    db = folder / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table app_users (name text)")
    db.chmod(0o600)
    return db


def _tables(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return sorted(r[0] for r in conn.execute("select name from sqlite_master"))


def test_a_store_through_another_users_folder_link_is_refused(
        shared: Path, tmp_path: Path) -> None:
    db = _roots_database(tmp_path)
    link = shared / "data"
    as_user(NOBODY, lambda: os.symlink(db.parent, link))
    for name in ("app.db", "new.db"):
        with pytest.raises(InputError) as info:
            Store(f"sqlite:///{link / name}")
        assert "refused" in str(info.value) and "another user may have planted" in str(info.value)
    assert _tables(db) == ["app_users"] and sorted(os.listdir(db.parent)) == ["app.db"]


def test_artifacts_through_another_users_folder_link_are_refused(
        shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = shared / "artifacts"
    as_user(NOBODY, lambda: os.symlink(target, link))
    monkeypatch.setenv("CLEANSLATE_ARTIFACTS", str(link / "runs"))
    with pytest.raises(InputError, match=r"artifacts folder: .* another user may have planted"):
        Store(f"sqlite:///{tmp_path / 'cleanslate.db'}").close()
    assert os.listdir(target) == []


def test_a_store_through_ones_own_folder_link_opens(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "alias").symlink_to(real)
    Store(f"sqlite:///{tmp_path / 'alias' / 'cleanslate.db'}").close()
    assert "cs_runs" in _tables(real / "cleanslate.db")
