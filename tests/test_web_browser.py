"""The page in a real browser (Debian's chromium + chromedriver through selenium) on the
simulated 8×A100 server: GPUs as `status --json` sees them, a job, a drain and a fatal
XID shown live, without a reload. Saves screenshots to $GPUWARDEN_ARTIFACTS (or the
test's temporary directory)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import waiting
from components import require
from gpuwarden.health.watch import HealthWatch, WatchSettings
from gpuwarden.web.server import Feed, WebServer, serve
from repo import SRC
from schemas import WEB_STATE

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
    waiting.wait_for(check, within, what)
    return time.monotonic() - started


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


@pytest.fixture
def mig_page(sim: Callable[[str], str]) -> Iterator[WebServer]:
    """The page of `mixed`, whose A100 is split into four MIG slices (docs/mig.md)."""
    sim("mixed")
    server = serve("127.0.0.1:0", feed=Feed(interval=1.0))
    yield server
    server.close()


READ_SLICES = """
return Array.from(document.querySelectorAll("article.gpu .slice")).map((s) => ({
  uuid: s.dataset.uuid,
  text: s.innerText,
  jobs: Array.from(s.querySelectorAll("li.lease")).map((l) => l.dataset.job),
}));
"""


def test_a_job_on_a_mig_slice_shows_on_its_slice(browser, mig_page, tmp_path):
    browser.get(mig_page.url)
    wait_for(lambda: len(browser.execute_script(READ_SLICES)) == 4, 10, "4 MIG slices")
    first = {s["uuid"]: s["text"] for s in browser.execute_script(READ_SLICES)}
    assert "MIG 3:2 · 1g.10gb" in first["MIG-d6d4d643-7305-56b5-867f-b49eb70c8469"]
    assert "heidi" in first["MIG-d6d4d643-7305-56b5-867f-b49eb70c8469"]  # her notebook
    job = subprocess.Popen(
        gpuwarden("run", "--mig", "2g.20gb", "--", "sleep", "120"),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        from gpuwarden.leases import list_leases

        wait_for(lambda: list_leases(), 30, "the job's lease")
        [lease] = list_leases()

        def on_its_slice() -> bool:
            slices = browser.execute_script(READ_SLICES)
            return [s["uuid"] for s in slices if lease.job in s["jobs"]] == [lease.uuid]

        assert wait_for(on_its_slice, LIVE, "the job on its MIG slice") <= LIVE
        assert lease.uuid == "MIG-44d5e7c7-29e5-5224-b9a1-2b9b2e5ed9e6"  # the 2g.20gb
        browser.save_screenshot(str(artifacts(tmp_path) / "web-mig.png"))
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


# --- the queue service on the page ------------------------------------------------------

READ_QUEUE = """
const rows = (id) => Array.from(document.querySelectorAll(`#${id} tr[data-job]`)).map((r) => ({
  id: Number(r.dataset.job), reason: r.dataset.reason || null, text: r.innerText }));
return { running: rows("queue-running"), waiting: rows("queue-waiting"),
  state: document.getElementById("queue-state").innerText,
  machine: document.getElementById("machine").innerText,
  users: Array.from(document.querySelectorAll("#users tr[data-user]"), (r) => r.innerText) };
"""


@pytest.fixture
def queue_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[WebServer, Any]]:
    """A real queue service (`gpuwarden serve`, as tests/servicetools.py starts it) on four
    idle A100s, and the page of the same machine asking it."""
    import tempfile

    from gpuwarden.service.store import Store
    from servicetools import SPEC, Server
    from users import make_user

    make_user("alice")
    make_user("bob")
    monkeypatch.setenv("GPUWARDEN_SIM", SPEC)
    monkeypatch.setenv("GPUWARDEN_LEASE_DIR", str(tmp_path / "service-leases"))
    shared = Path(tempfile.mkdtemp(prefix="gw-web-service-"))
    shared.chmod(0o755)
    (shared / "work").mkdir()
    (shared / "work").chmod(0o1777)
    (shared / "sock").mkdir()
    srv = Server(tmp_path, shared / "work", ())
    journal = Store(os.path.join(srv.state, "jobs.db"))  # some past use, for fair share
    journal.charge("gw-alice", 10 * 3600.0, time.time(), 7 * 86400.0)
    journal.charge("gw-bob", 3600.0, time.time(), 7 * 86400.0)
    journal.close()
    srv.start()
    feed = Feed(interval=1.0, service=srv.socket)  # the default interval, as users get it
    server = serve("127.0.0.1:0", feed=feed)
    try:
        yield server, srv
    finally:
        server.close()
        if srv.proc and srv.proc.poll() is None:
            srv.kill(signal.SIGTERM)
        srv.kill_jobs()
        shutil.rmtree(shared, ignore_errors=True)


def test_the_queue_service_on_the_page(browser, queue_page, tmp_path):
    from servicetools import submit
    from users import make_user

    page, srv = queue_page
    alice, bob = make_user("alice"), make_user("bob")
    browser.set_window_size(1280, 1300)
    browser.get(page.url)
    wait_for(lambda: len(cards(browser)) == 4, 10, "4 GPUs on the page")
    browser.execute_script("window.notReloaded = true")
    wait_for(
        lambda: "queue service running" in browser.execute_script(READ_QUEUE)["machine"],
        LIVE,
        "the service's state in the machine line",
    )

    running = submit(srv, alice, ["sleep", "120"], request={"count": 4})
    srv.wait_state(running, ("RUNNING",))
    waiting = submit(srv, bob, ["sleep", "120"], request={"count": 1})
    row = srv.wait_state(waiting, ("PENDING",))
    assert row["reason"] == "Resources", row
    took = wait_for(
        lambda: (
            running in [r["id"] for r in browser.execute_script(READ_QUEUE)["running"]]
            and waiting in [r["id"] for r in browser.execute_script(READ_QUEUE)["waiting"]]
        ),
        LIVE,
        "the running and the waiting job on the page",
    )
    assert took <= LIVE
    shown = browser.execute_script(READ_QUEUE)
    [run_row] = [r for r in shown["running"] if r["id"] == running]
    [wait_row] = [r for r in shown["waiting"] if r["id"] == waiting]
    assert "gw-alice" in run_row["text"] and "0, 1, 2, 3" in run_row["text"]
    assert wait_row["reason"] == "Resources" and "gw-bob" in wait_row["text"]
    assert "Resources" in wait_row["text"]
    assert any(u.startswith("■ gw-alice") or "gw-alice" in u for u in shown["users"])
    assert "sleep" not in run_row["text"]  # commands hidden unless configured

    # The JSON API says the same, in its schema. A job that cannot start before another
    # ends gets its reason at submit and its priority with the next, coalesced, pass
    # (service.pacing): the page shows it once that pass has run.
    import http.client

    def state() -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", page.port, timeout=10)
        conn.request("GET", "/api/v1/state")
        doc = json.loads(conn.getresponse().read())
        conn.close()
        return doc

    def priced() -> Any:
        doc = state()
        waits = [j for j in doc["queue"]["waiting"] if j["id"] == waiting]
        return doc if waits and waits[0]["priority"] is not None else None

    wait_for(priced, 2 * LIVE, "the waiting job's priority in the API")
    doc = state()
    jsonschema.validate(doc, WEB_STATE)
    queue = doc["queue"]
    assert queue["service"] is True and queue["state"] == "running"
    [api_run] = [j for j in queue["running"] if j["id"] == running]
    [api_wait] = [j for j in queue["waiting"] if j["id"] == waiting]
    assert api_run["user"] == "gw-alice" and api_run["gpus"] == [0, 1, 2, 3]
    assert api_run["uuids"] == [g["uuid"] for g in doc["gpus"]]
    assert api_run["elapsed"] is not None and api_run["command"] is None
    # The service holds the job's leases; the page names the job's owner on the GPUs.
    held = [(x["job"], x["user"]) for g in doc["gpus"] for x in g["leases"]]
    assert held == [(str(running), "gw-alice")] * 4, held
    assert (api_wait["user"], api_wait["reason"]) == ("gw-bob", "Resources")
    assert api_wait["priority"] is not None and api_wait["waited"] >= 0
    users = {u["user"]: u for u in doc["users"]}
    assert users["gw-alice"]["jobs_running"] == 1 and users["gw-bob"]["jobs_waiting"] == 1
    alice_share, bob_share = users["gw-alice"], users["gw-bob"]
    assert alice_share["usage"] == pytest.approx(10 * 3600.0, rel=0.01)
    assert bob_share["share"] == alice_share["share"] == 1.0
    assert 0 < alice_share["factor"] < bob_share["factor"] <= 1

    browser.save_screenshot(str(artifacts(tmp_path) / "web-queue.png"))

    # The service going away shows as such, without a reload.
    srv.call(None, "cancel", jobs=[running, waiting])
    srv.kill(signal.SIGTERM)
    wait_for(
        lambda: "no queue service" in browser.execute_script(READ_QUEUE)["state"],
        LIVE + 2,
        "the placeholder once the service stopped",
    )
    assert browser.execute_script("return window.notReloaded") is True


READ_PEERS = """
const panel = document.getElementById("peers-panel");
return {hidden: panel.hidden, rows: Array.from(panel.querySelectorAll("tbody tr")).map((r) => ({
  gpu: r.dataset.gpu === undefined ? null : Number(r.dataset.gpu), text: r.innerText }))};
"""


def test_other_hosts_show_on_the_page(browser, sim, peer, tmp_path):
    """`web --peers`: another host's GPUs (its own page's API) and a silent host's row."""
    from gpuwarden.web.peers import check_url
    from ports import free_port

    sim("server-8xa100")
    peers = [check_url(peer), check_url(f"http://127.0.0.1:{free_port()}/")]
    server = serve("127.0.0.1:0", feed=Feed(interval=1.0, peers=peers))
    try:
        browser.get(server.url)
        wait_for(lambda: len(cards(browser)) == 8, 10, "8 GPUs on the page")

        def shown() -> Any:
            got = browser.execute_script(READ_PEERS)
            ready = [r for r in got["rows"] if r["gpu"] is not None]
            return got if len(ready) == 3 and "not answering" in got["rows"][-1]["text"] else None

        wait_for(shown, 10, "the other hosts' rows")
        got = shown()
        assert got["hidden"] is False
        assert "dave" in got["rows"][1]["text"] and "99%" in got["rows"][1]["text"]
        assert got["rows"][-1]["text"].startswith(peers[1])
        browser.save_screenshot(str(artifacts(tmp_path) / "web-peers.png"))
    finally:
        server.close()
