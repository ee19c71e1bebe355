"""The view's state and what each key does to it: pure, no terminal, no service.

A key moves the cursor, changes the filter or sort, opens a job's log, or asks to act;
an action is never carried out by a key alone: it becomes a question ("Cancel job 12
(gw-ann: sleep 60)? y/N") and only `y` turns it into an `Action` for `acting`. So
cancelling a job takes two keys, `c` then `y`, and any other key takes it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuwarden.base.records import record
from gpuwarden.lab.reading import Lab

#: How the job list can be ordered (`s` cycles): the queue's own order (running jobs,
#: then waiting ones in the order they start), by user, by GPUs asked, by time waited.
SORTS = ("queue", "user", "gpus", "waited")
RUNNING = ("RUNNING", "STARTING")
#: Verbs of the job actions (key -> (op, verb shown)).
JOB_KEYS = {"c": ("cancel", "Cancel"), "h": ("hold", "Hold"), "r": ("release", "Release")}
JOB_KEYS["R"] = ("requeue", "Requeue")


@record
class Action:
    """One confirmed thing to do: `op` on `target` (a job's name, `12` or `12_7`, or a
    GPU index), on `host` (None: this machine)."""

    op: str
    target: str
    host: Optional[str] = None
    reason: Optional[str] = None  # a drain's


@dataclass
class Prompt:
    """A question on the bottom line: yes/no (`text` None) or a line to type."""

    question: str
    action: Optional[Action] = None  # what `y` (or Enter, for a text) does
    text: Optional[str] = None
    purpose: str = "confirm"  # "confirm", "user" (the filter) or "drain" (the reason)


@dataclass
class State:
    focus: str = "jobs"  # "jobs" or "gpus": where the cursor keys and actions go
    cursor: int = 0
    gpu_cursor: int = 0
    offset: int = 0  # the first job row on the screen
    user: Optional[str] = None  # only this user's jobs
    mine: bool = False  # only mine
    sort: str = "queue"
    prompt: Optional[Prompt] = None
    message: str = ""
    log: Optional[tuple[Optional[str], str]] = None  # (host, job) whose output is shown
    log_lines: list[str] = field(default_factory=list)
    help: bool = False
    quit: bool = False


def wanted_rows(state: State, room: int) -> Optional[int]:
    """How many of the queue's first rows the view needs: in the queue's own order, those
    down to a page below the screen's last (a queue of thousands is not read whole at
    every refresh); another order needs them all (None)."""
    if state.sort != "queue":
        return None
    return max(state.cursor, state.offset + room) + room + 1


def job_rows(labs: Sequence[Lab], state: State) -> list[dict[str, Any]]:
    """The job rows shown, filtered and sorted; each carries its host where there are
    several (`host`), and `mine` (whether its owner is who the service says we are)."""
    several = len(labs) > 1
    rows: list[dict[str, Any]] = []
    for lab in labs:
        for job in lab.jobs:
            mine = lab.user is not None and job.get("user") == lab.user
            if state.mine and not mine:
                continue
            if state.user is not None and job.get("user") != state.user:
                continue
            rows.append({**job, "host": lab.host if several else None, "mine": mine})
    return sorted(rows, key=_order(state.sort))


def _order(sort: str) -> Any:
    def queue(j: Mapping[str, Any]) -> tuple[Any, ...]:
        running = j.get("state") in RUNNING
        if running:
            return (0, float(j.get("started") or 0.0), 0.0, _id(j))
        return (1, -float(j.get("priority") or 0.0), float(j.get("submitted") or 0.0), _id(j))

    if sort == "user":
        return lambda j: (str(j.get("user")), queue(j))
    if sort == "gpus":
        return lambda j: (-int(j.get("count") or 0), queue(j))
    if sort == "waited":
        return lambda j: (float(j.get("submitted") or 0.0), _id(j))
    return queue


def _id(job: Mapping[str, Any]) -> int:
    value = job.get("id")
    return value if isinstance(value, int) else 0


def gpu_rows(labs: Sequence[Lab]) -> list[tuple[Optional[str], dict[str, Any]]]:
    """(host, GPU) for every GPU shown; the host is None on one machine."""
    several = len(labs) > 1
    return [(lab.host if several else None, g) for lab in labs for g in lab.gpus]


def job_name(job: Mapping[str, Any]) -> str:
    """How the service names a row to act on: an array's waiting tasks folded into one
    row are named by the array's id (the action reaches all of them, as `cancel 12`)."""
    if job.get("array_count"):
        return str(job.get("array_job") or job.get("id"))
    label = job.get("label")
    if isinstance(label, str) and "[" not in label:
        return label
    return str(job.get("id"))


def describe(job: Mapping[str, Any]) -> str:
    """`job 12 (gw-ann, PENDING: sleep 60)` for a question."""
    from gpuwarden.files.safefiles import printable

    words = job.get("command")
    what = " ".join(str(w) for w in words) if isinstance(words, list) else "command hidden"
    name = job_name(job)
    noun = (
        f"array {name} (all {job['array_count']} waiting tasks)"
        if job.get("array_count")
        else f"job {name}"
    )
    return printable(f"{noun} ({job.get('user')}, {job.get('state')}: {what[:60]})")


def press(state: State, key: str, labs: Sequence[Lab], page: int = 10) -> Optional[Action]:
    """Apply `key` to `state`; the confirmed action, if this key confirmed one."""
    if state.prompt is not None:
        return _answer(state, key)
    rows = job_rows(labs, state)
    gpus = gpu_rows(labs)
    state.message = ""
    if key in ("q", "Q"):
        state.quit = True
    elif key == "?":
        state.help = not state.help
    elif key == "esc":
        state.help, state.log = False, None
    elif key == "tab":
        state.focus = "gpus" if state.focus == "jobs" and gpus else "jobs"
    elif key in MOVES:
        _move(state, MOVES[key], len(gpus) if state.focus == "gpus" else len(rows), page)
    elif key == "m":
        state.mine, state.cursor, state.offset = not state.mine, 0, 0
    elif key == "/":
        state.prompt = Prompt(
            "Show only the jobs of user (empty: everyone): ", text="", purpose="user"
        )
    elif key == "s":
        state.sort = SORTS[(SORTS.index(state.sort) + 1) % len(SORTS)]
        state.message = f"sorted by {state.sort}"
    elif state.focus == "jobs" and key in (*JOB_KEYS, "l", "enter"):
        _job_key(state, key, rows)
    elif state.focus == "gpus" and key in ("d", "D"):
        _gpu_key(state, key, gpus)
    elif key in ("d", "D"):
        state.message = "drain and undrain act on a GPU: Tab moves to the GPUs"
    return None


MOVES = {
    "up": -1,
    "k": -1,
    "down": 1,
    "j": 1,
    "pgup": -1000,
    "pgdn": 1000,
    "home": -(10**9),
    "g": -(10**9),
    "end": 10**9,
    "G": 10**9,
}


def _move(state: State, step: int, count: int, page: int) -> None:
    if abs(step) == 1000:
        step = page if step > 0 else -page
    if state.focus == "gpus":
        state.gpu_cursor = max(0, min(count - 1, state.gpu_cursor + step))
    else:
        state.cursor = max(0, min(count - 1, state.cursor + step))


def selected(state: State, rows: Sequence[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not rows:
        return None
    state.cursor = max(0, min(state.cursor, len(rows) - 1))
    return rows[state.cursor]


def _job_key(state: State, key: str, rows: Sequence[dict[str, Any]]) -> None:
    job = selected(state, rows)
    if job is None:
        state.message = "no job selected"
        return
    host = job.get("host")
    if key in ("l", "enter"):
        target = (host, str(job.get("id")))
        state.log = None if state.log == target else target
        state.log_lines = []
        return
    op, verb = JOB_KEYS[key]
    where = f" on {host}" if host else ""
    action = Action(op, job_name(job), host)
    state.prompt = Prompt(f"{verb} {describe(job)}{where}? [y/N] ", action)


def _gpu_key(state: State, key: str, gpus: Sequence[tuple[Optional[str], dict[str, Any]]]) -> None:
    if not gpus:
        return
    state.gpu_cursor = max(0, min(state.gpu_cursor, len(gpus) - 1))
    host, gpu = gpus[state.gpu_cursor]
    action = Action("drain" if key == "d" else "undrain", str(gpu.get("index")), host)
    if key == "d":
        state.prompt = Prompt(f"Drain GPU {gpu.get('index')}: reason: ", action, "", "drain")
    else:
        state.prompt = Prompt(f"Undrain GPU {gpu.get('index')}? [y/N] ", action)


def _answer(state: State, key: str) -> Optional[Action]:
    prompt = state.prompt
    assert prompt is not None
    if prompt.text is None:  # yes or no
        state.prompt = None
        if key in ("y", "Y") and prompt.action is not None:
            return prompt.action
        state.message = "nothing done"
        return None
    if key == "esc":
        state.prompt, state.message = None, "nothing done"
    elif key == "backspace":
        prompt.text = prompt.text[:-1]
    elif key == "enter":
        state.prompt = None
        text = prompt.text.strip()
        if prompt.purpose == "user":
            state.user, state.cursor, state.offset = text or None, 0, 0
        elif prompt.purpose == "drain" and prompt.action is not None:
            if not text:
                state.message = "a drain needs a reason; nothing done"
                return None
            action = Action("drain", prompt.action.target, prompt.action.host, text)
            state.prompt = Prompt(f"Drain GPU {action.target} ({text})? [y/N] ", action)
    elif len(key) == 1 and key.isprintable() and len(prompt.text) < 200:
        prompt.text += key
    return None
