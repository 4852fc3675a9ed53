"""The store never holds a secret, keeps its file private, and turns every bad ``--store`` into
an input error that names it without its password."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from cleanslate.errors import InputError
from cleanslate.redact import REDACTED
from cleanslate.store import RunRecord, Store, TrialRecord, display_url
from cleanslate.store._tables import RunRow, StudyRow, TrialRow
from tests.store.documents import check_report, finding, level, teardown_report

SECRETS = ("hf_secret123", "sk-proj-abcdef123456", "pgpass-9876", "other-srv-key-42",
           "bearer-tok-777")


def _run(**extra: Any) -> RunRecord:
    fields: dict[str, Any] = {
        "id": "r-1", "host": "local", "engine": "vllm", "model": "m",
        "argv": ("vllm", "serve", "m", "--api-key", "sk-proj-abcdef123456"),
        "flags": {"api-key": "sk-proj-abcdef123456", "max-num-seqs": 64},
        "env": {"HF_TOKEN": "hf_secret123", "DB": "postgresql://u:pgpass-9876@h/db"},
        "marker": "r-1", "port": 8000, "url": "http://127.0.0.1:8000",
        "log_path": "/x/log", "artifacts_dir": "/x",
        "detail": "connect postgresql://u:pgpass-9876@h/db refused",
        "log_tail": "non-default args: {'api_key': ['sk-proj-abcdef123456']}\n"
                    "token hf_secret123 loaded\n",
        "verdict_after": check_report("dirty", finding(
            "stray `python other.py --api-key other-srv-key-42`",
            evidence={"cmdline": ["python", "other.py", "--api-key", "other-srv-key-42"]})),
        "teardown": teardown_report("curl -H 'Authorization: Bearer bearer-tok-777'"),
    }
    fields.update(extra)
    return RunRecord(**fields)


def _trial(**extra: Any) -> TrialRecord:
    fields: dict[str, Any] = {
        "study": "s", "number": 0, "params": {"max-num-seqs": 64},
        "flags": {"api-key": "sk-proj-abcdef123456", "max-num-seqs": 64},
        "argv": ("vllm", "serve", "--api-key", "sk-proj-abcdef123456"),
        "status": "infeasible", "cause": "crashed",
        "detail": "HF_TOKEN=hf_secret123 rejected",
        "log_tail": "starting with sk-proj-abcdef123456",
        "findings_after": (finding("x --api-key other-srv-key-42"),),
        "levels": (level("c=8", total_token_throughput=123.5, output_throughput=80.0),),
    }
    fields.update(extra)
    return TrialRecord(**fields)


SPEC: dict[str, Any] = {
    "name": "s", "engine": "vllm", "model": "m",
    "env": {"HF_TOKEN": "hf_secret123"},
    "fixed": {"api-key": "sk-proj-abcdef123456"},
    "launch": ["srv", "--store", "postgresql://u:pgpass-9876@h/db"],
    "space": {"max-num-seqs": [64, 128]},
}


def _raw_bytes(path: Path) -> bytes:
    """The database file and any journal beside it."""
    data = b""
    for candidate in path.parent.iterdir():
        if candidate.name.startswith(path.name):
            data += candidate.read_bytes()
    return data


def test_sqlite_file_never_holds_a_secret_and_is_private(tmp_path: Path) -> None:
    db = tmp_path / "cleanslate.db"
    store = Store(f"sqlite:///{db}")
    store.save_run(_run())
    store.save_trial(_trial())
    store.save_study("s", SPEC, "running")
    # Saved again from what the store returns (redacted): the log tail fetched later still
    # holds the raw token; the store remembers the secrets it has seen.
    again = store.get_run("r-1").model_copy(update={"log_tail": "bye hf_secret123"})
    store.save_run(again)
    store.close()
    raw = _raw_bytes(db)
    assert b"max-num-seqs" in raw  # the records are there
    for secret in SECRETS:
        assert secret.encode() not in raw, secret
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_records_read_back_are_redacted_and_keep_their_figures(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    store.save_run(_run())
    trial = store.save_trial(_trial())
    assert trial.id is not None and trial.flags["api-key"] == "sk-proj-abcdef123456"
    run = store.get_run("r-1")
    # A URL under a name that is not a known knob is not kept at all (issue 35).
    assert run.env == {"HF_TOKEN": REDACTED, "DB": REDACTED}
    assert run.argv[-1] == REDACTED and run.flags == {"api-key": REDACTED, "max-num-seqs": 64}
    assert run.port == 8000 and run.marker == "r-1"
    [back] = store.trials("s")
    assert back.levels[0].total_token_throughput == 123.5
    assert back.params == {"max-num-seqs": 64}
    stored = store.study("s") if store.save_study("s", SPEC, "running") else None
    assert stored is not None
    # A spec compares with the stored one through Store.redacted (resume).
    assert stored.spec == store.redacted(SPEC)
    assert store.redacted(stored.spec) == stored.spec


def test_rows_written_by_an_older_version_are_redacted_on_the_way_out(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    Store(url).close()
    writer = Store(url)
    run = _run()
    with Session(writer.engine) as session, session.begin():  # raw rows, as main wrote them
        session.add(RunRow(id=run.id, host=run.host, engine=run.engine, model=run.model,
                           status="stopped", data=run.model_dump(mode="json"),
                           started_at=1.0, updated_at=1.0, study="s", trial=0))
        session.add(TrialRow(study="s", number=0, status="infeasible",
                             data=_trial().model_dump(mode="json"), started_at=1.0,
                             updated_at=1.0))
        session.add(StudyRow(name="s", spec=SPEC, status="finished", created_at=1.0,
                             updated_at=1.0, elapsed_s=1.0))
    writer.close()
    reader = Store(url)  # a new process: it has seen no secret value
    text = json.dumps([r.model_dump(mode="json") for r in reader.runs()]
                      + [t.model_dump(mode="json") for t in reader.trials("s")]
                      + [reader.study("s").model_dump(mode="json")])
    for secret in SECRETS:
        assert secret not in text, secret


def test_existing_store_file_is_tightened(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    Store(f"sqlite:///{db}").close()
    db.chmod(0o644)
    Store(f"sqlite:///{db}").close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_artifacts_folder_is_created_private(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLEANSLATE_ARTIFACTS", raising=False)
    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    assert store.artifacts == tmp_path / "artifacts"
    assert stat.S_IMODE(store.artifacts.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    monkeypatch.setenv("CLEANSLATE_ARTIFACTS", str(shared))
    assert stat.S_IMODE(store.artifacts.stat().st_mode) == 0o755  # a folder we did not make


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:hunter2@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql+psycopg://u@h/db?password=hunter2", "postgresql+psycopg://u@h/db?password=***"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ("not a url://u:hunter2@h", "not a url://u:***@h"),
])
def test_display_url(url: str, shown: str) -> None:
    assert display_url(url) == shown


# -- bad --store ----------------------------------------------------------------------------------


def _bad_stores(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (--store value, text the error must contain)."""
    text = tmp_path / "notes.db"
    text.write_text("hello, not a database\n")
    png = tmp_path / "image.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    folder = tmp_path / "folder.db"
    folder.mkdir()
    return {
        "text file": (f"sqlite:///{text}", "not a SQLite database"),
        "png by path": (str(png), "not a SQLite database"),
        "directory": (f"sqlite:///{folder}", "is a folder"),
        "missing folder": (str(tmp_path / "nope" / "x.db"), "does not exist"),
        "port out of range": ("postgresql://u@127.0.0.1:99999/db", "out of range"),
        "port not a number": ("postgresql://u@127.0.0.1:abc/db", "not a database URL"),
        "unknown scheme": ("foo://u@h/db", "unknown database scheme"),
        "unreachable": ("postgresql://u:hunter2@127.0.0.1:1/db", "cannot open the store"),
    }


@pytest.mark.parametrize("name", ["text file", "png by path", "directory", "missing folder",
                                  "port out of range", "port not a number", "unknown scheme",
                                  "unreachable"])
def test_bad_store_is_an_input_error(tmp_path: Path, name: str) -> None:
    url, expected = _bad_stores(tmp_path)[name]
    with pytest.raises(InputError) as info:
        Store(url)
    assert info.value.where == "--store"
    assert expected in info.value.message
    assert "hunter2" not in info.value.render()


@pytest.mark.parametrize("command", ["stop", "report"])
@pytest.mark.parametrize("name", ["text file", "png by path", "directory", "missing folder",
                                  "port out of range", "unknown scheme", "unreachable"])
def test_bad_store_on_the_command_line_exits_2(cli: Any, tmp_path: Path, command: str,
                                               name: str) -> None:
    url, expected = _bad_stores(tmp_path)[name]
    done = cli(command, "NOPE", "--store", url)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    if command == "stop" or name not in ("missing folder",):
        assert expected in done.stderr or "no store at" in done.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: no unreadable file here")
def test_unreadable_store_file_is_an_input_error(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    Store(f"sqlite:///{db}").close()
    db.chmod(0)
    with pytest.raises(InputError) as info:
        Store(f"sqlite:///{db}")
    assert "cannot" in info.value.message


def test_password_never_printed_with_a_reachable_database(cli: Any, postgres_url: str) -> None:
    """A real PostgreSQL (trust authentication: any password is accepted): the messages that
    name the store show it without its password."""
    url = postgres_url.replace("postgres@", "postgres:hunter2@", 1)
    for argv in (("stop", "NOPE"), ("report", "NOPE"), ("clean", "--run", "NOPE", "--yes")):
        done = cli(*argv, "--store", url)
        assert done.returncode == 2, (argv, done.stderr)
        assert "hunter2" not in done.stdout + done.stderr, argv
        assert "Traceback" not in done.stderr
        assert "***@127.0.0.1" in done.stderr, done.stderr


def test_database_errors_after_opening_are_input_errors(tmp_path: Path) -> None:
    """A table gone (or a server gone, a locked or read-only file) after the store opened: an
    input error that names the store and what was being done, not a traceback."""
    from sqlalchemy import text

    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE cs_runs"))
    with pytest.raises(InputError) as info:
        store.get_run("r-1")
    assert "the store failed while reading a run" in info.value.message
    assert "no such table" in info.value.message
    with pytest.raises(InputError):
        store.save_run(_run())


def test_invalid_stored_record_is_an_input_error(cli: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    store = Store(url)
    with Session(store.engine) as session, session.begin():
        session.add(RunRow(id="r-bad", host="h", engine="vllm", model="m", status="ready",
                           data={"id": "r-bad", "port": "not a port"}, started_at=1.0,
                           updated_at=1.0))
    with pytest.raises(InputError) as info:
        store.get_run("r-bad")
    assert "not valid" in info.value.message
    done = cli("stop", "r-bad", "--store", url)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_a_store_must_be_a_regular_file_and_others_keep_their_mode(tmp_path: Path) -> None:
    """``--store /dev/null`` or a FIFO is refused at once (a FIFO would block the read) and
    nothing but a SQLite file holding cleanslate's tables is ever chmod-ed: an empty file, a
    link to a store, and another program's SQLite file keep their modes."""
    import sqlite3

    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        before = stat.S_IMODE(path.stat().st_mode)
        with pytest.raises(InputError) as info:
            Store(f"sqlite:///{path}")
        assert "not a regular file" in info.value.message
        assert stat.S_IMODE(path.stat().st_mode) == before
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    other.chmod(0o644)
    Store(f"sqlite:///{other}").close()
    assert stat.S_IMODE(other.stat().st_mode) == 0o644
    empty = tmp_path / "empty.db"
    empty.touch(mode=0o644)
    empty.chmod(0o644)
    Store(f"sqlite:///{empty}").close()
    assert stat.S_IMODE(empty.stat().st_mode) == 0o644
    store = tmp_path / "store.db"
    Store(f"sqlite:///{store}").close()
    store.chmod(0o644)
    link = tmp_path / "link.db"
    link.symlink_to(store)
    Store(f"sqlite:///{link}").close()
    assert stat.S_IMODE(store.stat().st_mode) == 0o644
    Store(f"sqlite:///{store}").close()
    assert stat.S_IMODE(store.stat().st_mode) == 0o600


def test_a_reading_command_never_creates_a_store(tmp_path: Path) -> None:
    """``report``, ``stop`` and ``clean --run`` read recorded runs: a SQLite path that does not
    exist is an input error, and no empty store is left behind (``--store null`` made one)."""
    path = tmp_path / "absent.db"
    with pytest.raises(InputError) as info:
        Store(f"sqlite:///{path}", create=False)
    assert "no store at" in info.value.message and info.value.where == "--store"
    assert not path.exists()
    Store(f"sqlite:///{path}").close()  # tune and serve create it
    Store(f"sqlite:///{path}", create=False).close()
