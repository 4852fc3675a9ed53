"""Opening a store: its URL, the SQLite file or PostgreSQL server behind it, the schema, and
the errors that name it."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from pydantic import ValidationError
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from cleanslate._output_files import planted_link
from cleanslate.errors import InputError
from cleanslate.hosts.files import untrusted
from cleanslate.redact import (
    REDACTED,
    Scrubber,
    redact_data,
    redact_text,
    redact_url,
    secret_values,
)
from cleanslate.store._records import NewerSchemaError
from cleanslate.store._tables import Base, RunRow

STORE_ENV = "CLEANSLATE_STORE"
DEFAULT_STORE_URL = "sqlite:///cleanslate.db"

#: Mode of a SQLite store file (and of its journal files, which SQLite creates alike).
STORE_FILE_MODE = 0o600
#: Mode of the artifacts folder cleanslate creates beside a store.
ARTIFACTS_MODE = 0o700
#: Seconds to wait for a database server to answer a connection (PostgreSQL ``connect_timeout``
#: unless the URL sets one).
CONNECT_TIMEOUT_S = 10
#: Seconds a SQLite writer waits for another process's write lock before it gives up (several
#: workers and slots write one file).
SQLITE_BUSY_TIMEOUT_S = 60
#: What a SQLite database file starts with.
_SQLITE_MAGIC = b"SQLite format 3\x00"
_URL_HINT = "sqlite:///PATH/cleanslate.db, a file path, or postgresql://user@host[:port]/db"
#: The journal files SQLite keeps beside a database (and rolls back into it when it opens).
_JOURNALS = ("-journal", "-wal", "-shm")
_UNTRUSTED_HINT = ("a store directs stop, clean --run and tune at processes, and its studies are "
                   "what workers launch: use one only you can write (chmod 600 FILE; chmod "
                   "go-w FOLDER, or a folder of your own), pass --store (or set "
                   f"${STORE_ENV}) for your own store, or share one through PostgreSQL")
#: Secret values remembered by a Store (to scrub them from later records), at most.
_MAX_REMEMBERED = 4096
#: Fields of a record that cleanslate makes and teardown acts on (ids, the marker, the run's
#: cgroup and folders, /dev/shm names seen before the run, a lease's configuration key): kept as
#: they are.
_IDENTITY_KEYS = ("id", "marker", "run_id", "cgroup", "boot_id", "machine_id", "log_path",
                  "artifacts_dir", "shm_before", "started_at", "stopped_at", "key")



def resolve_store_url(url: str | None) -> str:
    """``--store`` if given, else ``$CLEANSLATE_STORE``, else ``sqlite:///cleanslate.db``.

    A bare path (``runs.db``) is taken as a SQLite file.
    """
    value = url or os.environ.get(STORE_ENV) or DEFAULT_STORE_URL
    if "://" not in value:
        value = f"sqlite:///{value}"
    if value.startswith(("postgresql://", "postgres://")):
        # SQLAlchemy's default PostgreSQL driver is psycopg2; the one we depend on is psycopg 3.
        value = "postgresql+psycopg://" + value.split("://", 1)[1]
    return value



def display_url(url: str) -> str:
    """A store URL fit to print: no password (in the authority or the query), e.g.
    ``postgresql+psycopg://u:***@host/db``. Never raises."""
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: the text without what looks secret
        shown = redact_url(url)
    return redact_text(shown)


def artifacts_root(url: str) -> Path:
    """The folder for logs beside the store: ``<db dir>/artifacts`` for SQLite, else
    ``./artifacts`` (or ``$CLEANSLATE_ARTIFACTS``)."""
    override = os.environ.get("CLEANSLATE_ARTIFACTS")
    if override:
        return Path(override)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return Path(parsed.database).resolve().parent / "artifacts"
    return Path("artifacts").resolve()


_P = ParamSpec("_P")
_R = TypeVar("_R")
_D = TypeVar("_D", bound="Database")


def _guarded(what: str) -> Callable[[Callable[Concatenate[_D, _P], _R]],
                                    Callable[Concatenate[_D, _P], _R]]:
    """A store method whose database errors (the server went away, a read-only or locked file,
    a full disk), invalid stored records and records of a newer schema become an
    :class:`InputError` naming the store (without its password) and what was being done: exit
    2, never a traceback."""

    def decorate(fn: Callable[Concatenate[_D, _P], _R]) -> Callable[Concatenate[_D, _P], _R]:
        @functools.wraps(fn)
        def wrapper(self: _D, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(self, *args, **kwargs)
            except SQLAlchemyError as exc:
                reason = getattr(exc, "orig", None) or exc
                raise self._error(f"the store failed while {what}: {self._scrub(str(reason))}"
                                  ) from None
            except ValidationError as exc:
                invalid = InputError.from_validation(
                    exc, what=f"a record in the store is not valid ({what})",
                    scrub=self._scrub)
                raise self._error(invalid.message,
                                  hint="was it written by another version of cleanslate?"
                                  ) from None
            except NewerSchemaError as exc:
                raise self._error(f"{exc} while {what}",
                                  hint="it was written by a newer cleanslate: use that "
                                       "version (or a newer one) with this store") from None

        return wrapper

    return decorate


class Database:
    """An open store: its URL and engine, the messages that name it (without its password), and
    the redaction every document passes on its way in and out.

    Thread safety: one may be shared by threads; each call opens its own session.
    """

    def __init__(self, url: str | None = None, *, create: bool = True) -> None:
        """Open (and, for a new SQLite file, create with mode 0600) the store. With
        ``create=False`` (commands that only read or act on recorded runs: ``report``, ``stop``,
        ``clean --run``, ``check``) a SQLite file that does not exist is an :class:`InputError`
        instead, and nothing is written to an existing database (no tables are created in it).

        Bad input is an :class:`InputError` naming ``--store`` (or ``$CLEANSLATE_STORE``) with
        the URL shown without its password: a URL that does not parse, an unknown scheme, a
        port out of 1-65535, a SQLite path that is a folder, in a missing folder, unreadable,
        or a file that is not a SQLite database, and a database that cannot be reached. So is
        a SQLite file (or the folder holding it) that another user owns or could replace, and,
        with ``create``, an artifacts folder that another user owns or could write
        (:meth:`_refuse_untrusted`, :attr:`artifacts_root`).
        """
        self.url = resolve_store_url(url)
        self._where = "--store" if url else (f"${STORE_ENV}" if os.environ.get(STORE_ENV)
                                             else "--store")
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        self._tighten: Path | None = None
        self._create = create
        self._empty = False
        parsed = self._parse()
        connect_args: dict[str, int] = {}
        if parsed.get_backend_name() == "sqlite":
            self._prepare_sqlite(parsed)
            connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        elif parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
            connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
        if create:  # a store that launches: its artifacts folder is checked before anything
            self.artifacts_root  # noqa: B018
        try:
            self.engine: Engine = create_engine(self.url, future=True, connect_args=connect_args)
        except NoSuchModuleError:
            raise self._error(f"unknown database scheme {parsed.drivername!r}",
                              hint=_URL_HINT) from None
        except (ArgumentError, ValueError, TypeError) as exc:
            raise self._error(f"not a database URL ({self._scrub(str(exc))})",
                              hint=_URL_HINT) from None
        except ModuleNotFoundError as exc:
            raise self._error(f"the database driver is not installed: {exc.name}",
                              hint="pip install 'psycopg[binary]' for postgresql:// URLs"
                              ) from None
        try:
            if self._tighten is not None and inspect(self.engine).has_table(RunRow.__tablename__):
                # A store an older cleanslate made 0644: it may hold secrets in old rows. Only
                # a file holding our tables is touched (a SQLite file of another program that
                # --store happens to name keeps its mode).
                tighten(self._tighten)
            if create:
                Base.metadata.create_all(self.engine)
            else:  # a reading command writes nothing; a database without our tables is empty
                self._empty = not inspect(self.engine).has_table(RunRow.__tablename__)
        except SQLAlchemyError as exc:
            self.engine.dispose()
            reason = getattr(exc, "orig", None) or exc
            raise self._error(f"cannot open the store: {self._scrub(str(reason))}",
                              hint=self._open_hint(parsed)) from None
        except (OSError, UnicodeError, MemoryError) as exc:
            self.engine.dispose()
            raise self._error(f"cannot open the store: {self._scrub(str(exc))}") from None

    # -- opening --------------------------------------------------------------------------------

    @property
    def display_url(self) -> str:
        """The store's URL fit to print (no password): use it in every message."""
        return display_url(self.url)

    def _error(self, message: str, *, hint: str | None = None) -> InputError:
        """``WHERE: URL: message`` with the URL shown without its password."""
        return InputError(f"{self.display_url}: {message}", where=self._where, hint=hint)

    def _scrub(self, text: str) -> str:
        """An error text without the URL's password (drivers sometimes echo it)."""
        with contextlib.suppress(Exception):
            password = make_url(self.url).password
            if password:
                text = text.replace(str(password), REDACTED)
        return redact_text(text).strip()

    def _parse(self) -> URL:
        try:
            parsed = make_url(self.url)
            port = parsed.port
        except (ArgumentError, ValueError, TypeError) as exc:
            raise self._error(f"not a database URL ({self._scrub(str(exc))})",
                              hint=_URL_HINT) from None
        if port is not None and not 1 <= port <= 65535:
            raise self._error(f"port {port} is out of range (1-65535)", hint=_URL_HINT)
        return parsed

    def _open_hint(self, parsed: URL) -> str:
        if parsed.get_backend_name() == "sqlite":
            return "--store names the SQLite file cleanslate writes (cleanslate.db)"
        return ("is the database server running and reachable from here, and are the user, "
                "password and database right? (the URL comes from --store or "
                f"${STORE_ENV})")

    def _prepare_sqlite(self, parsed: URL) -> None:
        """Check a SQLite store's path; create a missing file with mode 0600, and tighten an
        existing one this user owns to 0600 (it may hold old records with secrets)."""
        database = parsed.database
        if not database or database == ":memory:" or database.startswith("file:") or \
                parsed.query.get("uri"):
            return
        path = Path(database)
        if path.is_dir():
            raise self._error("is a folder, not a database file",
                              hint="pass the file inside it: sqlite:///FOLDER/cleanslate.db")
        parent = path.parent if str(path.parent) else Path(".")
        if not self._create and not path.exists():
            raise self._error(f"no store at {path.absolute()}",
                              hint="pass --store sqlite:///PATH/cleanslate.db (or set "
                                   f"${STORE_ENV}) for the store the runs were recorded in")
        if not parent.is_dir():
            raise self._error(f"the folder {parent} does not exist",
                              hint="create the folder first, or pass another path")
        if not path.exists():
            self._refuse_untrusted(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         STORE_FILE_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise self._error(f"cannot create the store file ({exc.strerror})",
                              hint="pass a path in a folder you can write") from None
        else:
            os.close(fd)
            return
        try:
            info = path.stat()
        except OSError as exc:
            raise self._error(f"cannot read the store file ({exc.strerror})") from None
        if not stat.S_ISREG(info.st_mode):
            # A device (/dev/null), a FIFO (opening it would block) or a socket.
            raise self._error("not a regular file",
                              hint="--store names the SQLite file cleanslate writes "
                                   "(cleanslate.db), or a postgresql:// URL")
        self._refuse_untrusted(path)
        try:
            with path.open("rb") as fh:
                head = fh.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise self._error(f"cannot read the store file ({exc.strerror})") from None
        if head and head != _SQLITE_MAGIC[:len(head)]:
            raise self._error("not a SQLite database (the file holds something else)",
                              hint="--store names the SQLite file cleanslate writes "
                                   "(cleanslate.db), or a postgresql:// URL")
        self._tighten = path if head == _SQLITE_MAGIC else None

    def _refuse_untrusted(self, path: Path) -> None:
        """Refuse a SQLite store that another user planted or could replace, as OpenSSH refuses
        such a key: the file (or a journal beside it, which SQLite would roll into it) owned by
        another user or writable by group or others, a folder that lets another user replace
        it, a link of another user's (:func:`cleanslate.hosts.files.untrusted`). Its records
        direct ``stop``, ``clean --run`` and ``tune``'s recovery at processes, and its studies
        are what every worker launches. A missing file is checked for its folders only, and a
        symbolic link on the way that neither this user nor root owns is refused too
        (:func:`cleanslate._output_files.planted_link`: SQLite would create or write the file
        where another user's folder link points)."""
        for candidate in (path, *(path.with_name(path.name + s) for s in _JOURNALS)):
            problem = planted_link(candidate) or untrusted(candidate)
            if problem is not None:
                raise self._error(f"refused: {problem}", hint=_UNTRUSTED_HINT)

    @property
    def artifacts_root(self) -> Path:
        """The folder for run folders and logs beside the store (:func:`artifacts_root`), not
        created; an existing one that another user owns or could write into is an
        :class:`InputError` (its run folders' logs and state are read back as the run's)."""
        root = artifacts_root(self.url)
        problem = planted_link(root) or untrusted(root, folder=True)
        if problem is not None:
            where = "$CLEANSLATE_ARTIFACTS" if os.environ.get("CLEANSLATE_ARTIFACTS") \
                else self._where
            raise InputError(f"{self.display_url}: refused the artifacts folder: {problem}",
                             where=where, hint=_UNTRUSTED_HINT)
        return root

    @property
    def artifacts(self) -> Path:
        """:attr:`artifacts_root`, created with mode 0700 when missing (an existing folder is
        left as it is: it may be one the user keeps elsewhere)."""
        root = self.artifacts_root
        if not root.exists():
            with contextlib.suppress(FileExistsError):
                root.mkdir(mode=ARTIFACTS_MODE, parents=True)
        return root

    # -- redaction ------------------------------------------------------------------------------

    def redacted(self, document: Any) -> Any:
        """A JSON-like document as the store keeps and returns it: values of secret names, secret
        flags and argv values, URL passwords and authorization headers replaced, and every
        secret value this store has seen (an ``HF_TOKEN`` in a run's env) replaced wherever it
        appears (a server's log tail). :func:`cleanslate.redact.redact_data`; idempotent.
        Compare a document with a stored one through this (``store.redacted(spec) ==
        stored_spec``)."""
        found = secret_values(document)
        with self._lock:
            if found and len(self._secrets) < _MAX_REMEMBERED:
                self._secrets.update(found)
            known = found | self._secrets
        out = redact_data(document, Scrubber(known))
        if isinstance(document, dict) and isinstance(out, dict):
            # What teardown matches processes and files by is ours, never rewritten.
            out.update({k: document[k] for k in _IDENTITY_KEYS if k in document})
        return out

    def close(self) -> None:
        """Close the database connections (the store is not used after this)."""
        self.engine.dispose()



def tighten(path: Path) -> None:
    """Mode 0600 for a SQLite store file this user owns and its journal files (``-wal``,
    ``-shm``, ``-journal``) when others could read them. Only regular files that are not
    symbolic links are touched; files of other users, and errors, are left alone."""
    for candidate in (path, *(path.with_name(path.name + s) for s in _JOURNALS)):
        with contextlib.suppress(OSError):
            # O_NOFOLLOW | O_NONBLOCK: never through a link, never blocked on a FIFO.
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and \
                        stat.S_IMODE(info.st_mode) & 0o077:
                    os.fchmod(fd, STORE_FILE_MODE)
            finally:
                os.close(fd)



__all__ = ["ARTIFACTS_MODE", "CONNECT_TIMEOUT_S", "DEFAULT_STORE_URL", "SQLITE_BUSY_TIMEOUT_S",
           "STORE_ENV", "STORE_FILE_MODE", "Database", "SQLAlchemyError", "artifacts_root",
           "display_url", "resolve_store_url", "tighten"]
