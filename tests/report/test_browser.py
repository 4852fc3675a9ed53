"""The HTML page of the recorded quick-start study in headless Chromium (Debian's ``chromium``;
skipped when it is not installed, and ``.ci/run`` installs it).

Console messages of the page (script errors, ``console.error``) are what ``chromium
--enable-logging=stderr`` logs as ``...:CONSOLE...] "message", source: ...`` lines; a control page
with a script error shows the check catches them.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cleanslate.report import load_report
from cleanslate.store import Store
from tests.conftest import run_cli
from tests.report.conftest import StudyStore

#: Console messages of the page, as ``chromium --enable-logging=stderr`` logs them.
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]? ?(.*)")
#: What Chromium itself logs on a loaded machine, whatever the page: its font-loading
#: intervention ("Slow network is detected ... Fallback font will be used") appears when the
#: renderer is slow to load a local font, not because the page asked for the network, with or
#: without the "[Intervention]" prefix; and any message from Chromium's own pages' scripts
#: (``source: chrome://resources/...``). The page's own messages name a ``file://`` source.
BROWSER_NOISE = re.compile(r"Slow network is detected|source: chrome://")


def console_messages(stderr: str) -> list[str]:
    """The page's console messages in Chromium's log, without the browser's own noise."""
    return [m.group(1) for m in CONSOLE.finditer(stderr) if not BROWSER_NOISE.search(m.group(1))]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; "
                    ".ci/run installs it)")
    return path


def assert_screenshot(shot: Path, size: tuple[int, int] = (2000, 1280)) -> None:
    """The screenshot exists, has the window's size, and is neither uniform nor blank."""
    import matplotlib.image

    assert shot.is_file()
    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == size
    rgb = pixels[..., :3]
    assert float(rgb.std()) > 0.05, "the screenshot is (nearly) uniform"
    assert float((rgb.mean(axis=2) < 0.8).mean()) > 0.02, "the screenshot is (nearly) blank"


def run_chromium(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on a local file: no network, a throwaway profile."""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-default-apps", "--disable-extensions",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr",
            "--v=0", *args, page.resolve().as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


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


