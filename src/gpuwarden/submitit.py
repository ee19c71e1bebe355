"""submitit's executor for a lab server's queue service: `cluster="gpuwarden"`.

Python users drive sweeps with submitit (`executor.map_array`), which only knew Slurm
and the local machine. This module is a submitit plugin through submitit's own plugin
API (the `submitit` entry-point group in pyproject.toml names `GpuwardenExecutor` and
`GpuwardenJobEnvironment`), so the same code runs on a cluster and on the lab box:

    executor = submitit.AutoExecutor(folder, cluster="gpuwarden")   # or "slurm"
    executor.update_parameters(timeout_min=60, gpus_per_node=1,
                               slurm_array_parallelism=4, gpuwarden_array_parallelism=4)
    jobs = executor.map_array(train, configs)

Each job is a batch job of the queue service (docs/service.md), run as its submitter;
a `map_array` is one job array (docs/sweeps.md) with `array_parallelism` as its
throttle. The job runs `python -m gpuwarden.submitit FOLDER`, which reads the
pickled call as submitit's own runner does and leaves its result, or its exception's
traceback, where submitit's `Job.result()` reads it. States come from the service in
Slurm's words (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT), `cancel` is
the service's, and a checkpointable call is requeued when its time runs out: the job
signals itself (USR2, as Slurm's `--signal`) before its `--time`, submitit saves it,
and the service queues it again under the same id (`requeue`). A `preemptible` job
(docs/preemption.md) is sent USR2 by the service instead, at its preemption as before
its time: submitit saves it, and it resumes from its checkpoint when it runs again.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import typing as tp
from pathlib import Path

from submitit.core import core, job_environment, utils

#: Seconds before the time limit that a job signals itself to checkpoint (Slurm's
#: `--signal=USR2@90` that submitit asks for).
SIGNAL_DELAY_S = 90
#: Seconds between two reads of the service for `job.state`, `done()` and `wait()`.
#: submitit's own watcher waits up to 60 s between two `sacct` runs, which a cluster
#: must be spared; one `queue` and one `jobs` request to the local service cost
#: about a millisecond, so a state is never more than this old.
REFRESH_S = 0.5
#: States submitit takes for "not over yet" (core.InfoWatcher.is_done), in the words
#: the service uses for them.
_STATES = {"STARTING": "RUNNING", "LOST": "NODE_FAIL"}


def _socket() -> str:
    """The service's socket: the submitter's (passed to the job, whose environment has
    no GPUWARDEN_ variable of the submitter's), else the configured one."""
    from gpuwarden import config as cfg

    return os.environ.get("SUBMITIT_GPUWARDEN_SOCKET") or cfg.load({}).service_socket()


def _call(op: str, **fields: tp.Any) -> dict[str, tp.Any]:
    from gpuwarden.queueclient.client import require

    with require(_socket()) as client:
        return dict(client.call(op, **fields))


class GpuwardenInfoWatcher(core.InfoWatcher):
    """Job states from the queue service, for every job this process watches, in one
    `queue` and one `jobs` request (at most 1,024 ids each) per update."""

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s)
        self.ids: dict[str, int] = {}  # submitit's job id ("12", "12_3") -> the service's

    def _make_command(self) -> tp.Optional[list[str]]:
        return None  # `update` asks the service itself

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode=mode).get("State") or "UNKNOWN"

    def update_if_long_enough(self, mode: str) -> None:
        """As submitit's, but "standard" reads the service again once the last read is
        REFRESH_S old (submitit's own waits up to 60 s, its `sacct` delay): a job whose
        `result()` is back reads COMPLETED at once, not a minute later."""
        if mode == "standard" and time.time() - self._last_status_check > REFRESH_S:
            mode = "force"
        super().update_if_long_enough(mode)

    def update(self) -> None:
        names = {n: self.ids[n] for n in self._registered - self._finished if n in self.ids}
        self._num_calls += 1
        by_id = {v: k for k, v in names.items()}
        wanted = sorted(by_id)
        try:
            for start in range(0, len(wanted), 1000):
                chunk = wanted[start : start + 1000]
                rows = _call("queue", ids=chunk)["jobs"] + _call("jobs", ids=chunk)["jobs"]
                for row in rows:
                    name = by_id.get(row.get("id"))
                    if name is not None:
                        state = str(row.get("state"))
                        self._info_dict[name] = {"JobID": name, "State": _STATES.get(state, state)}
        except Exception as err:  # as submitit bypasses a failing sacct: the state may lag
            from submitit.core import logger

            logger.get_logger().warning(f"gpuwarden: status not read ({err})")
        self._last_status_check = time.time()
        for name in self._registered - self._finished:
            if self.is_done(name, mode="cache"):
                self._finished.add(name)


class GpuwardenJob(core.Job[core.R]):
    watcher = GpuwardenInfoWatcher(delay_s=60)

    def cancel(self, check: bool = True) -> None:
        """Cancel through the service (`gpuwarden cancel`): its owner may."""
        from gpuwarden.base.errors import UserError

        try:
            _call("cancel", jobs=[self.job_id if "_" in self.job_id else int(self.job_id)])
        except UserError:
            if check:
                raise


class GpuwardenJobEnvironment(job_environment.JobEnvironment):
    """Inside a job the service started: its ids from the service's variables."""

    _env: tp.ClassVar[dict[str, str]] = {
        "job_id": "GPUWARDEN_JOB",
        "array_job_id": "GPUWARDEN_ARRAY_JOB_ID",
        "array_task_id": "GPUWARDEN_ARRAY_TASK_ID",
        # One task on one machine: the variables are never set, so these are 1, 1, 0, 0.
        "num_tasks": "GPUWARDEN_SUBMITIT_NTASKS",
        "num_nodes": "GPUWARDEN_SUBMITIT_NNODES",
        "node": "GPUWARDEN_SUBMITIT_NODE",
        "global_rank": "GPUWARDEN_SUBMITIT_RANK",
        "local_rank": "GPUWARDEN_SUBMITIT_RANK",
    }

    def _requeue(self, countdown: int) -> None:
        """Queue this job again under its id once it exits (Slurm's `scontrol requeue`)."""
        name = self.job_id
        _call("requeue", job=int(os.environ[self._env["job_id"]]))
        from submitit.core import logger

        logger.get_logger().info(f"Requeued job {name} ({countdown} remaining timeouts)")


class GpuwardenExecutor(core.PicklingExecutor):
    """submitit's executor for the queue service of this machine (module docstring).

    Parameters (through `update_parameters`, or `gpuwarden_NAME` on an AutoExecutor):
    `timeout_min` (the job's `--time`), `gpus_per_node` (its `-g`), `array_parallelism`
    (how many tasks of a `map_array` run at once), `gpu_mem_gb` (a share of one GPU,
    `--mem`), `nice`, `signal_delay_s` (how long before its time a job checkpoints,
    90 s as on Slurm), `preemptible` (on idle GPUs, given back when needed: submitted
    `--preemptible`), `max_retries` (`--max-retries`). The generic `mem_gb`,
    `cpus_per_task` and `name` are accepted and not enforced (the service schedules
    GPUs); `nodes` and `tasks_per_node` must be 1.
    """

    job_class = GpuwardenJob

    def __init__(
        self,
        folder: tp.Union[str, Path],
        max_num_timeout: int = 3,
        max_pickle_size_gb: float = 1.0,
        python: tp.Optional[str] = None,
    ) -> None:
        super().__init__(
            folder, max_num_timeout=max_num_timeout, max_pickle_size_gb=max_pickle_size_gb
        )
        self.python = sys.executable if python is None else python
        self._throttling = 0.0  # the service takes a submit in milliseconds

    @classmethod
    def _equivalence_dict(cls) -> core.EquivalenceDict:
        return {
            "name": "name",
            "timeout_min": "timeout_min",
            "mem_gb": "mem_gb",
            "nodes": "nodes",
            "cpus_per_task": "cpus_per_task",
            "gpus_per_node": "gpus_per_node",
            "tasks_per_node": "tasks_per_node",
        }

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {
            "timeout_min",
            "gpus_per_node",
            "array_parallelism",
            "gpu_mem_gb",
            "nice",
            "name",
            "mem_gb",
            "cpus_per_task",
            "nodes",
            "tasks_per_node",
            "stderr_to_stdout",
            "signal_delay_s",
            "preemptible",
            "max_retries",
        }

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        unknown = sorted(set(kwargs) - self._valid_parameters())
        if unknown:
            raise ValueError(
                f"Unavailable parameter(s) for gpuwarden: {unknown}; valid: "
                f"{sorted(self._valid_parameters())}"
            )
        for name in ("nodes", "tasks_per_node"):
            if kwargs.get(name, 1) != 1:
                raise ValueError(f"gpuwarden runs one task on this machine: {name} must be 1")
        super()._internal_update_parameters(**kwargs)

    @classmethod
    def affinity(cls) -> int:
        """2 (a cluster) where a queue service's socket is there (`jobs.holding`'s test,
        the one every face takes), else -1; on a machine with both, Slurm's executor
        comes first (AutoExecutor keeps the first of a tie). A sweep driver inside one
        of the service's jobs submits to it too: a batch job holds no GPU of ours."""
        from gpuwarden.jobs.holding import service_at

        try:
            path = _socket()
        except Exception:  # a broken config must not break submitit for every executor
            return -1
        return 2 if service_at(path) else -1

    def _request(self, array: tp.Optional[str] = None) -> dict[str, tp.Any]:
        """The submit request for the pickled call(s) in `self.folder`."""
        from gpuwarden.placement.request import Request
        from gpuwarden.queueclient.client import job_fields

        params = self.parameters
        share = params.get("gpu_mem_gb")
        request = Request(
            count=int(params.get("gpus_per_node") or 0),
            mem=None if share is None else int(float(share) * (1 << 30)),
        )
        timeout_min = params.get("timeout_min")
        folder = str(self.folder)
        if array is not None:
            folder = folder.replace("%j", "%A_%a")
        argv = [self.python, "-u", "-m", "gpuwarden.submitit", str(self.folder)]
        fields = job_fields(
            request,
            argv,
            time_limit=None if timeout_min is None else float(timeout_min) * 60.0,
            nice=int(params.get("nice") or 0),
            output=os.path.join(folder, ("%A_%a" if array else "%j") + "_0_log.out"),
        )
        fields["env"]["SUBMITIT_EXECUTOR"] = self.name()
        fields["env"]["SUBMITIT_GPUWARDEN_SOCKET"] = _socket()
        delay = float(params.get("signal_delay_s", SIGNAL_DELAY_S))
        if params.get("preemptible"):
            # The service sends submitit's signal to the job's first process, at its
            # preemption and, with a --time, that long before it (no timer of its own).
            fields["preemptible"] = True
            fields["signal"] = {
                "number": int(GpuwardenJobEnvironment._usr_sig()),
                "before": delay,
                "batch": True,
            }
        elif timeout_min is not None:
            fields["env"]["SUBMITIT_GPUWARDEN_SIGNAL_AT"] = str(
                max(0.0, float(timeout_min) * 60.0 - delay)
            )
        if params.get("max_retries"):
            fields["max_retries"] = int(params["max_retries"])
        if array is not None:
            fields["array"] = array
        return fields

    def _submit_command(self, command: str) -> core.Job[tp.Any]:
        reply = _call("submit", **self._request())
        job: GpuwardenJob[tp.Any] = GpuwardenJob(folder=self.folder, job_id=str(reply["job"]))
        GpuwardenJob.watcher.ids[job.job_id] = int(reply["job"])
        return job

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job[tp.Any]]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        # A map_array: one array of the service, its throttle `array_parallelism`.
        import uuid

        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeout_min = self.parameters.get("timeout_min", 5)
        pickles = []
        for delayed in delayed_submissions:
            path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(timeout_min, self.max_num_timeout)
            delayed.dump(path)
            pickles.append(path)
        throttle = self.parameters.get("array_parallelism")
        spec = f"0-{len(pickles) - 1}" + (f"%{int(throttle)}" if throttle else "")
        reply = _call("submit", **self._request(spec))
        jobs: list[core.Job[tp.Any]] = []
        for task, (job_id, path) in enumerate(zip(reply["ids"], pickles)):
            name = f"{reply['job']}_{task}"
            GpuwardenJob.watcher.ids[name] = int(job_id)
            job: GpuwardenJob[tp.Any] = GpuwardenJob(folder=self.folder, job_id=name)
            job.paths.move_temporary_file(path, "submitted_pickle")
            jobs.append(job)
        return jobs

    @property
    def _submitit_command_str(self) -> str:
        return " ".join(
            [shlex.quote(self.python), "-u -m gpuwarden.submitit", shlex.quote(str(self.folder))]
        )

    def _num_tasks(self) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return ""  # nothing to write: the request goes to the service's socket

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return []

    @staticmethod
    def _get_job_id_from_submission_command(string: tp.Union[bytes, str]) -> str:
        return str(string)


def main(folder: str) -> None:
    """What a job runs: submitit's runner, with its error stream in submitit's `.err`
    file and, before the time limit, USR2 to itself so that a checkpointable call is
    saved and requeued (submitit's handler does both)."""
    import signal
    import threading

    env = GpuwardenJobEnvironment()
    paths = utils.JobPaths(folder, job_id=env.job_id, task_id=0)
    paths.folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    at = os.environ.get("SUBMITIT_GPUWARDEN_SIGNAL_AT")
    if at:
        sig, main_thread = env._usr_sig(), threading.main_thread().ident or 0
        timer = threading.Timer(float(at), lambda: signal.pthread_kill(main_thread, sig))
        timer.daemon = True
        timer.start()
    _refuse_unowned(paths.submitted_pickle)
    from submitit.core.submission import process_job

    process_job(folder)


def _refuse_unowned(pickle: Path, patience: float = 60.0) -> None:
    """Exit (one line in the job's `.err`) rather than unpickle a call that someone
    else could have written: a pickle not the submitter's, or below a directory others
    can write (docs/sweeps.md). Job ids are sequential, so in a folder others can write
    the next job's folder or pickle could be another user's, made in advance."""
    from gpuwarden.config.trust import owned_refusal

    deadline = time.monotonic() + patience  # submitit's runner waits as long
    while not os.path.lexists(pickle) and time.monotonic() < deadline:
        time.sleep(0.5)
    why = owned_refusal(str(pickle), "the submitted pickle")
    if why:
        print(f"gpuwarden.submitit: refusing to run the job: {why}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
