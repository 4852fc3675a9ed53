"""The :class:`Store`: records in, records out, redacted both ways."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from pydantic import ValidationError
from sqlalchemy import Text, cast, create_engine, insert, inspect, select, text, update
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session

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
from cleanslate.store._leases import (
    Claim,
    InvalidLease,
    LeaseOutcome,
    LeaseRecord,
    LeaseState,
    SlotRecord,
    config_key,
    lease_document,
    parse_lease,
)
from cleanslate.store._records import NewerSchemaError, RunRecord, RunStatus
from cleanslate.store._tables import (
    Base,
    HostRow,
    LeaseRow,
    RunRow,
    SlotRow,
    StudyRow,
    TrialRow,
)

if TYPE_CHECKING:  # the benchmark client (a trial's levels) is imported when trials are read
    from cleanslate.store._hosts import HostRecord
    from cleanslate.store._trials import StudyRecord, StudyStatus, TrialRecord, TrialStatus

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
#: Trial statuses that are results (``TrialStatus.finished``), as stored.
_FINISHED = ("feasible", "infeasible")
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


def study_digest(spec: Any) -> str:
    """``sha256:<hex>`` of a study definition as the store holds it (:attr:`StudyRecord.spec`,
    secrets redacted), over its canonical JSON: keys sorted, no blanks, UTF-8. Every worker
    launches what that row says (its ``engine``, ``launch``, ``fixed`` and ``space``): a worker
    logs this digest, so that what it ran can be compared with what was registered."""
    import hashlib
    import json

    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


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


def _guarded(what: str) -> Callable[[Callable[Concatenate[Store, _P], _R]],
                                    Callable[Concatenate[Store, _P], _R]]:
    """A store method whose database errors (the server went away, a read-only or locked file,
    a full disk), invalid stored records and records of a newer schema become an
    :class:`InputError` naming the store (without its password) and what was being done: exit
    2, never a traceback."""

    def decorate(fn: Callable[Concatenate[Store, _P], _R]) -> Callable[Concatenate[Store, _P], _R]:
        @functools.wraps(fn)
        def wrapper(self: Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
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


class Store:
    """Runs (and, with the tuner, studies and trials) in one SQLAlchemy database.

    Thread safety: one ``Store`` may be shared by threads; each call opens its own session.
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
        connect_args: dict[str, Any] = {}
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
        are what every worker launches. A missing file is checked for its folders only."""
        for candidate in (path, *(path.with_name(path.name + s) for s in _JOURNALS)):
            problem = untrusted(candidate)
            if problem is not None:
                raise self._error(f"refused: {problem}", hint=_UNTRUSTED_HINT)

    @property
    def artifacts_root(self) -> Path:
        """The folder for run folders and logs beside the store (:func:`artifacts_root`), not
        created; an existing one that another user owns or could write into is an
        :class:`InputError` (its run folders' logs and state are read back as the run's)."""
        root = artifacts_root(self.url)
        problem = untrusted(root, folder=True)
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

    @_guarded("saving a run")
    def save_run(self, run: RunRecord) -> None:
        """Insert or replace a run record, redacted (:meth:`redacted`) whoever built it, at
        the current schema version."""
        with Session(self.engine) as session, session.begin():
            row = session.get(RunRow, run.id)
            data = self.redacted(run.to_document())
            if row is None:
                session.add(RunRow(id=run.id, host=data["host"], engine=data["engine"],
                                   model=data["model"], status=run.status.value, data=data,
                                   started_at=run.started_at, updated_at=time.time(),
                                   study=run.study, trial=run.trial))
            else:
                row.status = run.status.value
                row.data = data
                row.updated_at = time.time()

    @_guarded("reading a run")
    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id; an unknown id is an :class:`InputError`."""
        if self._empty:
            raise InputError(f"no run {run_id!r} in {self.display_url}",
                             hint="this database holds no cleanslate records; pass --store if "
                                  "it is another one")
        with Session(self.engine) as session:
            row = session.get(RunRow, run_id)
            if row is None:
                known = session.scalars(
                    select(RunRow.id).order_by(RunRow.started_at.desc()).limit(5)
                ).all()
                raise InputError(
                    f"no run {run_id!r} in {self.display_url}",
                    hint=("recent runs: " + ", ".join(known)) if known else
                    "no runs are recorded in this store; pass --store if it is another one",
                )
            return RunRecord.from_document(self.redacted(row.data))

    @_guarded("reading runs")
    def runs(self, *, status: RunStatus | None = None,
             study: str | None = None) -> list[RunRecord]:
        """Run records, oldest first, redacted (stores written before redaction included);
        only those with this ``status`` or of this ``study`` when given."""
        if self._empty:
            return []
        with Session(self.engine) as session:
            query = select(RunRow).order_by(RunRow.started_at)
            if status is not None:
                query = query.where(RunRow.status == RunStatus(status).value)
            if study is not None:
                query = query.where(RunRow.study == study)
            return [RunRecord.from_document(self.redacted(r.data))
                    for r in session.scalars(query)]

    # -- studies and trials ---------------------------------------------------------------------

    @_guarded("saving a study")
    def save_study(self, name: str, spec: dict[str, Any], status: StudyStatus) -> float:
        """Create or update a study (its spec redacted: :meth:`redacted`); returns when it was
        first created (epoch seconds). ``spec`` is the study file's JSON."""
        from cleanslate.store._trials import StudyStatus

        now = time.time()
        spec = self.redacted(spec)
        value = StudyStatus(status).value
        with Session(self.engine) as session, session.begin():
            row = session.get(StudyRow, name)
            if row is None:
                row = StudyRow(name=name, spec=spec, status=value, created_at=now,
                               updated_at=now, elapsed_s=0.0)
                session.add(row)
            else:
                row.spec = spec
                row.status = value
                row.updated_at = now
            return float(row.created_at)

    @_guarded("saving a study")
    def add_study_time(self, name: str, seconds: float) -> float:
        """Add wall time spent on a study; returns its total (for ``budget.hours``)."""
        with Session(self.engine) as session, session.begin():
            row = session.get(StudyRow, name)
            if row is None:
                return seconds
            row.elapsed_s = float(row.elapsed_s or 0.0) + seconds
            return float(row.elapsed_s)

    @_guarded("reading a study")
    def study(self, name: str) -> StudyRecord | None:
        """The study (its spec redacted), ``None`` for an unknown name."""
        from cleanslate.store._trials import StudyRecord

        if self._empty:
            return None
        with Session(self.engine) as session:
            row = session.get(StudyRow, name)
            if row is None:
                return None
            return StudyRecord.model_validate({
                "name": row.name, "spec": self.redacted(row.spec), "status": row.status,
                "created_at": row.created_at, "updated_at": row.updated_at,
                "elapsed_s": row.elapsed_s or 0.0})

    @_guarded("reading studies")
    def studies(self) -> list[str]:
        """The names of the studies, oldest first."""
        if self._empty:
            return []
        with Session(self.engine) as session:
            return list(session.scalars(select(StudyRow.name).order_by(StudyRow.created_at)))

    @_guarded("saving a trial")
    def save_trial(self, trial: TrialRecord) -> TrialRecord:
        """Insert (``id`` None) or update a trial, redacted (:meth:`redacted`) in the store at
        the current schema version; returns the given record with its id."""
        with Session(self.engine) as session, session.begin():
            row = session.get(TrialRow, trial.id) if trial.id is not None else None
            if row is None:
                row = TrialRow(study=trial.study, number=trial.number, status=trial.status.value,
                               data={}, started_at=trial.started_at, updated_at=time.time())
                session.add(row)
                session.flush()
            trial = trial.model_copy(update={"id": row.id})
            row.status = trial.status.value
            row.number = trial.number
            row.data = self.redacted(trial.to_document())
            row.updated_at = time.time()
            return trial

    @_guarded("reading trials")
    def trials(self, study: str, *, status: TrialStatus | None = None) -> list[TrialRecord]:
        """A study's trial records in insertion order, redacted; only those with this
        ``status`` when given."""
        from cleanslate.store._trials import TrialRecord, TrialStatus

        if self._empty:
            return []
        with Session(self.engine) as session:
            query = select(TrialRow).where(TrialRow.study == study).order_by(TrialRow.id)
            if status is not None:
                query = query.where(TrialRow.status == TrialStatus(status).value)
            return [TrialRecord.from_document(self.redacted(r.data))
                    for r in session.scalars(query)]

    # -- leases and slots -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _study_lock(self, study: str) -> Iterator[Connection]:
        """A transaction that holds the study's claim lock until it commits: ``BEGIN
        IMMEDIATE`` on SQLite (one writer at a time), a transaction-scoped advisory lock on the
        study's name on PostgreSQL (claimers of one study wait for each other; other studies
        and every other write go on)."""
        with self.engine.connect() as conn:
            if self.engine.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
                             {"name": f"cleanslate:{study}"})
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def _lease_values(self, lease: LeaseRecord) -> dict[str, Any]:
        return {"study": lease.study, "key": lease.key, "state": lease.state.value,
                "worker": lease.worker, "host": lease.host, "slot": lease.slot,
                "trial": lease.trial, "run_id": lease.run_id, "acquired_at": lease.acquired_at,
                "heartbeat_at": lease.heartbeat_at, "expires_at": lease.expires_at,
                "data": self.redacted(lease.to_document())}

    @staticmethod
    def _lease_of(row: Any) -> LeaseRecord:
        return LeaseRecord.from_document({**row.data, "id": row.id})

    @_guarded("claiming a trial")
    def claim_lease(
        self,
        template: LeaseRecord,
        *,
        timeout_s: float,
        plan: Sequence[tuple[str, dict[str, Any]]] | None,
        first: Sequence[tuple[str, dict[str, Any]]] = (),
        limit: int,
        gone: Callable[[LeaseRecord], bool] | None = None,
        valid: Callable[[LeaseRecord], str | None] | None = None,
    ) -> Claim:
        """Claim the next configuration of ``template.study`` for ``template``'s worker and
        slot, atomically across processes (:meth:`_study_lock`).

        On the way, every active lease whose heartbeat is older than its timeout (or whose
        worker ``gone`` says is dead) is marked ``expired``: its configuration is free again.
        With a ``plan`` (grid, ablation: ``(key, params)`` in order), the first of its first
        ``limit`` configurations that has no result and no active lease is claimed. Without
        one (samplers), while results plus active leases are fewer than ``limit``: a
        configuration whose lease expired or was given back without a result, else one of
        ``first`` never claimed (the baseline), else a new one (``params`` empty, ``key``
        ``new:...``: the caller asks the sampler and :meth:`bind_lease`). The lease expires
        ``timeout_s`` after its last heartbeat.

        A row that is not a lease (:func:`~cleanslate.store._leases.parse_lease`), and a
        re-queued configuration that ``valid`` names a problem with (the caller's check against
        the study's space), is marked ``invalid`` and skipped (``Claim.invalid``): one garbled
        or hostile row stops no worker.
        """
        now = time.time()
        invalid: list[InvalidLease] = []
        with self._study_lock(template.study) as conn:
            expired, active = self._expire(conn, template.study, now, gone, invalid)
            finished = [config_key(data.get("params") or {}) for data in conn.scalars(
                select(TrialRow.data).where(TrialRow.study == template.study,
                                            TrialRow.status.in_(_FINISHED)))]
            counted = conn.scalars(select(LeaseRow.key).where(
                LeaseRow.study == template.study, LeaseRow.state == LeaseState.RELEASED,
                LeaseRow.data["outcome"].as_string() == LeaseOutcome.RESULT.value))
            taken = set(finished) | set(active) | set(counted)
            chosen: tuple[str, dict[str, Any]] | None = None
            done = False
            if plan is not None:
                targets = list(plan)[:limit]
                done = all(k in finished for k, _ in targets)
                chosen = next(((k, p) for k, p in targets if k not in taken), None)
            elif len(finished) + len(active) < limit:
                chosen = self._requeued(conn, template.study, taken, valid, invalid)
                if chosen is None:
                    ever = set(conn.scalars(select(LeaseRow.key).where(
                        LeaseRow.study == template.study)))
                    chosen = next(((k, p) for k, p in first if k not in taken | ever), None)
                if chosen is None:
                    chosen = (f"new:{secrets.token_hex(8)}", {})
            else:
                done = len(finished) >= limit
            if chosen is None:
                return Claim(lease=None, expired=expired, invalid=invalid, done=done,
                             finished=len(finished), active=len(active))
            lease = template.model_copy(update={
                "key": chosen[0], "params": chosen[1], "state": LeaseState.ACTIVE,
                "acquired_at": now, "heartbeat_at": now, "expires_at": now + timeout_s})
            row_id = conn.execute(insert(LeaseRow).values(
                **self._lease_values(lease)).returning(LeaseRow.id)).scalar_one()
            lease = lease.model_copy(update={"id": row_id})
            conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
                data=self.redacted(lease.to_document())))
        return Claim(lease=lease, expired=expired, invalid=invalid, done=False,
                     finished=len(finished), active=len(active) + 1)

    @staticmethod
    def _raw_lease_rows(conn: Connection, study: str, *states: LeaseState
                        ) -> Iterator[tuple[int, str, Any]]:
        """``(id, state, document as text)`` of the study's rows in ``states`` (every state but
        ``invalid`` when none is given), oldest first: the document is read as text and parsed
        by the caller, so that one row that is not JSON fails only itself."""
        query = select(LeaseRow.id, LeaseRow.state, cast(LeaseRow.data, Text)).where(
            LeaseRow.study == study)
        query = query.where(LeaseRow.state.in_([s.value for s in states])) if states else \
            query.where(LeaseRow.state != LeaseState.INVALID.value)
        for row in conn.execute(query.order_by(LeaseRow.id)):
            yield row[0], row[1], row[2]

    def _lease_rows(self, conn: Connection, study: str, *states: LeaseState
                    ) -> Iterator[tuple[int, str, LeaseRecord | str]]:
        """``(id, state, lease or why it is none)`` (:meth:`_raw_lease_rows`,
        :func:`parse_lease`)."""
        for row_id, state, raw in self._raw_lease_rows(conn, study, *states):
            yield row_id, state, parse_lease(row_id, raw)

    def _invalidate(self, conn: Connection, row_id: int, lease: LeaseRecord | None, why: str,
                    invalid: list[InvalidLease] | None) -> None:
        """Mark the row ``invalid`` with why (in its document too when it holds a lease)."""
        if lease is None:
            conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
                state=LeaseState.INVALID.value))
        else:
            conn.execute(update(LeaseRow).where(LeaseRow.id == row_id).values(
                **self._lease_values(lease.model_copy(update={
                    "state": LeaseState.INVALID, "detail": why,
                    "released_at": lease.released_at or time.time()}))))
        if invalid is not None:
            invalid.append(InvalidLease(row_id, why))

    def _expire(self, conn: Connection, study: str, now: float,
                gone: Callable[[LeaseRecord], bool] | None,
                invalid: list[InvalidLease] | None = None,
                ) -> tuple[list[LeaseRecord], dict[str, LeaseRecord]]:
        """Inside the study's lock: mark ``invalid`` every row of the study that is not a lease
        (:meth:`_lease_rows`), and ``expired`` every active lease whose heartbeat is older than
        its timeout or whose worker is ``gone``; returns those, and the active leases left by
        key."""
        expired: list[LeaseRecord] = []
        active: dict[str, LeaseRecord] = {}
        for row_id, state, raw in self._raw_lease_rows(conn, study):
            # Every row's JSON is read (a row that is not JSON would fail the claim's queries
            # into the documents); an active one's lease too (the others' when re-queued).
            lease = parse_lease(row_id, raw) if state == LeaseState.ACTIVE else \
                lease_document(raw)
            if isinstance(lease, str):
                self._invalidate(conn, row_id, None, lease, invalid)
                continue
            if not isinstance(lease, LeaseRecord):
                continue
            if lease.expires_at < now or (gone is not None and gone(lease)):
                why = ("no heartbeat since " + time.strftime(
                    "%H:%M:%S", time.gmtime(lease.heartbeat_at)) + " UTC") \
                    if lease.expires_at < now else "its worker is not running any more"
                lease = lease.model_copy(update={
                    "state": LeaseState.EXPIRED, "detail": why, "released_at": now})
                conn.execute(update(LeaseRow).where(LeaseRow.id == lease.id).values(
                    **self._lease_values(lease)))
                expired.append(lease)
            else:
                active[lease.key] = lease
        return expired, active

    @_guarded("expiring leases")
    def expire_leases(self, study: str,
                      gone: Callable[[LeaseRecord], bool] | None = None) -> list[LeaseRecord]:
        """Expire the study's stale leases (see :meth:`claim_lease`) and return them: each is
        returned to exactly one caller, which re-queues its trial and tears its run down."""
        if not inspect(self.engine).has_table(LeaseRow.__tablename__):
            return []
        with self._study_lock(study) as conn:
            return self._expire(conn, study, time.time(), gone)[0]

    def _requeued(self, conn: Connection, study: str, taken: set[str],
                  valid: Callable[[LeaseRecord], str | None] | None = None,
                  invalid: list[InvalidLease] | None = None,
                  ) -> tuple[str, dict[str, Any]] | None:
        """The oldest configuration of ``study`` whose lease expired or was given back without
        a result, and that has no result and no active lease now; one that ``valid`` names a
        problem with is marked ``invalid`` and passed over."""
        for row_id, _state, lease in self._lease_rows(conn, study, LeaseState.EXPIRED,
                                                      LeaseState.RELEASED):
            if isinstance(lease, str):
                self._invalidate(conn, row_id, None, lease, invalid)
                continue
            if lease.key in taken or lease.key.startswith("new:") or \
                    lease.outcome == LeaseOutcome.RESULT:
                continue
            problem = valid(lease) if valid is not None else None
            if problem is not None:
                self._invalidate(conn, row_id, lease, problem, invalid)
                continue
            return lease.key, dict(lease.params)
        return None

    def _update_active(self, lease: LeaseRecord, values: dict[str, Any]) -> bool:
        """Update ``lease`` if it is still active and its worker's (compare and swap)."""
        updated = lease.model_copy(update=values)
        with Session(self.engine) as session, session.begin():
            result = session.execute(update(LeaseRow).where(
                LeaseRow.id == lease.id, LeaseRow.state == LeaseState.ACTIVE,
                LeaseRow.worker == lease.worker).values(**self._lease_values(updated)))
            return bool(getattr(result, "rowcount", 0) == 1)

    @_guarded("renewing a lease")
    def heartbeat(self, lease: LeaseRecord, timeout_s: float) -> bool:
        """Renew an active lease of this worker for ``timeout_s`` more seconds; ``False`` when
        it is not active any more (it expired: the trial is another worker's now)."""
        now = time.time()
        return self._update_active(lease, {"heartbeat_at": now, "expires_at": now + timeout_s})

    @_guarded("binding a lease")
    def bind_lease(self, lease: LeaseRecord, /, **values: Any) -> LeaseRecord:
        """Set fields of this worker's active lease (``trial``, ``key`` and ``params`` once a
        sampler's trial is asked, ``run_id``); raises ``ValueError`` when it is not active."""
        if not self._update_active(lease, values):
            raise ValueError(f"lease {lease.id} is not active any more")
        return lease.model_copy(update=values)

    @_guarded("releasing a lease")
    def release_lease(self, lease: LeaseRecord, outcome: LeaseOutcome,
                      detail: str | None = None) -> bool:
        """Give a lease back with its trial's ``outcome``; ``False`` when it had expired
        before (another worker may be running its configuration)."""
        return self._update_active(lease, {"state": LeaseState.RELEASED, "outcome": outcome,
                                           "detail": detail, "released_at": time.time()})

    @_guarded("reading leases")
    def leases(self, study: str, *, state: LeaseState | None = None) -> list[LeaseRecord]:
        """A study's leases in the order they were granted; only those in ``state`` when
        given."""
        if self._empty or not inspect(self.engine).has_table(LeaseRow.__tablename__):
            return []
        # Rows that hold no lease are left out, and those marked invalid unless asked for
        # (they are no slot's work).
        with self.engine.connect() as conn:
            states = [s for s in LeaseState if s != LeaseState.INVALID] if state is None \
                else [LeaseState(state)]
            return [lease for _id, _state, lease in self._lease_rows(conn, study, *states)
                    if not isinstance(lease, str)]

    @_guarded("saving a slot")
    def save_slot(self, slot: SlotRecord) -> None:
        """Insert or replace the state of a study's slot (redacted)."""
        with Session(self.engine) as session, session.begin():
            row = session.get(SlotRow, (slot.study, slot.slot))
            data = self.redacted(slot.to_document())
            if row is None:
                session.add(SlotRow(study=slot.study, slot=slot.slot, state=slot.state.value,
                                    data=data, updated_at=slot.updated_at))
            else:
                row.state, row.data, row.updated_at = slot.state.value, data, slot.updated_at

    @_guarded("reading slots")
    def slots(self, study: str) -> list[SlotRecord]:
        """The recorded states of a study's slots (suspect, quarantined, or back to ok)."""
        if self._empty or not inspect(self.engine).has_table(SlotRow.__tablename__):
            return []
        with Session(self.engine) as session:
            rows = session.scalars(select(SlotRow).where(SlotRow.study == study).order_by(
                SlotRow.slot))
            return [SlotRecord.from_document(self.redacted(r.data)) for r in rows]

    # -- host snapshots -------------------------------------------------------------------------

    @_guarded("saving a host snapshot")
    def save_host(self, record: HostRecord) -> HostRecord | None:
        """Insert a host's doctor snapshot, redacted (:meth:`redacted`); returns it with its id.
        A study keeps one per host and machine: when it has one already (another worker on the
        host recorded it first), nothing is written and ``None`` is returned."""
        data = self.redacted(record.to_document())
        try:
            with Session(self.engine) as session, session.begin():
                row = HostRow(study=record.study, run_id=record.run_id, host=record.host,
                              machine=record.machine, taken_at=record.snapshot.taken_at,
                              data=data)
                session.add(row)
                session.flush()
                row.data = {**data, "id": row.id}
                row_id = row.id
        except IntegrityError:
            if record.study is None or not self.has_host(record.study, record.host,
                                                         record.machine):
                raise
            return None
        return record.model_copy(update={"id": row_id})

    @_guarded("reading host snapshots")
    def has_host(self, study: str, host: str, machine: str = "") -> bool:
        """Whether the study has a snapshot of this host (and machine) already."""
        if self._empty or not inspect(self.engine).has_table(HostRow.__tablename__):
            return False
        with Session(self.engine) as session:
            return session.scalar(select(HostRow.id).where(
                HostRow.study == study, HostRow.host == host,
                HostRow.machine == machine).limit(1)) is not None

    @_guarded("reading host snapshots")
    def hosts(self, *, study: str | None = None, run_id: str | None = None
              ) -> list[HostRecord]:
        """Host snapshots in the order they were taken, redacted: a study's, a run's, or
        (neither given) all of them. A store written before snapshots were recorded has
        none."""
        from cleanslate.store._hosts import HostRecord

        if self._empty or not inspect(self.engine).has_table(HostRow.__tablename__):
            return []
        with Session(self.engine) as session:
            query = select(HostRow).order_by(HostRow.taken_at, HostRow.id)
            if study is not None:
                query = query.where(HostRow.study == study)
            if run_id is not None:
                query = query.where(HostRow.run_id == run_id)
            return [HostRecord.from_document({**self.redacted(r.data), "id": r.id})
                    for r in session.scalars(query)]

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


__all__ = ["SQLAlchemyError", "Store", "display_url", "study_digest", "tighten"]
