"""``cleanslate._output_files``: outputs go through a temporary file and a rename, never through
a link another user planted, never into a FIFO or a device (issue 35, item 5).

The threat is measured as it was found: root writes into a world-writable sticky folder (like
``/tmp``) where ``nobody`` planted a symbolic link to a root-owned file. The links are made by
a child that has become ``nobody`` (:func:`tests._kit.as_user`)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from cleanslate._output_files import (
    OutputRefused,
    check_output,
    check_output_folder,
    make_output_folder,
    planted_link,
    write_output,
)
from cleanslate.errors import InputError
from tests._kit import NOBODY, PRECIOUS, as_user, untouched

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant as nobody")




def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_new_output_is_written_whole_with_mode_0600_and_no_temporary_file_left(
        shared: Path) -> None:
    target = shared / "result.json"
    check_output(target, where="--json")
    assert write_output(target, '{"a": 1}\n', where="--json") == target
    info = target.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert target.read_text() == '{"a": 1}\n' and _leftovers(shared) == []


def test_an_existing_file_is_replaced_and_gets_the_output_mode(shared: Path) -> None:
    target = shared / "result.json"
    target.write_text("old, longer than the new content\n")
    target.chmod(0o666)
    write_output(target, b"new\n", where="--json")
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_shared_output_is_0644_less_the_umask(shared: Path) -> None:
    old = os.umask(0o027)
    try:
        write_output(shared / "plot.png", b"\x89PNG", where="--png", mode=0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE((shared / "plot.png").stat().st_mode) == 0o640


def test_a_link_planted_by_another_user_is_refused_and_its_targetuntouched(
        shared: Path, victim: Path) -> None:
    link = shared / "result.json"
    as_user(NOBODY, lambda: os.symlink(victim, link))
    assert link.lstat().st_uid == NOBODY
    with pytest.raises(InputError) as before:
        check_output(link, where="--json")
    assert before.value.where == "--json"
    assert f"{link} is a symbolic link" in before.value.message and "nobody" in before.value.message
    with pytest.raises(OutputRefused) as at_write:
        write_output(link, "the result\n", where="--json")
    untouched(victim)
    assert os.readlink(link) == str(victim)  # the link itself is left as it was
    kept = at_write.value.kept
    assert kept.parent == shared and kept.read_text() == "the result\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and str(kept) in str(at_write.value)


def test_even_ones_own_link_as_the_target_is_refused(shared: Path, victim: Path) -> None:
    link = shared / "result.json"
    link.symlink_to(victim)
    with pytest.raises(InputError, match="is a symbolic link"):
        check_output(link, where="--json")


def test_a_fifo_target_is_refused_without_blocking(shared: Path) -> None:
    fifo = shared / "result.json"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(InputError, match="is a FIFO, not a regular file"):
        check_output(fifo, where="--json")
    with pytest.raises(OutputRefused, match="is a FIFO"):
        write_output(fifo, "x", where="--json")
    assert time.monotonic() - started < 1.0
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_device_or_a_folder_target_is_refused(shared: Path) -> None:
    with pytest.raises(InputError, match="is a character device"):
        check_output("/dev/null", where="--out")
    (shared / "dir").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        check_output(shared / "dir", where="--out")


def test_a_folder_link_planted_by_another_user_is_never_written_through(
        shared: Path, victim: Path) -> None:
    link = shared / "reports"
    as_user(NOBODY, lambda: os.symlink(victim.parent, link))
    target = link / victim.name
    for attempt in (lambda: check_output(target, where="--json"),
                    lambda: write_output(target, "x", where="--json"),
                    lambda: make_output_folder(link / "png", where="--png"),
                    lambda: check_output_folder(link / "png", where="--png")):
        with pytest.raises(InputError, match=r"owned by nobody .* another user may have planted"):
            attempt()
    untouched(victim)
    assert sorted(os.listdir(victim.parent)) == [victim.name]
    assert planted_link(target) is not None and "nobody" in (planted_link(target) or "")


def test_a_link_with_two_names_is_not_followed(shared: Path, victim: Path) -> None:
    """Another user hard-links a root-owned symbolic link (as ``/lib -> usr/lib``) into a shared
    folder: the name is theirs, the link root's. Where the kernel refuses that
    (``fs.protected_hardlinks = 1``) root makes the second name: the rule is the same."""
    roots = shared / "rootlinks"
    roots.mkdir(mode=0o755)
    (roots / "etc").symlink_to(victim.parent)
    alias = shared / "etc"
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "0":
        as_user(NOBODY, lambda: os.link(roots / "etc", alias, follow_symlinks=False))
    else:
        os.link(roots / "etc", alias, follow_symlinks=False)
    assert alias.lstat().st_uid == 0 and alias.lstat().st_nlink == 2
    with pytest.raises(InputError, match="with 2 names"):
        write_output(alias / victim.name, "x", where="--json")
    untouched(victim)


def test_ones_own_folder_link_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to("real")  # relative, as /tmp -> private/tmp
    write_output(tmp_path / "alias" / "out.csv", "a,b\n", where="--out")
    assert (real / "out.csv").read_text() == "a,b\n"
    assert planted_link(tmp_path / "alias" / "out.csv") is None
    missing = tmp_path / "alias" / "missing" / "out.csv"
    with pytest.raises(InputError) as info:
        check_output(missing, where="--out")
    assert info.value.message == f"cannot write {missing}: the folder {real}/missing does not exist"


def test_a_missing_folder_is_named_and_make_output_folder_creates_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"the folder .*missing does not exist"):
        check_output(tmp_path / "missing" / "out.json", where="--json")
    check_output_folder(tmp_path / "missing" / "deeper", where="--png")  # made at the write
    make_output_folder(tmp_path / "missing" / "deeper", where="--png", mode=0o700)
    assert stat.S_IMODE((tmp_path / "missing" / "deeper").stat().st_mode) == 0o700


def test_a_target_that_becomes_a_link_after_the_check_is_refused_at_the_write(
        shared: Path, victim: Path) -> None:
    target = shared / "result.json"
    check_output(target, where="--json")  # before the work: nothing there
    as_user(NOBODY, lambda: os.symlink(victim, target))  # planted during the work
    with pytest.raises(OutputRefused) as info:
        write_output(target, "an hour of benchmark\n", where="--json")
    untouched(victim)
    assert info.value.kept.read_text() == "an hour of benchmark\n"


def test_another_users_file_in_a_sticky_folder_is_refused_before_the_work(
        shared: Path) -> None:
    """A user cannot rename over another user's file in ``/tmp``: said before the work, not
    after an hour of benchmark."""
    theirs = shared / "result.json"
    theirs.write_text(PRECIOUS)  # root's

    def attempt() -> None:
        with pytest.raises(InputError, match="sticky bit"):
            check_output(theirs, where="--json")
        check_output(shared / "mine.json", where="--json")  # a new name is fine

    as_user(NOBODY, attempt)
    assert theirs.read_text() == PRECIOUS
