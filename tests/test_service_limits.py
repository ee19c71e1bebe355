"""The queue service's limits, its policy reload, and the hints that lead users to what
it accepts.

max_time, max_jobs_per_user and max_gpus_per_user refuse a request in one line that
names the limit, and spare admins; `service reload` (or SIGHUP) puts a changed policy in
force without a restart and keeps the old one over a broken file; `reserve`, `select`
and the commands under a stopped service point a user to the way that works.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from repo import SRC
from servicetools import Server, cli_as, cli_with_gpus, serving
from users import make_user


@pytest.fixture
def limited(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """A service whose users may keep two jobs, use two GPUs at once and must declare
    --time of 90 s at most."""
    yield from serving(
        tmp_path,
        open_dir,
        monkeypatch,
        *("--max-jobs-per-user", "2", "--max-time", "90s", "--max-gpus-per-user", "2"),
    )


def test_per_user_limits_refuse_in_one_line_and_spare_admins(limited: Server) -> None:
    """max_time: --time required and bounded (read as Slurm reads it: `--time 2` is two
    minutes); max_jobs_per_user: queued and running jobs counted; a request wider than
    max_gpus_per_user, which could only wait for ever, refused; admins exempt."""
    alice, carol = make_user("alice", ("lab",)), make_user("carol")
    untimed = cli_as(limited, alice, "submit", "--", "sleep", "30")
    assert untimed.returncode == 2, untimed.stderr
    assert untimed.stderr == (
        "gpuwarden submit: this machine needs --time on every job, at most 1m30s (max_time)\n"
    )
    long = cli_as(limited, alice, "submit", "--time", "2", "--", "sleep", "30")
    assert long.returncode == 2 and long.stderr == (
        "gpuwarden submit: --time 2m00s is over this machine's limit of 1m30s (max_time)\n"
    ), long.stderr
    wide = cli_as(limited, alice, "submit", "-g", "3", "--time", "1", "--", "true")
    assert wide.returncode == 2 and wide.stderr == (
        "gpuwarden submit: 3 GPUs is more than the 2 a user may use at once on this machine "
        "(max_gpus_per_user)\n"
    ), wide.stderr
    kept = [cli_as(limited, alice, "submit", "--time", "1", "--", "sleep", "30") for _ in "ab"]
    assert [k.returncode for k in kept] == [0, 0], [k.stderr for k in kept]
    third = cli_as(limited, alice, "submit", "--time", "90s", "--", "true")
    assert third.returncode == 2 and "you have 2 jobs queued or running" in third.stderr
    admin = [cli_as(limited, carol, "submit", "-g", "3", "--", "sleep", "30") for _ in "abc"]
    assert [a.returncode for a in admin] == [0, 0, 0], [a.stderr for a in admin]  # exempt
    kept += admin
    for k in kept:
        limited.call(None, "cancel", jobs=[int(k.stdout)])


def test_a_reload_puts_a_raised_limit_in_force_without_a_restart(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: raising max_gpus_per_user and reloading accepts a job refused before;
    a broken file is refused in one line naming the key and the old policy stays;
    SIGHUP reloads too, and [service.limits] gives a group its own limit, which a
    refusal names."""
    conf = open_dir / "config.toml"
    conf.write_text("[service]\nmax_gpus_per_user = 1\n")
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    srv = next(serving(tmp_path, open_dir, monkeypatch))
    try:
        alice = make_user("alice", ("lab",))
        wide = ("submit", "-g", "2", "--", "sleep", "60")
        refused = cli_as(srv, alice, *wide)
        assert refused.returncode == 2 and refused.stderr.endswith("(max_gpus_per_user)\n")
        conf.write_text("[service]\nmax_gpus_per_user = 2\n")
        reload = cli_as(srv, alice, "service", "reload")
        assert (reload.returncode, reload.stderr) == (
            2,
            "gpuwarden service: only an admin may reload the service's policy\n",
        )
        env = {"GPUWARDEN_SOCKET": srv.socket, "GPUWARDEN_SYSTEM_CONFIG": str(conf)}
        reload = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "service", "reload"],
            env={**os.environ, "PYTHONPATH": str(SRC), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert reload.returncode == 0, reload.stderr
        assert reload.stdout == "max_gpus_per_user: 1 -> 2\nreloaded: 1 change(s)\n"
        accepted = cli_as(srv, alice, *wide)
        assert accepted.returncode == 0, accepted.stderr
        srv.wait_state(int(accepted.stdout), ("RUNNING",))
        assert "reload: max_gpus_per_user: 1 -> 2" in srv.log.read_text()

        conf.write_text('[service]\nmax_gpus_per_user = "lots"\n')
        broken = srv.call(None, "reload")
        assert "service.max_gpus_per_user must be" in broken["error"]
        assert broken["error"].endswith("; the policy in force stays")
        assert "\n" not in broken["error"]
        # (asked over the socket: alice's own client would refuse the broken file itself)
        still = srv.call(alice, "submit", argv=["true"], cwd=str(srv.work), request={"count": 3})
        assert "more than the 2 a user" in still["error"], still

        conf.write_text(
            '[service]\nmax_gpus_per_user = 2\n[service.limits]\n"@gw-lab" = { max_gpus = 3 }\n'
        )
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_log("reload: limits")
        four = cli_as(srv, alice, "submit", "-g", "4", "--", "true")
        assert four.returncode == 2, four.stderr
        assert four.stderr.endswith("(service.limits @gw-lab max_gpus)\n"), four.stderr
        shown = cli_as(srv, alice, "limits")
        assert shown.returncode == 0, shown.stderr
        assert "service.limits @gw-lab max_gpus" in shown.stdout
        as_json = json.loads(cli_as(srv, alice, "limits", "--json").stdout)
        jsonschema = pytest.importorskip("jsonschema")
        schema = Path(SRC, "gpuwarden", "schemas", "limits.json").read_text()
        jsonschema.validate(as_json, json.loads(schema))
        rows = {r["limit"]: (r["value"], r["used"], r["rule"]) for r in as_json["limits"]}
        assert rows["max_gpus"] == (3, 2, "service.limits @gw-lab max_gpus"), rows

        conf.chmod(0o666)  # anyone could now lift every limit: refused as a whole
        untrusted = srv.call(None, "reload")
        assert "is not trusted" in untrusted["error"] and str(conf) in untrusted["error"]
        assert untrusted["error"].endswith("; the policy in force stays"), untrusted
        four = cli_as(srv, alice, "submit", "-g", "4", "--", "true")
        assert four.stderr.endswith("(service.limits @gw-lab max_gpus)\n"), four.stderr
        srv.call(None, "cancel", jobs=[int(accepted.stdout)])
    finally:
        if srv.proc and srv.proc.poll() is None:
            srv.kill(signal.SIGTERM)
        srv.kill_jobs()


def test_reserve_and_select_point_to_what_the_service_accepts(limited: Server) -> None:
    """`reserve` names its own option for the time this machine requires, and `select`
    points to the way through the queue service."""
    alice = make_user("alice", ("lab",))
    refused = cli_as(limited, alice, "reserve", "-g", "1")
    assert refused.returncode == 2, refused.stderr
    assert "needs `gpuwarden reserve --for` on every job, at most 1m30s" in refused.stderr
    chosen = cli_with_gpus(limited, alice, "select", "-g", "1")
    assert chosen.returncode == 0, chosen.stderr
    assert "`gpuwarden reserve`" not in chosen.stderr
    assert "through the queue service" in chosen.stderr


def test_commands_under_a_stopped_service_say_to_ask_an_admin(server: Server) -> None:
    """Issue 23: with the service stopped its lease directory is root's; `run` and
    `reserve` said `Permission denied` on alloc.lock. Now one line: ask an admin."""
    alice = make_user("alice", ("lab",))
    gone = str(server.work.parent / "stopped.sock")
    for args in (("run", "--", "true"), ("reserve", "-g", "1")):
        done = cli_with_gpus(server, alice, *args, socket=gone)
        assert done.returncode != 0
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "which is not running: ask an admin to start it" in lines[0]
    state = server.work.parent / "state"  # as service install leaves it: root's, 0755
    state.mkdir(mode=0o755)
    drain = cli_with_gpus(
        server, alice, "drain", "0", "--reason", "x", GPUWARDEN_STATE_DIR=str(state)
    )
    assert drain.returncode == 2 and drain.stderr == (
        "gpuwarden drain: only an admin may drain or undrain GPUs on this machine (its state "
        f"directory {state} is root's): ask one, e.g. `sudo gpuwarden drain ...`\n"
    )
