"""Job arrays in the queue service: one submit, many tasks, each an ordinary job.

A task is a row of the journal like any job (its own id, state, priority, fair share,
limits and backfill), with its array's id (the first task's id, as Slurm numbers an
array), its task id, its array's throttle and its `--param` values. So everything the
service does for a job it does for each task, a restart included: tasks running are
re-adopted and tasks waiting stay queued, none runs twice. What is particular to
arrays is here: expanding a submit into its tasks (`expand`, `add`), the throttle
(`throttled`, before each plan), the names `12` (the array) and `12_7` (one task) for
cancel, hold and unhold (`named`), the compact rows of `queue` (`grouped`) and the
variables a task starts with (`task_env`). The syntax is `gpuwarden.planning.arrayspec`'s.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Optional, Union

from gpuwarden.base.errors import UserError
from gpuwarden.planning import arrayspec
from gpuwarden.queueclient import protocol
from gpuwarden.service import arrayrows, store

#: Why a task waits while its array runs as many tasks as its throttle allows (Slurm's word).
THROTTLED = "JobArrayTaskLimit"


class Expansion(NamedTuple):
    """The tasks one submit asks for: their ids, the throttle, the swept parameters."""

    tasks: tuple[int, ...]
    throttle: Optional[int]
    params: tuple[arrayspec.Param, ...]


def expand(sub: protocol.Submit) -> Optional[Expansion]:
    """The array a submit asks for (None: a single job); every malformed spec one line."""
    if sub.array is None and not sub.params:
        return None
    if sub.attached or not sub.wait:
        raise UserError("an array is a batch of jobs: `gpuwarden submit --array`, not `run`")
    params = arrayspec.sweep(sub.params)
    if not params:
        spec = arrayspec.parse(sub.array or "")
        return Expansion(spec.tasks, spec.throttle, ())
    count = arrayspec.size(params)
    if count > arrayspec.MAX_TASKS:
        raise UserError(
            f"--param makes {count} combinations; the most an array may have is "
            f"{arrayspec.MAX_TASKS}"
        )
    throttle = None if sub.array is None else arrayspec.throttle_only(sub.array)
    return Expansion(tuple(range(count)), throttle, params)


def add(journal: store.Store, job: store.Job, array: Expansion) -> list[int]:
    """Journal `job` once per task of `array` (inside the caller's transaction); the
    tasks' job ids in task order, the first of them the array's id. Output paths get
    sbatch's patterns filled in; without `--output` a task writes
    `gpuwarden-%A_%a.out`, as sbatch's default for an array is `slurm-%A_%a.out`."""
    pattern = job.output or os.path.join(job.cwd, "gpuwarden-%A_%a.out")
    common = arrayrows.body(
        job.argv, job.env, job.request, job.cwd, job.after, pattern, array.params
    )
    shared = journal.share(common)  # once for all tasks (service.arrayrows)
    ids: list[int] = []
    for task in array.tasks:
        first = ids[0] if ids else None
        added = journal.add(
            replace(job, array_job=first, array_task=task, array_throttle=array.throttle),
            shared=shared,
        )
        ids.append(added.id)
        if first is None:
            journal.update(added.id, array_job=added.id)
    return ids


def output_of(job: store.Job) -> str:
    """A batch job's output path: `--output` with sbatch's patterns filled in (`%j` and
    `%A` its id, `%u` its user), or `gpuwarden-ID.out` in its working directory."""
    if job.output is None:
        return os.path.join(job.cwd, f"gpuwarden-{job.id}.out")
    return arrayspec.output_path(job.output, {"A": job.id, "j": job.id, "u": job.user})


def dependencies(journal: store.Store, after: Sequence[int]) -> tuple[int, ...]:
    """`--after` ids with an array's id standing for all its tasks (as Slurm's
    `afterok:ARRAY` waits for every task)."""
    ids: list[int] = []
    for dep in after:
        job = journal.get(dep)
        if job is not None and job.array_job == job.id:
            ids.extend(t.id for t in journal.tasks(dep))
        else:
            ids.append(dep)
    return tuple(dict.fromkeys(ids))


def throttled(
    pending: Sequence[store.Job], running: Sequence[store.Job]
) -> tuple[list[store.Job], list[store.Job]]:
    """The waiting jobs the plan may start, and the array tasks its throttle keeps back.

    An array with throttle T and R tasks running lets its first T - R waiting tasks (by
    task id, as Slurm starts them) into the plan; the plan may start them or not, but
    never more, so the throttle is never exceeded. A held task takes no place."""
    limits = {j.array_job: j.array_throttle for j in pending if j.array_throttle}
    if not limits:
        return list(pending), []
    busy = Counter(j.array_job for j in running if j.array_job in limits)
    room = {a: int(t or 0) - busy[a] for a, t in limits.items()}
    allowed: list[store.Job] = []
    kept: list[store.Job] = []
    for job in sorted(pending, key=lambda j: (j.array_task or 0, j.id)):
        if job.array_job not in room or job.held:
            allowed.append(job)
        elif room[job.array_job] > 0:
            room[job.array_job] -= 1
            allowed.append(job)
        else:
            kept.append(job)
    allowed.sort(key=lambda j: j.id)
    return allowed, kept


Name = Union[int, tuple[int, int]]


def named(journal: store.Store, name: Name) -> tuple[str, list[store.Job]]:
    """What a cancel, hold or unhold names, and its label: an array's id names its
    tasks not yet ended, `(12, 7)` task 7 of array 12, any other id that job."""
    if isinstance(name, tuple):
        array, task = name
        found = journal.tasks(array, task)
        if not found:
            raise UserError(f"no job {array}_{task}")
        return f"{array}_{task}", found
    job = journal.get(name)
    if job is None:
        raise UserError(f"no job {name}")
    if job.array_job != job.id:
        return label_of(job), [job]
    tasks = [t for t in journal.tasks(name) if t.state in store.ACTIVE]
    if not tasks:
        raise UserError(f"every task of array {name} has ended")
    return str(name), tasks


def label_of(job: store.Job) -> str:
    """`12_7` for a task, the id for any other job."""
    if job.array_job is None:
        return str(job.id)
    return f"{job.array_job}_{job.array_task}"


def grouped(jobs: Sequence[store.Job]) -> list[tuple[store.Job, tuple[int, ...]]]:
    """`queue`'s rows as squeue shows an array: its waiting tasks in one row (where the
    first of them is; held ones in another), each task that runs in a row of its own.
    Each row is a job and the task ids it stands for (none for a job that is not a
    waiting task)."""
    rows: list[tuple[store.Job, list[int]]] = []
    at: dict[tuple[int, bool], int] = {}
    for job in jobs:
        if job.state != store.PENDING or job.array_job is None:
            rows.append((job, []))
            continue
        key = (job.array_job, job.held)
        where = at.get(key)
        if where is None:
            at[key] = len(rows)
            rows.append((job, [int(job.array_task or 0)]))
        else:
            rows[where][1].append(int(job.array_task or 0))
    return [(job, tuple(tasks)) for job, tasks in rows]


def row_fields(job: store.Job, tasks: Sequence[int]) -> dict[str, Any]:
    """What a listing row adds for an array's task, or for its waiting tasks together."""
    if job.array_job is None:
        return {}
    fields: dict[str, Any] = {"array_job": job.array_job, "array_task": job.array_task}
    if job.array_throttle is not None:
        fields["array_throttle"] = job.array_throttle
    if tasks:
        fields["array_tasks"] = arrayspec.compact(tasks)
        fields["array_count"] = len(tasks)
        fields["label"] = arrayspec.label(job.array_job, tasks, job.array_throttle)
    else:
        fields["label"] = label_of(job)
    return fields


def task_env(journal: store.Store, job: store.Job) -> Mapping[str, str]:
    """The variables a task starts with: its array's and task's ids under gpuwarden's
    names and Slurm's (a script written for `sbatch --array` runs unchanged), and its
    `--param` values as GPUWARDEN_PARAM_NAME."""
    if job.array_job is None:
        return {}
    count, low, high = journal.array_span(job.array_job)
    env = {
        "GPUWARDEN_ARRAY_JOB_ID": str(job.array_job),
        "GPUWARDEN_ARRAY_TASK_ID": str(job.array_task),
        "GPUWARDEN_ARRAY_TASK_COUNT": str(count),
        "SLURM_ARRAY_JOB_ID": str(job.array_job),
        "SLURM_ARRAY_TASK_ID": str(job.array_task),
        "SLURM_ARRAY_TASK_COUNT": str(count),
        "SLURM_ARRAY_TASK_MIN": str(low),
        "SLURM_ARRAY_TASK_MAX": str(high),
    }
    for name, value in job.params.items():
        env[arrayspec.env_name(name)] = value
    return env
