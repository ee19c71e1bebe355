"""`status/queue/select --hosts` against real hosts over real ssh: three network
namespaces (tests/netns.py), each with its own address, hostname, sshd and simulated GPU
machine (the sshd's SetEnv says which), and a real user whose key and ~/.ssh/config
were made for the test. Skips with the reason where it cannot run (not root, no sshd);
CI installs openssh-server and iproute2 and runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import netns
from components import require
from schemas import validate

require(not netns.missing(), netns.missing() or "no namespaces", module=True)

SPECS = {"node1": "workstation-3x3090", "node2": "server-8xa100", "node3": "workstation-3x3090"}


@pytest.fixture(scope="module")
def lab() -> Iterator[netns.SshLab]:
    top = Path(tempfile.mkdtemp(prefix="gw-hosts-"))
    top.chmod(0o755)
    made = netns.ssh_lab(top, SPECS)
    try:
        yield made
    finally:
        made.close()
        shutil.rmtree(top, ignore_errors=True)


def test_status_shows_every_host_in_one_table_and_a_frozen_host_is_one_line(
    lab: netns.SshLab,
) -> None:
    done = lab.cli("status", "--hosts", "node1,node2,node3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["HOST", "GPU", "NAME"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1]) for r in rows if r[0] == "node1"] == [("node1", str(i)) for i in range(3)]
    assert len([r for r in rows if r[0] == "node2"]) == 8
    assert all("A100" in r[2] for r in rows if r[0] == "node2")
    assert rows[1][-1] == "dave"  # node1's GPU 1, busy in that machine's spec

    # The JSON form: each host's own document, read on that host (its own hostname).
    (lab.top / "hosts.txt").write_text("# the lab\nnode1\nnode2  # the big one\n")
    done = lab.cli("status", "--hosts", str(lab.top / "hosts.txt"), "--json")
    assert done.returncode == 0, done.stderr
    merged = validate("status-hosts", done.stdout)
    assert [h["host"] for h in merged["hosts"]] == ["node1", "node2"]
    for entry in merged["hosts"]:
        validate("status", json.dumps(entry["status"]))
        assert entry["status"]["hostname"] == entry["host"]

    # node3 stops answering (its sshd frozen: the connection is accepted, nothing comes).
    frozen = lab.hosts["node3"].procs[0].pid
    sshd = [p for p in lab.hosts["node3"].pids()]
    for pid in sshd:
        os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        done = lab.cli("status", "--hosts", "node1,node3,node2", GPUWARDEN_HOSTS_TIMEOUT="3")
        took = time.monotonic() - start
    finally:
        for pid in sshd:
            os.kill(pid, signal.SIGCONT)
    assert frozen in sshd
    assert done.returncode == 1, done.stderr
    assert took < 20, took
    out = done.stdout.splitlines()
    assert [line for line in out if "node3" in line] == ["node3: no answer within 3 s"]
    assert sum(line.startswith("node1 ") for line in out) == 3
    assert sum(line.startswith("node2 ") for line in out) == 8


def test_select_says_which_host_has_the_gpus(lab: netns.SshLab) -> None:
    done = lab.cli("select", "--hosts", "node1,node2", "-g", "2", "--min-free=60GiB")
    assert done.returncode == 0, done.stderr
    host, ids = done.stdout.split()
    assert host == "node2" and len(ids.split(",")) == 2
    assert done.stderr.startswith("node1: gpuwarden select: ") and "60" in done.stderr
    done = lab.cli("select", "--hosts", "node1,node3", "-g", "4")
    assert done.returncode == 75, done.stdout
    assert done.stderr.splitlines()[-1] == (
        "gpuwarden select: no host has GPUs that fit now (2 asked)"
    )
    bad = lab.cli("select", "--hosts", "node1", "-g", "many")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr


def test_queue_shows_each_hosts_service_jobs_and_a_host_without_one_in_one_line(
    lab: netns.SshLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """node1 runs the queue service (as an admin starts it there, on that machine's
    leases and state); node2 has none."""
    from servicetools import Server, submit
    from users import make_user

    node1 = lab.top / "node1"
    for key, where in (("LEASE_DIR", "leases"), ("STATE_DIR", "state"), ("SIM_STATE", "sim")):
        monkeypatch.setenv(f"GPUWARDEN_{key}", str(node1 / where))  # node1's, as its sshd says
    work = lab.top / "work"
    work.mkdir(mode=0o1777, exist_ok=True)
    work.chmod(0o1777)
    server = Server(node1, work, ("--grace", "1s"), SPECS["node1"])
    server.socket = str(node1 / "gpuwarden.sock")
    server.start()
    try:
        job = submit(server, make_user("hosts"), ["sleep", "120"], count=1)
        done = lab.cli("queue", "--hosts", "node1,node2")
        assert done.returncode == 1, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split()[:3] == ["HOST", "JOB", "USER"]
        assert lines[1].split()[:3] == ["node1", str(job), lab.user]
        assert len(lines) == 3 and lines[2].startswith("node2: gpuwarden queue: ")
        done = lab.cli("queue", "--hosts", "node1,node2", "--json")
        merged = validate("queue-hosts", done.stdout)
        assert [(j["host"], j["id"]) for j in merged["jobs"]] == [("node1", job)]
        assert [(h["host"], h["ok"]) for h in merged["hosts"]] == [
            ("node1", True),
            ("node2", False),
        ]
    finally:
        server.kill(signal.SIGTERM)
        server.kill_jobs()


def test_a_host_name_that_would_be_an_ssh_option_is_refused(lab: netns.SshLab) -> None:
    done = lab.cli("status", "--hosts=node1,-oProxyCommand=touch /tmp/gw-pwned")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpuwarden status: not a host name in --hosts: '-oProxyCommand=touch /tmp/gw-pwned'"
    )
