"""`slurm cluster --check`'s judgement (gpuwarden.slurm.preflight), pure: each problem
of a lab's machines is one line naming the host and the fix, and agreeing hosts give
none. tests/test_slurm_preflight_real.py gathers real hosts' facts over ssh.
"""

from __future__ import annotations

import copy
from typing import Any

from gpuwarden.slurm import hostfacts, preflight
from gpuwarden.slurm.preflight import Host

KEY = "a" * 64
LINES = ["Name=gpu Type=a100 File=/dev/nvidia0", "Name=gpu Type=a100 File=/dev/nvidia1"]


def facts(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema": 1,
        "node": "n",
        "time": 1000.0,
        "users": [["alice", 1001, 1001, "/home/alice"], ["slurm", 64030, 64030, "/nonexistent"]],
        "munge": {
            "key_sha256": KEY,
            "key_error": "",
            "answering": True,
            "error": "",
            "decoded": True,
            "decode_error": "",
        },
        "paths": {"/data": "dir"},
        "slurm": "slurm-wlm 22.05.8",
        "cgroup": "v2",
        "gres_lines": LINES,
        "gres_conf": None,
        "gpu_error": "",
        "missing_homes": [],
    }
    base.update(over)
    return base


def host(name: str, **over: Any) -> Host:
    return Host(name, facts(**over), 999.5, 1000.5)


def test_agreeing_hosts_have_no_problems() -> None:
    hosts = [host("gpu1"), host("gpu2"), host("gpu3", gres_conf=list(reversed(LINES)))]
    assert preflight.problems(hosts) == []
    assert all(preflight.checked(h.facts) is None for h in hosts)


def test_a_uid_gid_or_home_that_differs_is_one_line_on_the_odd_host_with_its_fix() -> None:
    odd = [["alice", 1002, 1001, "/home/alice"], ["slurm", 64030, 64030, "/nonexistent"]]
    lines = preflight.problems([host("gpu1"), host("gpu2", users=odd), host("gpu3")])
    assert lines == [
        "gpu2: user alice has uid 1002, 1001 on gpu1: usermod -u 1001 alice there, then "
        "chown its files"
    ]
    home = [["alice", 1001, 1001, "/srv/alice"], ["slurm", 64030, 64030, "/nonexistent"]]
    (line,) = preflight.problems([host("gpu1"), host("gpu2", users=home)])
    assert line.startswith("gpu2: user alice has home /srv/alice, /home/alice on gpu1: ")
    gid = [["alice", 1001, 100, "/home/alice"], ["slurm", 64030, 64030, "/nonexistent"]]
    (line,) = preflight.problems([host("gpu1"), host("gpu2", users=gid)])
    assert line.startswith("gpu2: user alice has gid 100, 1001 on gpu1")


def test_a_home_missing_on_one_host_only() -> None:
    lines = preflight.problems(
        [host("gpu1", missing_homes=["slurm"]), host("gpu2", missing_homes=["alice", "slurm"])]
    )
    assert lines == [
        "gpu2: user alice's home /home/alice is missing (it is there on the others): mount "
        "the homes there at the same path (a job starts in it)"
    ]  # slurm's /nonexistent is missing everywhere: nothing to say


def test_a_missing_user_and_a_uid_shared_by_two_names() -> None:
    alone = [["slurm", 64030, 64030, "/nonexistent"]]
    (line,) = preflight.problems([host("gpu1"), host("gpu2", users=alone)])
    assert line.startswith("gpu2: no user alice (uid 1001 on gpu1): its jobs cannot run there")
    bob = [["bob", 1001, 1001, "/home/bob"], ["slurm", 64030, 64030, "/nonexistent"]]
    lines = preflight.problems([host("gpu1"), host("gpu2", users=bob)])
    assert "uid 1001 is alice and bob on different hosts" in lines[-1]


def test_munge_a_key_that_differs_a_credential_not_decoded_and_a_silent_munged() -> None:
    other = dict(facts()["munge"], key_sha256="b" * 64)
    (line,) = preflight.problems([host("gpu1"), host("gpu2", munge=other), host("gpu3")])
    assert line.startswith("gpu2: munge key differs from gpu1's (sha256 bbbbbbbbbbbb")
    assert "copy one /etc/munge/munge.key to every host" in line
    # as a user the key cannot be read: the credential made here tells
    unread = dict(facts()["munge"], key_sha256=None, key_error="Permission denied")
    bad = dict(unread, decoded=False, decode_error="unmunge: Error: Invalid credential")
    (line,) = preflight.problems([host("gpu1", munge=unread), host("gpu2", munge=bad)])
    assert line.startswith("gpu2: cannot decode a munge credential made here (unmunge: Error")
    silent = dict(unread, answering=False, error="Failed to access socket", decoded=None)
    lines = preflight.problems([host("gpu1", munge=unread), host("gpu2", munge=silent)])
    assert [x.split(" (")[0] for x in lines] == ["gpu2: munged does not answer"]
    # neither the key nor a credential made here: not compared, and said so
    blind = dict(unread, decoded=None)
    (line,) = preflight.problems([host("gpu1", munge=blind), host("gpu2", munge=blind)])
    assert line.startswith("gpu1, gpu2: munge key not compared (/etc/munge/munge.key: Permission")


def test_a_missing_path_is_one_line() -> None:
    (line,) = preflight.problems([host("gpu1"), host("gpu2", paths={"/data": "missing"})])
    assert line.startswith("gpu2: /data is missing: mount or make it there at the same path")


def test_clocks_apart_by_more_than_a_second_whatever_ssh_took() -> None:
    # asked at 999.5, answered at 1000.5: a host reading 1001.2 is 0.7 s ahead at least
    assert preflight.problems([host("gpu1", time=1001.2)]) == []
    (line,) = preflight.problems([host("gpu1", time=1003.0)])
    assert line.startswith("gpu1: clock at least 2.5 s ahead of this machine's")
    (line,) = preflight.problems([host("gpu1", time=990.0)])
    assert "9.5 s behind" in line


def test_slurm_releases_cgroups_and_gres_conf() -> None:
    lines = preflight.problems(
        [host("gpu1"), host("gpu2", slurm="slurm-wlm 23.02.1"), host("gpu3", slurm=None)]
    )
    assert lines == [
        "gpu2: Slurm 23.02, 22.05 on the others: install one release everywhere "
        "(slurmctld never older than any slurmd)",
        "gpu3: no slurmd installed: apt install slurmd slurm-client (release 22.05, as on "
        "the others)",
    ]
    (line,) = preflight.problems([host("gpu1"), host("gpu2"), host("gpu3", cgroup="v1")])
    assert line.startswith("gpu3: cgroup v1, not v2 as the others")
    assert len(preflight.problems([host("gpu1")], cgroup="v1")) == 1  # --cgroup names it
    mig = ["Name=gpu Type=a100_3g.40gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/x"]
    (line,) = preflight.problems([host("gpu1", gres_conf=mig)])
    assert line.startswith("gpu1: its gres.conf lists a100_3g.40gb, NVML shows a100 x2")


def test_answers_that_are_not_facts_are_named() -> None:
    assert preflight.checked([]) is not None
    assert preflight.checked({"schema": 1}) == "its facts have no users"
    assert preflight.checked(facts(users=[["a", "1", 1, "/"]])) is not None
    broken = copy.deepcopy(facts())
    broken["munge"]["decoded"] = "yes"
    assert preflight.checked(broken) == "its munge facts are not munge's"
    assert preflight.checked(facts(gres_conf=[1])) == "its gres_conf are not lines"


def test_gres_conf_reads_this_nodes_gpu_lines(tmp_path: Any) -> None:
    (tmp_path / "gres.conf").write_text(
        "# made by hand\nNodeName=gpu1 Name=gpu Type=a100 File=/dev/nvidia0  # first\n"
        "NodeName=gpu2 Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia1\n"
        "AutoDetect=off\n"
    )
    assert hostfacts.gres_conf(str(tmp_path), "gpu1") == [
        "Name=gpu Type=a100 File=/dev/nvidia0",
        "Name=gpu File=/dev/nvidia1",
    ]
    assert hostfacts.gres_conf(str(tmp_path / "none"), "gpu1") is None
    assert hostfacts.paths([str(tmp_path), str(tmp_path / "x"), str(tmp_path / "gres.conf")]) == {
        str(tmp_path): "dir",
        str(tmp_path / "x"): "missing",
        str(tmp_path / "gres.conf"): "not a directory",
    }


def test_a_readable_munge_key_is_compared_by_its_sha256(tmp_path: Any) -> None:
    import hashlib

    key = tmp_path / "munge.key"
    key.write_bytes(b"k" * 1024)
    found = hostfacts.munge(str(key), None)
    assert found["key_sha256"] == hashlib.sha256(b"k" * 1024).hexdigest()
    assert found["decoded"] is None  # no credential asked about
    gone = hostfacts.munge(str(tmp_path / "none"), None)
    assert gone["key_sha256"] is None and gone["key_error"] == "No such file or directory"
