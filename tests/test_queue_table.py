"""`gpuwarden queue`'s table as the service writes it (service.queuetext): the same
table the client draws from rows (cli.jobtables, for Slurm and other hosts), each
job's cells made once per version of the job, and a client that decodes no row.

Guarded by counts a busy machine does not move: JSON objects the client decodes
for a listing (it decoded one per row: 600 here) and cells the service makes for
a listing in which nothing changed (it shaped every row every time)."""

from __future__ import annotations

import argparse
import random
import re
from typing import Any

import pytest

from gpuwarden.base.table import render
from gpuwarden.cli.jobtables import queue_table
from gpuwarden.queueclient import cells, protocol
from gpuwarden.service import queuetext
from gpuwarden.service import store as st
from gpuwarden.service.identity import Person
from servicetools import Server, cli_as, submit
from users import make_user
from waiting import wait_for

SPAN = re.compile(r"\d+(d\d\dh|h\d\dm|m\d\ds|s)")


def tokens(text: str) -> list[list[str]]:
    """Each line's words, spans of time masked: the two tables are drawn a moment apart."""
    return [[SPAN.sub("T", w) for w in line.split()] for line in text.splitlines()]


def test_the_service_writes_the_table_the_client_draws(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    ran = cli_as(server, alice, "submit", "-g", "1", "--time", "1h", "--", "sleep", "60")
    assert ran.returncode == 0, ran.stderr
    server.wait_state(int(ran.stdout), ("RUNNING",))
    held = cli_as(server, alice, "submit", "--hold", "--array", "1-40%4", "--", "true")
    assert held.returncode == 0, held.stderr
    submit(server, bob, ["sleep", "1"], request={"count": 4}, time_limit=600.0)
    submit(server, bob, ["echo", "\x1b[2Jgone"], hold=True)  # an escape in a command
    for viewer in (bob, alice):
        same_table(server, viewer)
        text = cli_as(server, viewer, "queue")
    assert "(hidden)" in text.stdout.splitlines()[-1]  # alice does not see bob's command
    assert "\x1b" not in cli_as(server, bob, "queue").stdout  # bob sees his, escaped
    assert f"{int(ran.stdout)}" in text.stdout and "_[1-40%4]" in text.stdout  # one array row
    mine = cli_as(server, bob, "queue", "--me")
    assert "gw-alice" not in mine.stdout and mine.stdout.count("gw-bob") == 2, mine.stdout
    nobody = cli_as(server, bob, "queue", "--user", "nobody")
    assert nobody.stdout.strip() == "no jobs queued or running", nobody.stdout


def same_table(server: Server, viewer: Person) -> None:
    """`queue` as `viewer` types it, and the table drawn from the rows the service
    answers her, alike (a pass between the two may move priorities: then again)."""
    seen: list[str] = []

    def alike() -> bool:
        text = cli_as(server, viewer, "queue")
        assert text.returncode == 0, text.stderr
        rows = server.call(viewer, "queue", arrays=True, limit=500)["jobs"]
        seen[:] = [text.stdout, queue_table(rows)]
        return tokens(text.stdout) == tokens(seen[1])

    wait_for(alike, 30, lambda: "the same table:\n" + "\n".join(seen), 0.5)


def test_the_client_decodes_no_row_of_a_long_queue(
    server: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """600 waiting jobs, listed as `queue --all` and as `queue` (the first 500)."""
    from gpuwarden.cli import queue
    from gpuwarden.queueclient.client import Client, connect

    client = connect(server.socket)
    assert client is not None
    with client:
        for _ in range(600):
            client.call(
                "submit",
                argv=["true"],
                cwd=str(server.work),
                env={"PATH": "/usr/bin:/bin"},
                request={"count": 1},
                hold=True,
            )
    decoded = []
    call = Client.call

    def counting(self: Client, op: str, **fields: Any) -> dict[str, Any]:
        reply = call(self, op, **fields)
        decoded.append(objects(reply))
        return reply

    monkeypatch.setattr(Client, "call", counting)
    monkeypatch.setenv("GPUWARDEN_SOCKET", server.socket)
    for every, shown in ((True, 600), (False, 500)):
        decoded.clear()
        args = argparse.Namespace(me=False, user=None, json=False, start=False, all=every)
        assert queue.local(args) == 0
        out, err = capsys.readouterr()
        assert len(out.splitlines()) == shown + 1  # the header and a line a job
        assert sum(decoded) <= 2 * len(decoded)  # a reply (and its bookings): not a row each
        assert ("500 of 600 jobs shown" in err) is not every


def objects(value: Any) -> int:
    """The JSON objects in a decoded reply."""
    if isinstance(value, dict):
        return 1 + sum(objects(v) for v in value.values())
    if isinstance(value, list):
        return sum(objects(v) for v in value)
    return 0


def job(**kw: Any) -> st.Job:
    fields: dict[str, Any] = {
        "uid": 1000,
        "gid": 1000,
        "user": "alice",
        "argv": ("python", "train.py"),
        "cwd": "/home/alice",
        "env": {"PATH": "/usr/bin"},
        "umask": 0o022,
        "request": {"count": 1},
    }
    fields.update(kw)
    return st.new_job(**fields)


def page(
    text: queuetext.QueueText, journal: st.Store, offset: int = 0, user: Any = None
) -> dict[str, Any]:
    ordered = [j for j in journal.jobs(st.ACTIVE) if user is None or j.user == user]
    moving = {
        "priorities": {},
        "expected_start": lambda job_id: None,
        "indices": {},
        "usage": lambda job_id: (None, None),
    }
    return text.page(
        protocol.Listing(limit=5000, offset=offset, user=user, arrays=True),
        ("viewer",),
        journal.version,
        lambda: [(j, ()) for j in ordered],
        lambda j: True,
        lambda: moving,
    )


def test_cells_are_made_once_per_version_of_a_job(tmp_path: Any) -> None:
    journal = st.Store(str(tmp_path / "jobs.db"))
    for n in range(300):
        journal.add(job(held=True, account="physics" if n == 7 else None))
    text = queuetext.QueueText()
    first = page(text, journal)
    assert text.made == 300 and first["total"] == 300 and first["next"] is None
    assert first["header"].split()[:3] == ["JOB", "USER", "ACCOUNT"]
    assert "physics" in first["lines"][7]
    journal.update(5, held=False)  # one job changed
    again = page(text, journal)
    assert text.made == 301  # that job's cells alone
    assert tokens("\n".join(again["lines"][6:])) == tokens("\n".join(first["lines"][6:]))
    journal.update(9, state="STARTING", started=1.0, gpus=("GPU-x",))
    started = page(text, journal)
    assert text.made == 302 and len(text.cells) == 300
    journal.add(job(user="bob", uid=1001))
    assert page(text, journal, user="bob")["total"] == 1 and text.made == 303
    page(text, journal)  # one user's listing kept everyone's cells
    assert text.made == 303 and len(text.cells) == 301
    assert "STARTING" in started["lines"][8] and "1@?" in started["lines"][8]


def test_later_pages_come_from_the_table_the_first_was_cut_from(tmp_path: Any) -> None:
    journal = st.Store(str(tmp_path / "jobs.db"))
    for _ in range(10):
        journal.add(job(held=True))
    text = queuetext.QueueText()
    first = page(text, journal)
    journal.add(job(held=True))  # arrives between two pages
    assert page(text, journal, offset=4)["lines"] == first["lines"][4:]
    assert page(text, journal)["total"] == 11  # a new listing sees it


def test_lines_are_the_render_of_the_same_rows() -> None:
    rng = random.Random(7)
    words = ["", "a", "held", "12_[3-9]", "(start in ~3m)", "python train.py --lr 3e-4"]
    for _ in range(50):
        columns = rng.randint(1, 6)
        right = tuple(i for i in range(columns) if rng.random() < 0.5)
        headers = [f"H{i}" for i in range(columns)]
        rows = [[rng.choice(words) for _ in range(columns)] for _ in range(rng.randint(0, 5))]
        assert cells.lines(headers, rows, right) == render(headers, rows, right).split("\n")


THIN = """
import sys
from gpuwarden.queueclient.thinqueue import queue
code = queue(sys.argv[1:])
loaded = sorted(sys.modules)
import json
print(json.dumps([code, loaded]), file=sys.stderr)
"""


def test_queue_prints_the_table_without_the_full_client(server: Server) -> None:
    """`queue`, `--all`, `--me` need neither argparse, json, the settings' schema nor
    the full client: the interpreter's start and the lines (queueclient.thinqueue)."""
    import json
    import os
    import subprocess
    import sys

    from repo import SRC

    submit(server, make_user("alice", ("lab",)), ["true"], hold=True)

    def thin(*args: str) -> tuple[Any, list[str], str]:
        env = dict(os.environ, PYTHONPATH=str(SRC), GPUWARDEN_SOCKET=server.socket)
        out = subprocess.run(
            [sys.executable, "-c", THIN, *args], env=env, capture_output=True, text=True
        )
        code, loaded = json.loads(out.stderr.strip().splitlines()[-1])
        return code, loaded, out.stdout

    code, loaded, text = thin("--all")
    assert code == 0 and text.splitlines()[0].split()[:2] == ["JOB", "USER"]
    assert "gw-alice" in text and len(text.splitlines()) == 2
    unneeded = {"argparse", "json", "typing", "socket", "re", "gpuwarden.config"}
    unneeded |= {"gpuwarden.queueclient.client", "gpuwarden.queueclient.protocol"}
    assert not set(loaded) & unneeded, sorted(set(loaded) & unneeded)
    assert thin("--me")[0] == 0 and "gw-alice" not in thin("--me")[2]  # root's: none
    for other in (("--json",), ("--user", "gw-alice"), ("--all", "--all"), ("--start",)):
        assert thin(*other)[0] is None  # the full client's
