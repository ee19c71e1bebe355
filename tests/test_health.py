"""Health judgement (pure), the XID log, and the watch's drain/hook actions."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.health import judgement, xidlog, xids
from gpuwarden.health.judgement import FATAL, OK, WARNING, Rules, judge, level
from gpuwarden.health.watch import (
    HealthWatch,
    WatchSettings,
    parse_hook,
    parse_webhook,
    settings_from_config,
)
from gpuwarden.machine.inventory import Gpu
from gpuwarden.monitoring.alerts import Notifier
from machines import snapshot
from waiting import wait_for


def gpu(**kw) -> Gpu:
    base = dict(index=0, uuid="GPU-aaaa-0000", name="NVIDIA A100-SXM4-40GB")
    base.update(kw)
    return Gpu(**base)


def test_healthy_gpu_has_no_findings():
    assert judge(gpu(ecc_uncorrected_volatile=0, ecc_corrected_volatile=3)) == ()
    assert level(()) == OK


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"lost": True}, "lost"),
        ({"ecc_uncorrected_volatile": 2}, "ecc-uncorrected"),
        ({"remapped_rows_failure": True}, "remap-failure"),
        ({"retired_pages_pending": True}, "retire-pending"),
    ],
)
def test_fatal_conditions(fields, code):
    found = judge(gpu(**fields))
    assert [f.code for f in found] == [code]
    assert level(found) == FATAL
    assert found[0].action


@pytest.mark.parametrize("xid", sorted(judgement.DEFAULT_FATAL_XIDS))
def test_default_fatal_xids_are_fatal_with_catalogue_action(xid):
    (finding,) = judge(gpu(), (xid,))
    assert finding.level == FATAL
    assert finding.code == f"xid-{xid}"
    assert xid in xids.XID_CATALOGUE  # every default fatal XID is described
    assert finding.action and "XID" in finding.reason


def test_issue_list_is_in_default_fatal_xids():
    assert {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120} <= judgement.DEFAULT_FATAL_XIDS


def test_xid_79_says_reboot_and_application_xids_warn():
    (f79,) = judge(gpu(), (79,))
    assert "fallen off the bus" in f79.reason and "reboot" in f79.action
    (f13,) = judge(gpu(), (13, 13))
    assert f13.level == WARNING and "x2" in f13.reason and "restart the application" in f13.action
    (unknown,) = judge(gpu(), (999,))
    assert unknown.level == WARNING and "catalogue" in unknown.action


def test_fatal_list_is_configurable():
    rules = Rules(fatal_xids=judgement.parse_xids("+13 -79"))
    assert judge(gpu(), (13,), rules=rules)[0].level == FATAL
    assert judge(gpu(), (79,), rules=rules)[0].level == WARNING
    assert judgement.parse_xids([31, 43]) == frozenset({31, 43})
    assert judgement.parse_xids(None) == judgement.DEFAULT_FATAL_XIDS
    with pytest.raises(UserError, match="not an XID number"):
        judgement.parse_xids("48, seventy-nine")


def test_a_bad_rule_setting_costs_a_server_one_line_not_its_health_rules():
    said: list[str] = []
    rules = judgement.rules_in_force({"health.pcie_replay_warn": "many"}, said.append)
    assert rules == Rules()
    assert said == [
        "health.pcie_replay_warn: expected a number, got 'many'; using the built-in health rules"
    ]
    assert judgement.rules_in_force({"health.pcie_replay_warn": "many"}) == Rules()  # silent


def test_pending_row_remap_is_a_warning_not_a_drain():
    # NVIDIA: new work can still be launched; the remap applies at the next reset
    (finding,) = judge(gpu(remapped_rows_pending=True))
    assert finding.level == WARNING and "reset" in finding.action


def test_warnings_throttle_ecc_rate_and_pcie():
    found = judge(gpu(throttle_reasons=("hw_thermal", "sw_power_cap", "gpu_idle")))
    assert [f.code for f in found] == ["throttle-hw_thermal"]  # a power cap is normal
    assert judge(gpu(ecc_corrected_volatile=5000))[0].code == "ecc-corrected"
    assert judge(gpu(ecc_corrected_volatile=5), ecc_corrected_rate=500.0)[0].level == WARNING
    assert judge(gpu(ecc_corrected_volatile=5), ecc_corrected_rate=1.0) == ()
    assert judge(gpu(pcie_replay_count=250))[0].code == "pcie-replay"
    assert judge(gpu(pcie_replay_count=3)) == ()


def test_fatal_findings_come_first():
    found = judge(gpu(throttle_reasons=("hw_slowdown",), ecc_uncorrected_volatile=1))
    assert [f.level for f in found] == [FATAL, WARNING]
    assert level(found) == FATAL


def test_xid_log_round_trip_and_clear():
    xidlog.record_xid("GPU-a", 79, index=0)
    xidlog.record_xid("GPU-b", 13, index=1)
    xidlog.record_xid("GPU-a", 48, index=0)
    assert xidlog.xids_seen() == {"GPU-a": (79, 48), "GPU-b": (13,)}
    xidlog.clear_xids(["GPU-a"])
    xidlog.record_xid("GPU-a", 94)
    assert xidlog.xids_seen() == {"GPU-b": (13,), "GPU-a": (94,)}
    xidlog.clear_xids()
    assert xidlog.xids_seen() == {}


def test_xid_log_ignores_events_before_boot_and_garbage():
    path = Path(xidlog.log_location())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"uuid":"GPU-a","xid":79,"at":1.0}\nnot json\n{"oops": 1}\n')
    assert xidlog.xids_seen() == {}


def test_hook_and_webhook_settings_are_checked():
    assert parse_hook("notify-admin --gpu 'a b'") == ("notify-admin", "--gpu", "a b")
    assert parse_hook(["/bin/true"]) == ("/bin/true",)
    assert parse_hook("") is None
    with pytest.raises(UserError, match=r"health\.hook"):
        parse_hook("notify 'unbalanced")
    with pytest.raises(UserError, match=r"health\.hook"):
        parse_hook(42)
    with pytest.raises(UserError, match=r"health\.webhook"):
        parse_webhook("ftp://example")
    assert parse_webhook("http://127.0.0.1:1/x") == "http://127.0.0.1:1/x"


def test_malformed_hook_in_config_file_is_one_clear_line(isolated):
    cfg = isolated / "xdg-config" / "gpuwarden" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('[health]\nhook = "notify \'unbalanced"\n')
    with pytest.raises(UserError, match=r"health\.hook: cannot split"):
        settings_from_config()
    cfg.write_text('[health]\nwebhook = "not a url"\n')
    with pytest.raises(UserError, match=r"health\.webhook"):
        settings_from_config()


class _SlowHandler(BaseHTTPRequestHandler):
    bodies: ClassVar[list] = []
    delay = 0.0

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay)
        type(self).bodies.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook_server():
    class Handler(_SlowHandler):
        bodies: ClassVar[list] = []
        delay = 0.0

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, Handler
    server.shutdown()
    server.server_close()


def test_webhook_timeout_never_blocks_and_says_so(webhook_server):
    server, handler = webhook_server
    handler.delay = 2.0
    lines: list[str] = []
    notifier = Notifier(
        webhook=f"http://127.0.0.1:{server.server_address[1]}/hook",
        webhook_timeout=0.3,
        log=lines.append,
    )
    started = time.monotonic()
    for _ in range(3):
        notifier.notify({"gpu_index": 0, "level": "fatal"})
    assert time.monotonic() - started < 0.1  # the caller never waits for the webhook
    # The line, not `notifier.failed`: the count goes up a moment before the line is logged.
    wait_for(
        lambda: any("timed out after 0.3s" in line for line in lines),
        5,
        lambda: f"the webhook's timeout in the log: {lines}",
    )
    notifier.close(0.1)


def test_watch_drains_on_fatal_and_calls_hook_once(tmp_path):
    out = tmp_path / "hook.jsonl"
    hook = (
        sys.executable,
        "-c",
        f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read()+'\\n')",
    )
    watch = HealthWatch(WatchSettings(policy="drain", hook=hook), log=lambda m: None)
    healthy = gpu(index=1, uuid="GPU-bbbb-1111")
    assert watch.check(snapshot(gpu(), healthy)) == []
    xidlog.record_xid("GPU-aaaa-0000", 79, index=0)
    new = watch.check(snapshot(gpu(), healthy))
    assert [(g.index, f.code) for g, f in new] == [(0, "xid-79")]
    from gpuwarden.health.drain import list_drains

    drains = list_drains()
    assert set(drains) == {"GPU-aaaa-0000"}
    assert "XID 79" in drains["GPU-aaaa-0000"].reason and drains["GPU-aaaa-0000"].auto
    assert watch.check(snapshot(gpu(), healthy)) == []  # not news twice
    watch.notifier.close(10)
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(events) == 1
    assert events[0]["gpu_uuid"] == "GPU-aaaa-0000" and events[0]["drained"] is True


def test_alert_policy_does_not_drain():
    seen = []
    watch = HealthWatch(
        WatchSettings(policy="alert"), log=lambda m: None, on_finding=lambda g, f, e: seen.append(e)
    )
    watch.check(snapshot(gpu(ecc_uncorrected_volatile=1)))
    from gpuwarden.health.drain import list_drains

    assert list_drains() == {}
    assert seen[0]["level"] == "fatal" and seen[0]["drained"] is False


def test_repeat_xid_is_news_again_and_cleared_finding_can_refire():
    seen = []
    watch = HealthWatch(
        WatchSettings(policy="alert"), log=lambda m: None, on_finding=lambda g, f, e: seen.append(f)
    )
    watch.on_xid("GPU-aaaa-0000", 13, 0)
    watch.check(snapshot(gpu()))
    watch.on_xid("GPU-aaaa-0000", 13, 0)
    watch.check(snapshot(gpu()))
    assert [f.code for f in seen] == ["xid-13", "xid-13"]
    watch.check(snapshot(gpu(throttle_reasons=("hw_thermal",))))
    watch.check(snapshot(gpu()))
    watch.check(snapshot(gpu(throttle_reasons=("hw_thermal",))))
    assert [f.code for f in seen].count("throttle-hw_thermal") == 2
