"""Slurm's job states and pending reasons in the words of gpuwarden's queue (pure).

`gpuwarden queue` shows local and Slurm jobs alike, so a job waiting for GPUs
reads "pending (Resources)" whichever scheduler holds it. The words are the
local queue's: states in lower case, the reason a job waits as one capitalised
word (Resources, Priority, Dependency, Held, Begin, Nodes, Limit, ...). A state
or reason this table does not know is shown as Slurm wrote it, never dropped.
"""

from __future__ import annotations

STATES: dict[str, str] = {
    "PENDING": "pending",
    "CONFIGURING": "starting",
    "RUNNING": "running",
    "COMPLETING": "finishing",
    "COMPLETED": "done",
    "FAILED": "failed",
    "BOOT_FAIL": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "DEADLINE": "timeout",
    "TIMEOUT": "timeout",
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "SUSPENDED": "suspended",
    "STOPPED": "suspended",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "RESIZING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "finishing",
}

# Reasons a PENDING job gives, grouped as the local queue groups its own.
REASONS: dict[str, str] = {
    "Resources": "Resources",
    "Priority": "Priority",
    "Dependency": "Dependency",
    "DependencyNeverSatisfied": "Dependency",
    "JobHeldUser": "Held",
    "JobHeldAdmin": "Held",
    "BeginTime": "Begin",
    "ReqNodeNotAvail": "Nodes",
    "NodeDown": "Nodes",
    "PartitionDown": "Nodes",
    "PartitionInactive": "Nodes",
    "PartitionNodeLimit": "Limit",
    "PartitionTimeLimit": "Limit",
    "AssocGrpGRES": "Limit",
    "AssocMaxJobsLimit": "Limit",
    "QOSMaxJobsPerUserLimit": "Limit",
    "BadConstraints": "Invalid",
    "InvalidAccount": "Invalid",
    "InvalidQOS": "Invalid",
}

ENDED = frozenset({"done", "failed", "timeout", "cancelled", "preempted"})


def state_word(state: str) -> str:
    """`RUNNING` -> `running`; `CANCELLED by 0` -> `cancelled`; unknown -> lower case."""
    head = state.strip().split(" ", 1)[0].upper()
    return STATES.get(head, head.lower())


def reason_word(reason: str) -> str:
    """The reason a job waits: `JobHeldUser` -> `Held`; `None` (no reason) -> ``;
    `ReqNodeNotAvail, UnavailableNodes:vm` -> `Nodes`; unknown ones as Slurm wrote them."""
    text = reason.strip()
    if text in ("", "None", "(null)"):
        return ""
    head = text.split(",", 1)[0].strip()
    return REASONS.get(head, head)
