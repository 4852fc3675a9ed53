"""``read_file(path, under=ROOT)`` follows no link below ROOT, on this machine and over SSH: a
record that names a run's log cannot make cleanslate read another file of the host (a symbolic
link at ``<artifacts>/<run id>/server.log`` to ``/etc/shadow`` was copied into the store)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from cleanslate.hosts import Executor, LocalExecutor


@pytest.fixture
def executor() -> Executor:
    return LocalExecutor()


Outcome = bytes | OSError


def _reads(executor: Executor, *calls: tuple[Path | str, Path, dict[str, int | bool]]
           ) -> list[Outcome]:
    """Each ``read_file(path, under=root, **kw)`` over one connection: its bytes or error."""
    async def go() -> list[Outcome]:
        out: list[Outcome] = []
        try:
            for path, root, kw in calls:
                try:
                    out.append(await executor.read_file(
                        str(path), under=str(root), max_bytes=int(kw.get("max_bytes", 1 << 20)),
                        tail=bool(kw.get("tail", False))))
                except OSError as exc:
                    out.append(exc)
        finally:
            await executor.close()
        return out

    return asyncio.run(go())


def _refused(outcome: Outcome, why: str) -> bool:
    return isinstance(outcome, PermissionError) and why in str(outcome)


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``artifacts/run1/server.log`` and a secret beside the artifacts folder."""
    root = tmp_path / "artifacts"
    run = root / "run1"
    run.mkdir(parents=True)
    (run / "server.log").write_bytes(b"0123456789")
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$secret-hash")
    return root, run, secret


def test_the_runs_own_file_is_read(executor: Executor, tmp_path: Path) -> None:
    root, run, _ = _tree(tmp_path)
    linked = tmp_path / "link-to-artifacts"  # the root itself may be a link: the user's own
    linked.symlink_to(root)
    whole, tail, head, via_link, missing = _reads(
        executor, (run / "server.log", root, {}),
        (run / "server.log", root, {"max_bytes": 4, "tail": True}),
        (run / "server.log", root, {"max_bytes": 4}),
        (linked / "run1" / "server.log", linked, {}), (run / "missing.log", root, {}))
    assert (whole, tail, head, via_link) == (b"0123456789", b"6789", b"0123", b"0123456789")
    assert isinstance(missing, FileNotFoundError), missing


def test_a_link_below_the_root_is_not_followed(executor: Executor, tmp_path: Path) -> None:
    root, run, secret = _tree(tmp_path)
    (run / "server.log").unlink()
    (run / "server.log").symlink_to(secret)  # the reproduction: the log is a link to a secret
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(secret, elsewhere / "server.log")
    (root / "run2").symlink_to(elsewhere)  # the run folder is a link
    outcomes = _reads(executor, (run / "server.log", root, {}),
                      (root / "run2" / "server.log", root, {}))
    assert all(_refused(o, "symbolic link") for o in outcomes), outcomes


def test_outside_the_root_a_fifo_and_a_hard_link_are_refused(executor: Executor,
                                                             tmp_path: Path) -> None:
    root, run, secret = _tree(tmp_path)
    os.mkfifo(run / "fifo")  # opened without blocking, then refused
    os.link(secret, run / "hard.log")
    *outside, fifo, hard = _reads(
        executor, *((p, root, {}) for p in (secret, f"{run}/../../shadow", "/etc/passwd", root)),
        (run / "fifo", root, {}), (run / "hard.log", root, {}))
    assert all(_refused(o, "not a file under") for o in outside), outside
    assert _refused(fifo, "not a regular file"), fifo
    assert _refused(hard, "hard links"), hard


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_file_of_another_user_is_refused(executor: Executor, tmp_path: Path) -> None:
    root, run, _ = _tree(tmp_path)
    os.chown(run / "server.log", 65534, 65534)
    (outcome,) = _reads(executor, (run / "server.log", root, {}))
    assert _refused(outcome, "owned by"), outcome


def test_over_ssh_the_host_reads_without_following(sshd: object, ssh_home: Path,
                                                  tmp_path: Path) -> None:
    """The same rules on a remote host (the host's ``python3`` runs
    :mod:`cleanslate.hosts.files`): a file, a link refused with the reason, a missing file."""
    from cleanslate.hosts.ssh import SSHExecutor

    root, run, secret = _tree(tmp_path)
    (run / "link.log").symlink_to(secret)
    tail, link, missing = _reads(SSHExecutor("plain"),
                                 (run / "server.log", root, {"max_bytes": 4, "tail": True}),
                                 (run / "link.log", root, {}), (run / "missing.log", root, {}))
    assert tail == b"6789"
    assert _refused(link, "symbolic link"), link
    assert isinstance(missing, FileNotFoundError), missing
