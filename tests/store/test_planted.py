"""A SQLite store another user planted, or could replace, is refused (exit 2, with the reason),
as OpenSSH refuses such a key file: ``tune``, ``check`` and ``stop`` default to
``./cleanslate.db``, and a file of uid ``nobody`` planted in a world-writable working folder was
opened and its run records acted on (the operator's ``tune`` "cleaned up" a planted run).

Giving a file to another user needs root; the tests that do are skipped otherwise."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from cleanslate.errors import InputError
from cleanslate.store import Store

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file away")


@pytest.fixture(autouse=True)
def _own_artifacts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEANSLATE_ARTIFACTS", raising=False)
    monkeypatch.delenv("CLEANSLATE_STORE", raising=False)


def _shared(tmp_path: Path, mode: int = 0o1777) -> Path:
    """A working folder every user can write (``/tmp``-like with the sticky bit)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    return folder


def _store_file(path: Path) -> Path:
    """A store with cleanslate's tables, as this user made it (0600)."""
    Store(f"sqlite:///{path}").close()
    return path


def _refused(url: str | None, *, create: bool = False) -> InputError:
    with pytest.raises(InputError) as info:
        Store(url, create=create)
    return info.value


@as_root
def test_a_store_of_another_user_is_refused(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction: ``./cleanslate.db`` of ``nobody`` in a world-writable folder."""
    folder = _shared(tmp_path)
    planted = _store_file(folder / "cleanslate.db")
    os.chown(planted, NOBODY, NOBODY)
    monkeypatch.chdir(folder)
    for create in (False, True):  # stop, check / tune, worker
        error = _refused(None, create=create)
        assert error.where == "--store"
        assert "owned by nobody (uid 65534)" in error.message
        assert str(planted) in error.message
        assert "--store" in (error.hint or "") and "$CLEANSLATE_STORE" in (error.hint or "")
    monkeypatch.setenv("CLEANSLATE_STORE", str(planted))
    assert _refused(None).where == "$CLEANSLATE_STORE"
    assert _refused(f"sqlite:///{planted}").where == "--store"


@as_root
def test_a_link_or_a_journal_of_another_user_is_refused(tmp_path: Path) -> None:
    own = _store_file(tmp_path / "own.db")
    link = tmp_path / "link.db"
    link.symlink_to(own)
    Store(f"sqlite:///{link}", create=False).close()  # a link of this user's: followed
    os.lchown(link, NOBODY, NOBODY)
    assert "symbolic link owned by nobody" in _refused(f"sqlite:///{link}").message
    journal = tmp_path / "own.db-journal"  # SQLite would roll it back into the store
    journal.write_bytes(b"")
    os.chown(journal, NOBODY, NOBODY)
    assert "own.db-journal is owned by nobody" in _refused(f"sqlite:///{own}").message


def test_a_store_others_can_write_is_refused(tmp_path: Path) -> None:
    own = _store_file(tmp_path / "own.db")
    for mode, who in ((0o666, "others"), (0o620, "its group")):
        own.chmod(mode)
        message = _refused(f"sqlite:///{own}").message
        assert f"writable by {who} (mode {mode:04o})" in message
        assert stat.S_IMODE(own.stat().st_mode) == mode  # refused, not silently changed
    own.chmod(0o644)  # readable by others: tightened as before, not refused
    Store(f"sqlite:///{own}").close()
    assert stat.S_IMODE(own.stat().st_mode) == 0o600


def test_a_folder_that_lets_others_swap_the_store_is_refused(tmp_path: Path) -> None:
    folder = _shared(tmp_path, 0o777)  # world-writable, no sticky bit
    own = folder / "own.db"
    with sqlite3.connect(own) as conn:
        conn.execute("CREATE TABLE t (x)")
    own.chmod(0o600)
    message = _refused(f"sqlite:///{own}").message
    assert "without the sticky bit" in message and str(folder) in message
    new = folder / "new.db"
    assert "without the sticky bit" in _refused(f"sqlite:///{new}", create=True).message
    assert not new.exists()  # nothing created there
    folder.chmod(0o1777)  # /tmp-like: others cannot rename or remove this user's file
    Store(f"sqlite:///{own}", create=False).close()
    Store(f"sqlite:///{new}").close()
    assert stat.S_IMODE(new.stat().st_mode) == 0o600


@as_root
def test_an_artifacts_folder_of_another_user_or_writable_by_others_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(mode=0o700)
    os.chown(artifacts, NOBODY, NOBODY)
    error = _refused(url, create=True)  # a store that launches: refused at once
    assert "artifacts folder" in error.message and "owned by nobody" in error.message
    reader = Store(url, create=False)  # one that only reads (report) is not
    with pytest.raises(InputError, match="artifacts folder"):
        reader.artifacts_root  # noqa: B018
    reader.close()
    shared = tmp_path / "shared-artifacts"
    shared.mkdir()
    shared.chmod(0o1777)  # even with the sticky bit: others could plant a run's folder
    monkeypatch.setenv("CLEANSLATE_ARTIFACTS", str(shared))
    error = _refused(url, create=True)
    assert error.where == "$CLEANSLATE_ARTIFACTS" and "writable by others" in error.message
