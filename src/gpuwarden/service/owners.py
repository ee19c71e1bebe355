"""Whose job is it: the one rule every request that names a job is judged by.

The owner is the person the kernel named when the job was submitted (SO_PEERCRED):
the same uid and the same name. An admin may act on anyone's job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuwarden.base.errors import UserError

if TYPE_CHECKING:
    from gpuwarden.service.identity import Person
    from gpuwarden.service.settings import Settings
    from gpuwarden.service.store import Job, Store


def mine(job: Job, who: Person) -> bool:
    """Whether `who` owns `job`: the same uid and the same name. A uid given to a new
    account after its old user left must not inherit the old user's jobs, commands
    and logs from the journal (an admin still sees them)."""
    return job.uid == who.uid and job.user == who.name


def owned(journal: Store, settings: Settings, who: Person, job_id: int, action: str) -> Job:
    """Job `job_id`, if `who` may `action` it (its owner or an admin); else a UserError
    naming the owner."""
    job = journal.get(job_id)
    if job is None:
        raise UserError(f"no job {job_id}")
    if not mine(job, who) and not settings.admins.include(who):
        raise UserError(
            f"job {job_id} belongs to {job.user}: only its owner or an admin may {action} it"
        )
    return job
