"""A service job's states, a closed set, and every move between them, in one table.

The journal (service.store) changes a job's state only by a move this table names;
any other raises `IllegalMove` before anything is written, so a job never ends twice
(charged twice, announced twice) nor starts from an end without being queued again.
Written as Dask's distributed worker writes its task states: the states a closed
type, the legal moves a table keyed by (from, to). docs/architecture.md draws it
(`table_markdown`; tests/test_service_states.py checks that the two agree).
"""

from __future__ import annotations

from typing import Final, Literal, get_args

State = Literal[
    "PENDING",
    "STARTING",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "LOST",
    "PREEMPTED",
]

PENDING: Final = "PENDING"
STARTING: Final = "STARTING"
RUNNING: Final = "RUNNING"
COMPLETED: Final = "COMPLETED"
FAILED: Final = "FAILED"
CANCELLED: Final = "CANCELLED"
TIMEOUT: Final = "TIMEOUT"
LOST: Final = "LOST"
PREEMPTED: Final = "PREEMPTED"  # ended by preemption (`--preempt=cancel`), as Slurm's state

STATES: Final[tuple[State, ...]] = get_args(State)
ACTIVE: Final[tuple[State, ...]] = (PENDING, STARTING, RUNNING)
ENDED: Final[tuple[State, ...]] = (COMPLETED, FAILED, CANCELLED, TIMEOUT, LOST, PREEMPTED)

_RUN_ENDS: Final[dict[State, str]] = {
    COMPLETED: "its command exited 0",
    FAILED: "its command failed (no retry left)",
    CANCELLED: "cancelled (`cancel`, its attached client gone)",
    TIMEOUT: "its `--time` ran out",
    LOST: "its supervisor died without an exit record",
    PREEMPTED: "preempted with `--preempt=cancel`",
}

#: (from, to) -> when the move is made. A pair not here is illegal.
TRANSITIONS: Final[dict[tuple[State, State], str]] = {
    (PENDING, STARTING): "the plan starts it: leases taken, committed before its supervisor runs",
    (PENDING, CANCELLED): "cancelled while waiting, refused (`run` without --wait), "
    "or its attached client never learnt its id",
    (PENDING, FAILED): "its start failed before its supervisor was recorded",
    (STARTING, RUNNING): "its supervisor reported it exec'd; its leases name its pid now",
    (STARTING, PENDING): "a restart found its supervisor never had the go-ahead: queued again",
    **{(STARTING, end): f"{why}: read after a restart" for end, why in _RUN_ENDS.items()},
    (STARTING, FAILED): "its start failed once its supervisor was recorded, or its command did",
    (RUNNING, PENDING): "requeued (`requeue`, `--max-retries`, `--preempt=requeue`), "
    "or it never started before a restart",
    **{(RUNNING, end): why for end, why in _RUN_ENDS.items()},
    **{(end, PENDING): "`requeue` of an ended job: it waits again under its id" for end in ENDED},
}


class IllegalMove(ValueError):
    """A state change the table does not allow: a bug in the service, never a user's."""


def state(text: str) -> State:
    """`text` as a State (a journal row's, a filter's); ValueError for anything else."""
    for known in STATES:
        if text == known:
            return known
    raise ValueError(f"no job state {text!r} (one of {', '.join(STATES)})")


def check(job_id: int, was: str, to: str) -> State:
    """The state `to` once the move `was` -> `to` of job `job_id` is known legal."""
    new = state(to)
    if (was, new) not in TRANSITIONS:
        allowed = sorted(b for a, b in TRANSITIONS if a == was)
        raise IllegalMove(
            f"job {job_id}: no move from {was} to {new} "
            f"(from {was}: {', '.join(allowed) or 'none'})"
        )
    return new


def table_markdown() -> str:
    """The moves as a Markdown table, in the order of STATES (docs/architecture.md)."""
    rows = ["| from | to | when |", "| --- | --- | --- |"]
    order = {s: i for i, s in enumerate(STATES)}
    for (was, to), why in sorted(
        TRANSITIONS.items(), key=lambda m: (order[m[0][0]], order[m[0][1]])
    ):
        rows.append(f"| {was} | {to} | {why} |")
    return "\n".join(rows)
