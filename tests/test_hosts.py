"""The pure half of `--hosts`: host lists, ssh's command line, and merging replies that
come from other machines (read as untrusted). The real ssh runs are test_hosts_real.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.hosts import merge, remote


def test_host_lists_come_from_a_file_or_commas_and_refuse_what_ssh_would_misread(
    tmp_path: Path,
) -> None:
    assert remote.parse_hosts("a, b,,a,alice@c") == ["a", "b", "alice@c"]
    listed = tmp_path / "hosts"
    listed.write_text("# lab\ngpu1\n\ngpu2   # the new one\n")
    assert remote.parse_hosts(str(listed)) == ["gpu1", "gpu2"]
    for bad in ("-oProxyCommand=x", "a b", "a;b", "$(x)", "a\x1b[2J"):
        with pytest.raises(UserError, match="not a host name"):
            remote.parse_hosts(f"ok,{bad}")
    with pytest.raises(UserError, match="no host names"):
        remote.parse_hosts(" , ")
    argv = remote.ssh_argv("gpu1", ["gpuwarden", "status", "--user", "o'brien"], ["-p2"])
    assert argv[-3:] == ["--", "gpu1", "gpuwarden status --user 'o'\"'\"'brien'"]
    assert "BatchMode=yes" in argv and "-p2" in argv
    # One limit, run_on's clock: a ConnectTimeout as long raced it for a frozen host's line.
    assert not any(word.startswith("ConnectTimeout") for word in argv)


def test_status_merge_keeps_every_host_and_reads_a_strange_reply_as_an_error() -> None:
    gpu = {"index": 0, "name": "NVIDIA A100", "memory_used": 1 << 30, "memory_total": 80 << 30}
    gpu |= {"utilization_gpu": 5, "temperature": 40, "health": {"level": "ok"}}
    gpu |= {"processes": [{"user": "ann\x1b[2J"}], "leases": [{"user": "bob"}]}
    odd = {**gpu, "index": 1, "memory_used": "lots", "temperature": float("nan"), "health": 3}
    merged = merge.merge_status(
        [
            ("a", {"gpus": [gpu, odd]}, ""),
            ("b", None, "ssh: connect to host b port 22: Connection refused"),
            ("c", {"gpus": "none"}, ""),
            ("d", {"gpus": [], "error": "NVML: driver not loaded"}, ""),
        ]
    )
    assert [(h["host"], h["ok"]) for h in merged["hosts"]] == [
        ("a", True),
        ("b", False),
        ("c", False),
        ("d", True),
    ]
    text = merge.status_text(merged).splitlines()
    first = ["a", "0", "A100", "40C", "5%", "1024MiB/80.0GiB", "ok", "bob", "ann\\x1b[2J"]
    assert text[1].split() == first
    assert text[2].split()[3:7] == ["n/a", "5%", "n/a/80.0GiB", "n/a"]
    assert text[3:] == [
        "b: ssh: connect to host b port 22: Connection refused",
        "c: answered with a document that is not `status --json`'s",
        "d: no GPUs (NVML: driver not loaded)",
    ]


def test_jobs_of_other_hosts_are_reshaped_before_the_table_reads_them() -> None:
    from gpuwarden.cli.jobtables import queue_table

    good = {"id": 7, "user": "ann", "state": "RUNNING", "gpus": [0, 1], "command": ["python"]}
    bad = {"id": {"x": 1}, "user": 3, "state": "PENDING", "priority": "high", "gpus": "all"}
    merged = merge.merge_jobs([("a", [good], ""), ("b", [bad], ""), ("c", {"jobs": []}, "")])
    assert [h["ok"] for h in merged["hosts"]] == [True, True, False]
    assert merged["jobs"][1]["priority"] is None and merged["jobs"][1]["gpus"] is None
    table = queue_table(merged["jobs"], now=0.0).splitlines()
    assert table[0].split()[:2] == ["HOST", "JOB"]
    assert table[1].split()[:3] == ["a", "7", "ann"]
    assert merge.notes(merged) == ["c: answered with something that is not a list of jobs"]


def test_where_free_keeps_hosts_whose_select_answered_with_ids() -> None:
    fits, notes = merge.where_free(
        [("a", "0,2\n", ""), ("b", "", "only 1 free"), ("c", "0;rm -rf /", "")]
    )
    assert fits == [("a", "0,2")]
    assert notes == ["b: only 1 free", "c: no usable answer"]


def test_a_badly_quoted_ssh_setting_is_one_line(cli: Any) -> None:
    done = cli("status", "--hosts", "gpu1", env={"GPUWARDEN_HOSTS_SSH_OPTIONS": "-o 'Port 22"})
    assert done.returncode == 2
    assert done.stderr == (
        "gpuwarden status: hosts.ssh_options (env: GPUWARDEN_HOSTS_SSH_OPTIONS): "
        "No closing quotation\n"
    )


def test_a_host_answering_deeply_nested_json_is_one_line(cli: Any, tmp_path: Path) -> None:
    """A host (or whatever answers as it over ssh) that sends `[` x 100,000 is one
    line of error among the hosts, never the parser's RecursionError."""
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec python3 -c \"print('[' * 100000 + ']' * 100000)\"\n")
    fake.chmod(0o755)
    done = cli("status", "--hosts", "gpu1", env={"PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr
    said = done.stdout + done.stderr
    assert "gpu1: answered JSON nested deeper than 64 levels: refused" in said, said
