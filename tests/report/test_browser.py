"""The HTML page of the recorded quick-start study in headless Chromium (Debian's ``chromium``;
skipped when it is not installed, and ``.ci/run`` installs it).

Console messages of the page (script errors, ``console.error``) are what ``chromium
--enable-logging=stderr`` logs as ``...:CONSOLE...] "message", source: ...`` lines; a control page
with a script error shows the check catches them.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from cleanslate.report import load_report
from cleanslate.store import Store
from tests.conftest import run_cli
from tests.report._browser import assert_screenshot, console_messages, run_chromium
from tests.report.conftest import StudyStore


@pytest.fixture(scope="module")
def quickstart_page(recorded_store: StudyStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    page = tmp_path_factory.mktemp("page") / "quickstart.html"
    done = run_cli("report", "quickstart", "--store", recorded_store.url, "--html", str(page),
                   timeout=120)
    assert done.returncode == 0, done.stderr
    return page


def test_quickstart_page_renders_without_console_errors(quickstart_page: Path,
                                                        tmp_path: Path) -> None:
    shot = tmp_path / "screenshot.png"
    done = run_chromium(quickstart_page, tmp_path, f"--screenshot={shot}",
                        "--window-size=1280,2000")
    assert done.returncode == 0, done.stderr[-3000:]
    console = console_messages(done.stderr)
    assert console == [], f"console messages: {console}"
    assert_screenshot(shot)


def test_quickstart_dom_has_the_best_configuration_and_every_trial(
        quickstart_page: Path, recorded_store: StudyStore, tmp_path: Path) -> None:
    done = run_chromium(quickstart_page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-3000:]
    dom: str = done.stdout
    report = load_report(Store(recorded_store.url), "quickstart")
    assert len(report.trials) == 7
    for trial in report.trials:
        assert f'id="trial-quickstart-{trial.number}"' in dom
        assert f">#{trial.number}</a>" in dom
    best = report.best
    assert best is not None
    assert f"Best configuration: trial #{best.number}" in dom
    launch = re.search(r'<pre class="launch">(.*?)</pre>', dom, re.S)
    assert launch is not None and html.unescape(launch.group(1)) == best.launch_command
    assert dom.count("<img ") == 3
    assert 'id="simulated"' in dom


def test_console_check_catches_script_errors(tmp_path: Path) -> None:
    """The console check above is not vacuous: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                   "<p>x</p><script>console.error('boom'); missing();</script></body></html>")
    done = run_chromium(bad, tmp_path, "--dump-dom")
    console = console_messages(done.stderr)
    assert any("boom" in m for m in console), done.stderr[-3000:]
    assert any("missing is not defined" in m for m in console)


