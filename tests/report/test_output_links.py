"""``report --html``, ``--out`` (CSV and JSON) and ``--png`` never write through a symbolic link
another user planted in a shared folder (issue 35, item 5): exit 2 naming the option, the path
and what it is, before the store is read, and the file the link names untouched. The written
files get their documented modes: 0600 for the page and the exports (launch commands and
environments from the store), 0644 less the umask for the plots."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests._kit import NOBODY, PRECIOUS, as_user
from tests.cli.inproc import run_main
from tests.report.conftest import StudyStore

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant as nobody")



@pytest.mark.parametrize(("option", "name", "extra"), [
    ("--html", "report.html", []),
    ("--out", "trials.csv", []),
    ("--out", "trials.json", []),
    ("--out", "export", ["--format", "json"]),
])
def test_a_planted_link_as_a_report_output_is_exit_2_anduntouched(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        recorded_store: StudyStore, shared: Path, victim: Path, option: str, name: str,
        extra: list[str]) -> None:
    link = shared / name
    as_user(NOBODY, lambda: os.symlink(victim, link))
    res = run_main(capsys, monkeypatch, "report", recorded_store.studies[0], "--store",
                   recorded_store.url, option, str(link), *extra)
    assert res.code == 2, res.err
    assert f"{option}: refused: {link} is a symbolic link" in res.err and "nobody" in res.err
    assert victim.read_text() == PRECIOUS and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert os.readlink(link) == str(victim) and sorted(os.listdir(shared)) == [name]


def test_a_planted_folder_link_for_the_plots_is_exit_2(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        recorded_store: StudyStore, shared: Path, victim: Path) -> None:
    link = shared / "plots"
    as_user(NOBODY, lambda: os.symlink(victim.parent, link))
    res = run_main(capsys, monkeypatch, "report", recorded_store.studies[0], "--store",
                   recorded_store.url, "--png", str(link))
    assert res.code == 2 and "another user may have planted it" in res.err, res.err
    assert sorted(os.listdir(victim.parent)) == [victim.name]


def test_an_export_is_written_with_mode_0600(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        recorded_store: StudyStore, tmp_path: Path) -> None:
    export = tmp_path / "t.csv"
    res = run_main(capsys, monkeypatch, "report", recorded_store.studies[0], "--store",
                   recorded_store.url, "--out", str(export))
    assert res.code == 0, res.err
    assert stat.S_IMODE(export.stat().st_mode) == 0o600 and export.read_text().count("\n") > 1
    assert os.listdir(tmp_path) == ["t.csv"]  # no temporary file left


@pytest.mark.slow  # the plots take about 3 s to draw on 2 cores
def test_the_page_is_0600_and_the_plots_0644_less_the_umask(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        recorded_store: StudyStore, tmp_path: Path) -> None:
    page, plots = tmp_path / "r.html", tmp_path / "png"
    res = run_main(capsys, monkeypatch, "report", recorded_store.studies[0], "--store",
                   recorded_store.url, "--html", str(page), "--png", str(plots))
    assert res.code == 0, res.err
    assert stat.S_IMODE(page.stat().st_mode) == 0o600 and page.read_text().startswith("<!")
    pngs = sorted(plots.iterdir())
    assert pngs and all(p.suffix == ".png" for p in pngs)  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert {stat.S_IMODE(p.stat().st_mode) for p in pngs} == {0o644 & ~umask}
