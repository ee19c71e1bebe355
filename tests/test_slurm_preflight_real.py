"""`gpuwarden slurm cluster HOST... --check` over real ssh, before anything is written:
three hosts as network namespaces (tests/netns.py), each with its own sshd and munged
and a mount namespace of its own. node1 and node2 agree; node3 has what a lab's move
meets first: a user whose uid differs (its own /etc/passwd), a munge key of its own
(a credential made here does not decode there), and the data directory missing (an
empty file system where the others have it). The check runs as a real user, who
cannot read munge's key: the credential tells the keys apart.
"""

from __future__ import annotations

import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import netns
from components import require
from repo import ROOT
from slurmtools import missing

require(not netns.missing(), netns.missing() or "no namespaces", module=True)
require(not missing(), missing() or "Slurm missing (munge)", module=True)

SPEC = "workstation-3x3090"


def _munged(top: Path, key: str = "/etc/munge/munge.key") -> str:
    """Shell commands: this host's own munged (its socket on a private /run/munge)."""
    run = "/run/munge"
    return (
        f"mkdir -p {run} && mount -t tmpfs -o mode=755 tmpfs {run} && chown munge:munge {run}"
        f" && su -s /bin/sh munge -c '/usr/sbin/munged --key-file={key} "
        f"--pid-file={run}/munged.pid --log-file={run}/munged.log --seed-file={run}/seed'"
    )


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[netns.SshLab, Path, str]]:
    from users import make_user

    subprocess.run([str(ROOT / "scripts" / "slurm-ci"), "munge"], check=True, capture_output=True)
    make_user("hosts")  # the ssh user, before node3's /etc/passwd is copied
    person = make_user("preflight")
    top = Path(tempfile.mkdtemp(prefix="gw-preflight-"))
    top.chmod(0o755)
    (top / "shared" / "data").mkdir(parents=True)
    (top / "shared").chmod(0o755)
    # node3: the user's uid differs, as where each machine's useradd chose its own
    theirs = pwd.getpwnam(person.name).pw_uid
    taken = {e.pw_uid for e in pwd.getpwall()}
    odd = next(u for u in range(59000, 60000) if u not in taken)
    passwd = [
        line.replace(f":{theirs}:", f":{odd}:", 1) if line.startswith(f"{person.name}:") else line
        for line in Path("/etc/passwd").read_text().splitlines(keepends=True)
    ]
    (top / "passwd").write_text("".join(passwd))
    (top / "passwd").chmod(0o644)
    # node3: a munge key of its own (each machine's munge package made one at install)
    key = top / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    preludes = {
        "node1": _munged(top),
        "node2": _munged(top),
        "node3": (
            f"mount --bind {top / 'passwd'} /etc/passwd && "
            f"mount -t tmpfs -o mode=755 tmpfs {top / 'shared'} && {_munged(top, str(key))}"
        ),
    }
    made = netns.ssh_lab(top, {name: SPEC for name in preludes}, preludes)
    try:
        yield made, top, person.name
    finally:
        made.close()
        shutil.rmtree(top, ignore_errors=True)


def _check(lab: netns.SshLab, top: Path, *hosts: str) -> Any:
    return lab.cli(
        *("slurm", "cluster", *hosts, "--check", "--path", str(top / "shared" / "data")),
        *("--conf-dir", str(top / "conf")),
    )


def test_a_consistent_pair_passes(lab: tuple[netns.SshLab, Path, str]) -> None:
    ssh, top, _ = lab
    done = _check(ssh, top, "node1", "node2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("2 hosts agree: users, munge key, 1 path(s), clocks")
    assert not (top / "conf").exists()  # nothing written


def test_a_uid_a_munge_key_and_a_data_path_that_differ_are_one_line_each(
    lab: tuple[netns.SshLab, Path, str],
) -> None:
    ssh, top, user = lab
    done = _check(ssh, top, "node1", "node3")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    uid = [x for x in lines if f"user {user} " in x]
    munge = [x for x in lines if "munge" in x]
    data = [x for x in lines if str(top / "shared" / "data") in x]
    assert len(uid) == 1 and uid[0].startswith(f"node3: user {user} has uid "), lines
    assert "usermod -u" in uid[0]
    assert munge == [
        "node3: cannot decode a munge credential made here (unmunge: Error: Invalid "
        "credential): its munge key differs; copy one /etc/munge/munge.key to every host "
        "(owner munge, mode 400) and restart munge (README: the munge key)"
    ], lines
    assert data == [
        f"node3: {top / 'shared' / 'data'} is missing: mount or make it there at the same path "
        "(a job opens the paths it was submitted with, on whichever node it runs)"
    ]
    # Anything else can only be about other accounts made on this machine while the test
    # ran (node3's /etc/passwd is a copy from the start).
    others = set(lines) - set(uid + munge + data)
    assert all("user gw-" in x or x.startswith("uid ") for x in others), others
    assert done.stderr.strip().endswith("fix them before starting Slurm")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_host_that_cannot_answer_is_one_line(lab: tuple[netns.SshLab, Path, str]) -> None:
    ssh, top, _ = lab
    nobody = ssh.hosts["node2"].peer  # no sshd listens there
    done = _check(ssh, top, "node1", nobody)
    assert done.returncode == 1
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"{nobody}: not checked: ssh: ")
