"""What the report tests check a rendered page and its plots with: headless Chromium on a local
file (its console messages, a screenshot), and the pixels of a PNG plot."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cleanslate.report import HEIGHT, WIDTH

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


def png_pixels(data: bytes) -> Any:
    """The pixels of a PNG (rows x columns x channels, floats 0..1)."""
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(data), format="png")


def assert_real_plot(data: bytes) -> None:
    pixels = png_pixels(data)
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    rgb = pixels[..., :3]
    assert float(rgb.std()) > 0.05, "the plot is (nearly) uniform"
    assert float((rgb.mean(axis=2) < 0.9).mean()) > 0.01, "the plot is (nearly) blank"
