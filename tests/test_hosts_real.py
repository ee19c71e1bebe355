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
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import netns
from conftest import require
from test_json_schemas import validate

require(not netns.missing(), netns.missing() or "no namespaces", module=True)

SPECS = {"node1": "workstation-3x3090", "node2": "server-8xa100", "node3": "workstation-3x3090"}
KEY = "gw_hosts_test"


class Lab:
    def __init__(self, lab: netns.Lab, user: str, top: Path, python: list[str], path: str) -> None:
        self.lab, self.user, self.top = lab, user, top
        self.hosts = {h.name: h for h in lab.hosts}
        self.python, self.path = python, path

    def cli(self, *argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        """`gpuwarden ARGV` as the test user, from this namespace."""
        full = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": self.path,
            "GPUWARDEN_SYSTEM_CONFIG": str(self.top / "none.toml"),
            "GPUWARDEN_HOSTS_COMMAND": f"{' '.join(self.python)} -m gpuwarden",
            **env,
        }
        words = [f"{k}={v}" for k, v in full.items()]
        command = ["runuser", "-u", self.user, "--", "env", "-i", *words, *self.python]
        return subprocess.run(
            [*command, "-m", "gpuwarden", *argv], capture_output=True, text=True, timeout=timeout
        )


def _sshd_config(top: Path, host: netns.Host, path: str) -> Path:
    state = top / host.name
    state.mkdir(mode=0o755)
    env = {
        "GPUWARDEN_SIM": SPECS[host.name],
        "GPUWARDEN_SIM_STATE": state / "sim",
        "GPUWARDEN_LEASE_DIR": state / "leases",
        "GPUWARDEN_STATE_DIR": state / "state",
        "GPUWARDEN_SYSTEM_CONFIG": top / "none.toml",
        "GPUWARDEN_SOCKET": state / "no-service.sock",
        "PYTHONPATH": path,
    }
    conf = top / f"sshd-{host.name}.conf"
    conf.write_text(
        f"ListenAddress {host.address}\nHostKey {top / 'host_key'}\nPidFile none\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PermitRootLogin no\n"
        # The host's own machine: what a site's sshd or shell profile would set.
        "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()) + "\n"
    )
    return conf


def _user_ssh(home: Path, uid: int, gid: int, top: Path, lab: netns.Lab) -> None:
    """The user's key (authorized on every host: one home here), known hosts and config."""
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    key = ssh / KEY
    for old in (key, key.with_suffix(".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (ssh / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
    hostkey = " ".join((top / "host_key.pub").read_text().split()[:2])
    addresses = ",".join(h.address for h in lab.hosts)
    (ssh / "known_hosts_gw").write_text(f"{addresses} {hostkey}\n")
    (ssh / "config").write_text(
        "".join(
            f"Host {h.name}\n  HostName {h.address}\n  IdentityFile {key}\n"
            f"  UserKnownHostsFile {ssh / 'known_hosts_gw'}\n  StrictHostKeyChecking yes\n"
            for h in lab.hosts
        )
    )
    for path in (ssh, *ssh.iterdir()):
        os.chown(path, uid, gid)
        path.chmod(0o700 if path.is_dir() else 0o600)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    from test_hostile_corpus import python_for
    from users import make_user

    person = make_user("hosts")
    # useradd locks a new account ("!" for a password), and sshd refuses a locked account
    # even a key: "*" is no password at all, not a lock.
    subprocess.run(["usermod", "-p", "*", person.name], check=True)
    python, path = python_for(person.name)
    top = Path(tempfile.mkdtemp(prefix="gw-hosts-"))
    top.chmod(0o755)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(top / "host_key")], check=True
    )
    made = netns.Lab(list(SPECS))
    try:
        _user_ssh(Path(person.home), person.uid, person.gid, top, made)
        for host in made.hosts:
            conf = _sshd_config(top, host, path)
            host.start([netns.SSHD, "-D", "-e", "-f", str(conf)], top / f"{host.name}.log")
        for host in made.hosts:
            netns.wait_port(host, 22)
        yield Lab(made, person.name, top, python, path)
    finally:
        made.close()
        shutil.rmtree(Path(person.home) / ".ssh", ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def test_status_shows_every_host_in_one_table_and_a_frozen_host_is_one_line(lab: Lab) -> None:
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


def test_select_says_which_host_has_the_gpus(lab: Lab) -> None:
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


def test_queue_reports_each_host_without_a_queue_service_in_one_line(lab: Lab) -> None:
    done = lab.cli("queue", "--hosts", "node1,node2", "--json")
    assert done.returncode == 1
    merged = validate("queue-hosts", done.stdout)
    assert merged["jobs"] == []
    assert [(h["host"], h["ok"]) for h in merged["hosts"]] == [("node1", False), ("node2", False)]
    assert all("service" in h["error"] for h in merged["hosts"]), merged


def test_a_host_name_that_would_be_an_ssh_option_is_refused(lab: Lab) -> None:
    done = lab.cli("status", "--hosts=node1,-oProxyCommand=touch /tmp/gw-pwned")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpuwarden status: not a host name in --hosts: '-oProxyCommand=touch /tmp/gw-pwned'"
    )
