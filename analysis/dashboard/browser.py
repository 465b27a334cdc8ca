"""Headless Chromium, for checking that a dashboard renders and for taking screenshots of it.

Used by the browser test and the screenshot script; nothing here is needed to build a dashboard.
The flags keep Chromium from reaching the network or touching a profile: the page must render from
the file alone, which is what "self-contained" promises.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from analysis.dashboard.page import PROBE_TITLE_PREFIX

BROWSER_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)
PROBE_PATTERN = re.compile(
    PROBE_TITLE_PREFIX + r" rendered=(\d+) expected=(\d+) errors=(\d+) load_ms=(\d+)")


@dataclass
class ProbeResult:
    """What the page's probe script reported (see analysis.dashboard.page)."""

    rendered: int
    expected: int
    errors: int
    load_ms: int
    error_text: str
    wall_s: float


def find_chromium() -> str | None:
    """The path of a Chromium or Chrome executable, or None."""
    for name in BROWSER_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run_headless(arguments: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, float]:
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium or Chrome found on PATH")
    with tempfile.TemporaryDirectory(prefix="dashboard-chromium-") as profile:
        command = [browser, *HEADLESS_FLAGS, f"--user-data-dir={profile}", *arguments]
        started = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        return completed, time.perf_counter() - started


def dump_dom(html_path: Path, timeout_s: float = 60.0, virtual_time_budget_ms: int = 10000) -> tuple[str, float]:
    """The DOM after the page loaded (and its timers ran, up to the virtual time budget); wall seconds."""
    completed, wall_s = _run_headless(
        [f"--virtual-time-budget={virtual_time_budget_ms}", "--dump-dom", html_path.resolve().as_uri()], timeout_s)
    if completed.returncode != 0 and not completed.stdout:
        raise RuntimeError(f"chromium failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return completed.stdout, wall_s


def probe_page(html_path: Path, timeout_s: float = 60.0) -> ProbeResult:
    """Load a page built with browser_probe=True and read back what its probe recorded."""
    dom, wall_s = dump_dom(html_path, timeout_s)
    match = PROBE_PATTERN.search(dom)
    if match is None:
        raise RuntimeError(f"the page reported no probe result; DOM starts: {dom[:500]!r}")
    errors = re.search(r'<pre id="dashboard-probe-errors">(.*?)</pre>', dom, re.DOTALL)
    rendered, expected, error_count, load_ms = (int(group) for group in match.groups())
    return ProbeResult(rendered, expected, error_count, load_ms, errors.group(1) if errors else "", wall_s)


def screenshot(url: str, png_path: Path, width: int, height: int, timeout_s: float = 60.0,
               virtual_time_budget_ms: int = 5000) -> Path:
    """A PNG of the first `height` pixels of the page at `url` (a file:// URL, may carry a #fragment)."""
    png_path.parent.mkdir(parents=True, exist_ok=True)
    completed, _ = _run_headless(
        [f"--window-size={width},{height}", f"--virtual-time-budget={virtual_time_budget_ms}",
         f"--screenshot={png_path.resolve()}", url], timeout_s)
    if not png_path.is_file():
        raise RuntimeError(f"chromium wrote no screenshot ({completed.returncode}): {completed.stderr[-2000:]}")
    return png_path
