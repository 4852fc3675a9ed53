"""The report of studies run for real: the HTML page in headless Chromium, the PNG files, the
comparison, and the store opened by optuna-dashboard. All ``slow`` (they build the studies
with ``cleanslate tune``, about 40 s, once per session)."""

from __future__ import annotations

import html
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cleanslate.report import load_report
from cleanslate.store import Store
from tests._kit import free_port
from tests.conftest import Processes, run_cli
from tests.report._browser import (
    assert_real_plot,
    assert_screenshot,
    console_messages,
    png_pixels,
    run_chromium,
)
from tests.report.conftest import StudyStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def html_page(live_store: StudyStore) -> Path:
    page = live_store.folder / "report.html"
    done = run_cli("report", "report-tiny", "--store", live_store.url, "--html", str(page),
                   timeout=120)
    assert done.returncode == 0, done.stderr
    return page


def test_html_renders_in_chromium_without_console_errors(html_page: Path,
                                                         tmp_path: Path) -> None:
    shot = tmp_path / "screenshot.png"
    done = run_chromium(html_page, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000")
    assert done.returncode == 0, done.stderr[-3000:]
    console = console_messages(done.stderr)
    assert console == [], f"console messages: {console}"
    assert_screenshot(shot)


def test_dom_shows_the_best_configuration_and_every_trial(
        html_page: Path, live_store: StudyStore, tmp_path: Path) -> None:
    done = run_chromium(html_page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-3000:]
    dom = done.stdout
    report = load_report(Store(live_store.url), "report-tiny")
    assert {t.status for t in report.results} == {"feasible", "infeasible"}
    for trial in report.trials:
        assert f'id="trial-report-tiny-{trial.number}"' in dom
    best = report.best
    assert best is not None
    assert f"Best configuration: trial #{best.number}" in dom
    launch = re.search(r'<pre class="launch">(.*?)</pre>', dom, re.S)
    assert launch is not None
    assert html.unescape(launch.group(1)) == best.launch_command
    oom = next(t for t in report.trials if t.record.cause == "oom")
    assert "OutOfMemoryError" in dom and f"Trial #{oom.number}" in dom
    assert 'id="simulated"' in dom


def test_png_files(live_store: StudyStore, cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "plots"
    done = cli("report", "report-tiny", "--store", live_store.url, "--png", str(folder),
               timeout=120)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in folder.iterdir())
    assert [n for n in names if not n.startswith("level-")] == [
        "ablation.png", "pareto.png", "throughput.png"]
    # the best trial's measured levels, one panel each (issue 36): which trial is best varies
    levels = [n for n in names if n.startswith("level-")]
    assert levels and all(re.fullmatch(r"level-\d+-c_\d+\.png", n) for n in levels)
    for path in folder.iterdir():
        if path.name.startswith("level-"):  # a panel of its own size, drawn, not blank
            assert png_pixels(path.read_bytes()).std() > 0
        else:
            assert_real_plot(path.read_bytes())


def test_compare_two_real_studies(live_store: StudyStore, cli: Any, tmp_path: Path) -> None:
    page = tmp_path / "compare.html"
    done = cli("report", "report-tiny", "--store", live_store.url, "--compare",
               "report-tiny-b", "--html", str(page), "--png", str(tmp_path / "png"),
               timeout=120)
    assert done.returncode == 0, done.stderr
    assert "comparison" in done.stdout
    text = page.read_text()
    assert "report-tiny vs report-tiny-b" in text
    for name in live_store.studies:
        for trial in Store(live_store.url).trials(name):
            assert f'id="trial-{name}-{trial.number}"' in text
    # The grid study has no ablation plot; the overlay plots hold both.
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert [n for n in names if not n.startswith("level-")] == [
        "ablation-report-tiny.png", "pareto.png", "throughput.png"]
    # each study's best trial's level panels, named by the study (issue 36)
    for name in ("report-tiny", "report-tiny-b"):
        assert any(re.fullmatch(rf"level-{name}-\d+-c_\d+\.png", n) for n in names), names


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:  # 127.0.0.1 only
        return json.loads(response.read())


def test_optuna_dashboard_finds_the_study(live_store: StudyStore, procs: Processes,
                                          tmp_path: Path) -> None:
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent /
                                                  "optuna-dashboard")
    if not Path(exe).exists():
        pytest.skip("optuna-dashboard is not installed (pip install optuna-dashboard)")
    port = free_port()
    log = (tmp_path / "dashboard.log").open("wb")
    proc = procs.start([exe, live_store.url, "--host", "127.0.0.1", "--port", str(port)],
                       stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    summaries: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()[-3000:]
        try:
            summaries = _get(f"{base}/api/studies")["study_summaries"]
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    names = {s["study_name"]: s for s in summaries}
    assert set(live_store.studies) <= set(names), summaries
    detail = _get(f"{base}/api/studies/{names['report-tiny']['study_id']}")
    records = Store(live_store.url).trials("report-tiny")
    assert len(detail["trials"]) == len(records)
    # Our trial attributes are visible in the dashboard: status and cause of each trial.
    attrs = {t["number"]: {a["key"]: a["value"] for a in t["user_attrs"]}
             for t in detail["trials"]}
    for record in records:
        assert attrs[record.number]["status"] == record.status
        if record.cause:
            assert attrs[record.number]["cause"] == record.cause
    assert detail["best_trials"][0]["number"] == load_report(
        Store(live_store.url), "report-tiny").best.number  # type: ignore[union-attr]
    # Ended by its PID.
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode is not None
