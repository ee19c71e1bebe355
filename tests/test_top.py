"""`gpuwarden top` as a student uses it: in a real terminal (tmux) as a real non-root
user, against the real queue service on the simulated server. It shows the GPUs and
the queue, cancels her own waiting job with two keys (the job is then gone from
`queue`), shows the service's refusal when the same keys meet someone else's job, and
draws again at the new size when the window is resized. The screen's layout itself is
tested as text, without a terminal (`screen.draw`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.lab.reading import Lab
from gpuwarden.top.model import Action, State, job_rows, press
from gpuwarden.top.screen import KEYS, draw
from hermetic import hermetic
from pythons import python_for
from servicetools import SPEC, Server, cli_as, submit
from terminals import Tmux
from users import make_user


@pytest.fixture
def terminal_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gw-top-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def top_as(srv: Server, user: str, folder: Path, *args: str, color: bool = False) -> Tmux:
    python, path = python_for(user)
    env = [
        *(f"{k}={v}" for k, v in hermetic().items()),  # the test's config, state, leases
        f"PYTHONPATH={path}",
        "PATH=/usr/bin:/bin",
        f"GPUWARDEN_SOCKET={srv.socket}",
        f"GPUWARDEN_SIM={SPEC}",
        f"GPUWARDEN_LEASE_DIR={os.environ['GPUWARDEN_LEASE_DIR']}",
        "TERM=screen",
        *([] if color else ["NO_COLOR=1"]),
    ]
    runuser = shutil.which("runuser") or "runuser"
    command = [
        runuser,
        "-u",
        user,
        "--",
        "env",
        "-i",
        *env,
        *python,
        "-m",
        "gpuwarden",
        "top",
        *args,
    ]
    return Tmux(folder, command, 80, 24)


def row_of(lines: list[str], job: int) -> int:
    """The screen row of a job: below the jobs' header, the line that starts with its id."""
    head = next(i for i, line in enumerate(lines) if line.startswith("JOB "))
    return next(i for i, line in enumerate(lines) if i > head and line.split()[:1] == [str(job)])


def shows(lines: list[str], job: int) -> bool:
    try:
        row_of(lines, job)
    except StopIteration:
        return False
    return True


def test_a_student_cancels_her_job_with_two_keys_and_is_refused_on_anothers(
    server: Server, terminal_dir: Path
) -> None:
    make_user("alice", ("lab",))
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    blocker = submit(server, bob, ["sleep", "300"], request={"count": 4}, time_limit=600.0)
    server.wait_state(blocker, ("RUNNING",))
    theirs = submit(server, bob, ["sleep", "1"], request={"count": 2})
    mine = submit(server, alice, ["sleep", "1"], request={"count": 1})
    screen = top_as(server, "gw-alice", terminal_dir, "--me")
    try:
        lines = screen.wait(
            "the GPUs and her waiting job",
            lambda s: shows(s, mine) and sum("A100" in line for line in s) == 4,
        )
        assert lines[0].startswith("gpuwarden top") and "you: gw-alice" in lines[0]
        gpu_lines = [line for line in lines if "A100" in line]
        assert all("gw-bob" in line for line in gpu_lines), gpu_lines  # bob's lease
        assert "PENDING" in lines[row_of(lines, mine)] and "Resources" in lines[row_of(lines, mine)]
        assert lines[23].startswith(KEYS[:40])

        screen.keys("c", "y")  # the two keys
        screen.wait(f"job {mine} cancelled", lambda s: f"cancelled {mine}" in "\n".join(s))
        queue = cli_as(server, alice, "queue").stdout
        assert str(mine) not in [line.split()[0] for line in queue.splitlines()[1:]], queue

        screen.keys("m")  # everyone's jobs, bob's waiting one among them
        lines = screen.wait("bob's jobs", lambda s: shows(s, theirs) and shows(s, blocker))
        steps = row_of(lines, theirs) - row_of(lines, blocker)
        screen.keys(*["j"] * steps)
        screen.keys("c")
        screen.wait("the question", lambda s: f"Cancel job {theirs} (gw-bob" in "\n".join(s))
        screen.keys("y")
        said = cli_as(server, alice, "cancel", str(theirs)).stderr.strip()
        reason = said.removeprefix("gpuwarden cancel: ")
        assert reason and reason != said, said
        screen.wait("the service's refusal", lambda s: f"refused: {reason}"[:70] in "\n".join(s))
        assert server.job(theirs)["state"] == "PENDING"

        assert lines[1].startswith("GPU NAME      UTIL" + " " * 10 + "MEMORY")  # 80 columns
        wide = "GPU NAME      UTIL" + " " * 12 + "MEMORY"  # wider bars at 120 columns
        screen.tmux("resize-window", "-t", "top", "-x", "120", "-y", "40")
        lines = screen.wait(
            "the screen drawn at 120x40",
            lambda s: len(s) >= 40 and s[39].startswith(KEYS[:40]) and s[1].startswith(wide),
        )
        assert sum("A100" in line for line in lines) == 4
        screen.keys("q")
    finally:
        screen.close()
        server.call(None, "cancel", jobs=[blocker, theirs, mine])


# -- the screen as text, without a terminal -------------------------------------------


def lab(waiting: int = 1000, **kw: Any) -> Lab:
    gpus = [
        {
            "index": i,
            "name": "NVIDIA A100-SXM4-80GB",
            "utilization": 50,
            "memory_used": 40 << 30,
            "memory_total": 80 << 30,
            "temperature": 50,
            "power_draw": 200.0,
            "health": {"level": "ok"},
            "leases": [{"user": "ann", "job": "1"}] if i == 0 else [],
            "processes": [],
            "slices": [],
        }
        for i in range(8)
    ]
    jobs = [
        {"id": 1, "user": "ann", "state": "RUNNING", "count": 1, "indices": [0], "started": 0.0},
        *(
            {
                "id": n,
                "user": "bob" if n % 2 else "ann",
                "state": "PENDING",
                "count": 2,
                "reason": "Resources",
                "priority": 1000.0 - n,
                "submitted": float(n),
            }
            for n in range(2, waiting + 2)
        ),
    ]
    return Lab(
        **{"host": "box", "taken_at": 100.0, "gpus": gpus, "jobs": jobs, "user": "ann", **kw}
    )


def text(lines: list[Any]) -> list[str]:
    return ["".join(t for t, _ in line) for line in lines]


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60), (40, 10)])
def test_every_line_is_exactly_the_terminals_width(size: tuple[int, int]) -> None:
    width, height = size
    shown = text(draw([lab()], State(), width, height, now=100.0))
    assert len(shown) == height and {len(line) for line in shown} == {width}, shown


def test_the_keys_move_filter_and_ask_before_acting() -> None:
    labs = [lab()]
    state = State()
    assert press(state, "c", labs) is None and state.prompt is not None
    assert state.prompt.question.startswith("Cancel job 1 (ann, RUNNING")
    assert press(state, "n", labs) is None and state.message == "nothing done"
    press(state, "j", labs)
    press(state, "c", labs)
    assert press(state, "y", labs) == Action("cancel", "2")
    press(state, "/", labs)
    for key in "bob":
        press(state, key, labs)
    press(state, "enter", labs)
    assert {r["user"] for r in job_rows(labs, state)} == {"bob"}
    press(state, "tab", labs)
    press(state, "d", labs)
    for key in ("x", "enter"):
        press(state, key, labs)
    assert state.prompt is not None and state.prompt.question == "Drain GPU 0 (x)? [y/N] "
    assert press(state, "y", labs) == Action("drain", "0", None, "x")


@pytest.mark.parametrize("jobs", [1_000, 10_000])
def test_a_redraw_formats_only_the_rows_on_the_screen(
    jobs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard of bench/top.py's redraw figure (docs/top.md), by counts: however long
    the queue, a redraw formats the job rows that fit and no more, and the view asks
    the service for a screen and a page below it, not for the whole queue."""
    from gpuwarden.top import screen
    from gpuwarden.top.model import wanted_rows

    big = lab(waiting=jobs)
    formatted = []
    real = screen._job_text
    monkeypatch.setattr(screen, "_job_text", lambda *a: formatted.append(1) or real(*a))
    shown = text(draw([big], State(), 80, 24, now=100.0))
    rows = [line for line in shown if line.split()[:1] and line.split()[0].isdigit()]
    rows = [line for line in rows if "A100" not in line]
    assert len(big.jobs) == jobs + 1 and len(formatted) == len(rows) == 9, shown
    assert shown[1].startswith("mine: 1 running on 0 (1m40s), 2 waiting (Resources)"), shown
    assert wanted_rows(State(), 24) == 49 and wanted_rows(State(sort="user"), 24) is None


def test_her_running_jobs_output_is_followed_with_l(server: Server, terminal_dir: Path) -> None:
    alice = make_user("alice", ("lab",))
    job = submit(
        server, alice, ["sh", "-c", "echo first-line; sleep 1; echo second-line; sleep 60"]
    )
    server.wait_state(job, ("RUNNING",))
    screen = top_as(server, "gw-alice", terminal_dir, "--me", color=True)
    try:
        screen.wait("her running job", lambda s: shows(s, job) and "RUNNING" in "\n".join(s))
        screen.keys("l")
        lines = screen.wait(
            "its output, followed", lambda s: "second-line" in "\n".join(s), timeout=30
        )
        head = next(i for i, line in enumerate(lines) if line.startswith(f"output of job {job}"))
        assert [line.strip() for line in lines[head + 1 : head + 3]] == [
            "first-line",
            "second-line",
        ]
        screen.keys("Escape")
        screen.wait("the log closed", lambda s: not any("output of job" in line for line in s))
        screen.keys("q")
    finally:
        screen.close()
        server.call(None, "cancel", jobs=[job])


def test_several_hosts_are_read_and_acted_on_over_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--hosts`: each host's GPUs from its `web --once`, its jobs from its `queue --json
    --all`, a host that does not answer is a line; an action runs on its host."""
    from gpuwarden.hosts import remote
    from gpuwarden.lab.reading import read_hosts
    from gpuwarden.top import acting

    page = {"gpus": lab().gpus[:2], "queue": {"user": "ann", "admin": False}}
    rows = [{"id": 7, "user": "ann", "state": "PENDING", "count": 1, "reason": "Resources"}]

    def ask_json(hosts: list[str], argv: list[str]) -> list[Any]:
        found = {"web": page, "queue": rows}[argv[0]]
        return [(h, found, "") if h == "a" else (h, None, "ssh: timed out") for h in hosts]

    monkeypatch.setattr(remote, "ask_json", ask_json)
    labs = read_hosts(["a", "b"])
    assert [(x.host, len(x.gpus), len(x.jobs), x.user) for x in labs] == [
        ("a", 2, 1, "ann"),
        ("b", 0, 0, None),
    ]
    shown = text(draw(labs, State(), 100, 24, now=100.0))
    assert any(line.startswith("b: ssh: timed out") for line in shown), shown
    assert any(line.startswith("a    7 ") and "Resources" in line for line in shown), shown
    ran: list[Any] = []

    def run_on(host: str, argv: list[str], *rest: Any) -> Any:
        ran.append((host, argv))
        return remote.HostReply(host, False, error="gpuwarden cancel: job 7 belongs to bob")

    monkeypatch.setattr(remote, "run_on", run_on)
    said = acting.perform(Action("cancel", "7", "a"), "/nonexistent")
    assert ran == [("a", ["gpuwarden", "cancel", "7"])]
    assert said == "refused: job 7 belongs to bob"


def test_an_admin_cancels_anyones_job_with_the_same_keys(
    server: Server, terminal_dir: Path
) -> None:
    """gw-carol is the service's admin (servicetools): the service lets her."""
    make_user("carol")
    bob = make_user("bob")
    blocker = submit(server, bob, ["sleep", "300"], request={"count": 4}, time_limit=600.0)
    server.wait_state(blocker, ("RUNNING",))
    theirs = submit(server, bob, ["sleep", "1"], request={"count": 2})
    screen = top_as(server, "gw-carol", terminal_dir, "--user", "gw-bob", "--sort", "waited")
    try:
        lines = screen.wait("bob's jobs", lambda s: shows(s, theirs) and shows(s, blocker))
        assert "you: gw-carol (admin)" in lines[0]
        screen.keys(*["j"] * (row_of(lines, theirs) - row_of(lines, blocker)))
        screen.keys("c")
        screen.wait("the question", lambda s: f"Cancel job {theirs} (gw-bob" in "\n".join(s))
        screen.keys("y")
        screen.wait("done", lambda s: f"cancelled {theirs}" in "\n".join(s))
        assert server.job(theirs)["state"] == "CANCELLED"
        screen.keys("q")
    finally:
        screen.close()
        server.call(None, "cancel", jobs=[blocker, theirs])
