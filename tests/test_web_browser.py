"""The page in a real browser (Debian's chromium + chromedriver through selenium) on the
simulated 8×A100 server: GPUs as `status --json` sees them, a job, a drain and a fatal
XID shown live, without a reload. Saves screenshots to $GPUWARDEN_ARTIFACTS (or the
test's temporary directory)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import SRC, require
from gpuwarden.healthwatch import HealthWatch, WatchSettings
from gpuwarden.web.server import Feed, WebServer, serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
LIVE = 2.0  # seconds within which a change must be on the page

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
except ImportError:  # pragma: no cover - CI installs it (the `test` extra)
    webdriver = None  # type: ignore[assignment]


def _check_components() -> None:
    require(webdriver is not None, "selenium is not installed (pip install selenium)", True)
    require(
        os.access(CHROMIUM, os.X_OK), "chromium is not installed (apt-get install chromium)", True
    )
    require(
        os.access(CHROMEDRIVER, os.X_OK),
        "chromedriver is not installed (apt-get install chromium-driver)",
        True,
    )


_check_components()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless",
        "--no-sandbox",  # we run as root in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1300",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def page(sim: Callable[[str], str]) -> Iterator[WebServer]:
    """`gpuwarden web` as the CLI builds it, in this process: the feed and the health watch."""
    sim("server-8xa100")
    feed = Feed(interval=1.0)  # the default: the 2 s promise is checked as users get it
    watch = HealthWatch(WatchSettings(), read=feed.snapshot, log=lambda _: None)
    feed.watch = watch
    server = serve("127.0.0.1:0", feed=feed, watch=watch)
    yield server
    server.close()


def artifacts(tmp_path: Path) -> Path:
    where = Path(os.environ.get("GPUWARDEN_ARTIFACTS") or tmp_path / "artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def wait_for(check: Callable[[], Any], within: float, what: str) -> float:
    """Seconds until `check()` is true; fails after `within` seconds."""
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started > within:
            pytest.fail(f"{what}: not within {within:g} s")
        time.sleep(0.05)


# The page redraws on every update, replacing its elements: read what it shows in one
# script (atomic with respect to redraws) rather than through element references.
READ_PAGE = """
return Array.from(document.querySelectorAll("article.gpu")).map((c) => ({
  index: Number(c.dataset.index),
  uuid: c.dataset.uuid,
  used: Number(c.dataset.memoryUsed),
  total: Number(c.dataset.memoryTotal),
  health: c.dataset.health,
  text: c.innerText,
  jobs: Array.from(c.querySelectorAll("li.lease")).map((l) => l.dataset.job),
  images: c.querySelectorAll("img").length,
}));
"""
READ_FAULTS = """
return Array.from(document.querySelectorAll("#faults tr[data-xid]")).map((r) => ({
  xid: Number(r.dataset.xid), text: r.innerText }));
"""


def cards(driver: Any) -> list[dict]:
    return driver.execute_script(READ_PAGE)


def card(driver: Any, index: int) -> dict:
    return next((c for c in cards(driver) if c["index"] == index), {})


def faults(driver: Any) -> list[dict]:
    return driver.execute_script(READ_FAULTS)


def gpuwarden(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwarden", *args]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), out.get("PYTHONPATH", "")) if p)
    return out


def test_the_page_live_in_a_browser(browser, page, cli, tmp_path):
    browser.set_window_size(1280, 1300)
    browser.get(page.url)
    wait_for(lambda: len(cards(browser)) == 8, 10, "8 GPUs on the page")
    browser.execute_script("window.notReloaded = true")

    # The memory figures are the ones `status --json` prints.
    status = json.loads(cli("status", "--json").stdout)
    for gpu in status["gpus"]:
        shown = card(browser, gpu["index"])
        assert (shown["used"], shown["total"]) == (gpu["memory_used"], gpu["memory_total"])
        assert shown["uuid"] == gpu["uuid"]

    # A job started with `gpuwarden run` appears without a reload.
    job = subprocess.Popen(
        gpuwarden("run", "-g", "1", "--", "sleep", "120"),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        from gpuwarden.leases import list_leases

        wait_for(lambda: list_leases(), 30, "the job's lease")
        [lease] = list_leases()
        took = wait_for(
            lambda: any(lease.job in c["jobs"] for c in cards(browser)),
            LIVE,
            "the job on the page",
        )
        assert took <= LIVE
        [shown] = [c for c in cards(browser) if lease.job in c["jobs"]]
        assert shown["uuid"] == lease.uuid and lease.user in shown["text"]

        # A drained GPU shows its reason, as text even when it looks like markup.
        reason = 'fan rattles <img src=x onerror="window.pwned=1"> & co'
        drained = cli("drain", "3", "--reason", reason)
        assert drained.returncode == 0, drained.stderr
        wait_for(
            lambda: reason in card(browser, 3).get("text", ""),
            LIVE,
            "the drain reason on GPU 3",
        )
        assert card(browser, 3)["images"] == 0
        assert browser.execute_script("return window.pwned") is None

        # A fatal XID (48, double-bit ECC error) shows in the faults and on its GPU.
        wait_for(lambda: page.watch.listening, 10, "the XID listener")
        injected = cli("sim", "inject", "xid", "--gpu", "5", "48")
        assert injected.returncode == 0, injected.stderr
        wait_for(
            lambda: (
                any(f["xid"] == 48 for f in faults(browser))
                and card(browser, 5).get("health") == "fatal"
            ),
            LIVE,
            "the fatal XID on the page",
        )
        assert any("(fatal)" in f["text"] for f in faults(browser) if f["xid"] == 48)
        assert browser.execute_script("return window.notReloaded") is True
        browser.save_screenshot(str(artifacts(tmp_path) / "web.png"))
    finally:
        job.terminate()
        job.wait(30)


def test_readable_on_a_phone(browser, page, tmp_path):
    browser.set_window_size(390, 844)
    try:
        browser.get(page.url)
        wait_for(lambda: len(cards(browser)) == 8, 10, "8 GPUs on the page")
        wide = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert wide <= 0, "the page scrolls sideways on a phone"
        lefts = browser.execute_script(
            'return Array.from(document.querySelectorAll("article.gpu"), (c) => c.offsetLeft)'
        )
        assert len(set(lefts)) == 1, "GPUs should stack in one column on a phone"
        browser.save_screenshot(str(artifacts(tmp_path) / "web-phone.png"))
    finally:
        browser.set_window_size(1280, 1300)
