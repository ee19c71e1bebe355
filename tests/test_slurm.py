"""The Slurm translation, parsing and mapping without a Slurm (pure functions and the
CLI's own refusals); tests/test_slurm_real.py runs them against a real Slurm."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.jobs import output
from gpuwarden.slurm import batch, gres, node, prolog, states, tools
from gpuwarden.slurm import logs as slurm_logs

# --- the batch script ------------------------------------------------------------------------


def test_script_turns_the_request_into_sbatch_options() -> None:
    spec = batch.spec_of(
        ["python", "train.py", "--lr", "0.1 0.2"],
        gpus="2",
        nodes="3",
        time="4h",
        mem="16GiB",
        output="out-%j.log",
        name="exp1",
    )
    text = batch.script(spec)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --gres=gpu:2" in lines
    assert "#SBATCH --nodes=3" in lines
    assert "#SBATCH --time=0-04:00:00" in lines
    assert "#SBATCH --mem=16384M" in lines
    assert "#SBATCH --output=out-%j.log" in lines
    assert "#SBATCH --job-name=exp1" in lines
    assert not any("ntasks" in line for line in lines)
    assert lines[-1] == "exec python train.py --lr '0.1 0.2'"


def test_ddp_starts_one_task_per_gpu_through_srun_under_the_same_python() -> None:
    spec = batch.spec_of(["examples/train.py", "--steps", "3"], gpus="4", ddp=True, python="/py")
    lines = batch.script(spec).splitlines()
    assert "#SBATCH --ntasks-per-node=4" in lines
    assert lines[-1] == "exec srun --kill-on-bad-exit=1 /py examples/train.py --steps 3"
    assert batch.srun_argv(spec) == [
        "srun",
        "--gres=gpu:4",
        "--ntasks-per-node=4",
        "/py",
        "examples/train.py",
        "--steps",
        "3",
    ]
    # `python -m pkg` and a plain program keep their form
    spec = batch.spec_of(["python3", "-m", "pkg.train"], gpus="2", ddp=True, python="/py")
    assert batch.launch_argv(spec)[-3:] == ["/py", "-m", "pkg.train"]
    spec = batch.spec_of(["./trainer", "x"], gpus="2", ddp=True, python="/py")
    assert batch.launch_argv(spec) == ["srun", "--kill-on-bad-exit=1", "./trainer", "x"]


def test_model_is_a_typed_gres_when_configured_else_a_node_feature() -> None:
    typed = batch.spec_of(["true"], gpus="2", model="A100", gpu_types=("a100", "h100"))
    assert batch.gres(typed) == "gpu:a100:2"
    assert typed.constraint is None
    feature = batch.spec_of(["true"], model="bigmem", constraint="ib|eth")
    assert batch.gres(feature) == "gpu:1"
    assert feature.constraint == "bigmem&ib|eth"
    assert batch.gres(batch.spec_of(["true"], gpus="0")) is None


@pytest.mark.parametrize(
    ("given", "slurm"),
    [
        ("90", "90"),
        ("1:30:00", "1:30:00"),
        ("2-00", "2-00"),
        ("2-12:30:00", "2-12:30:00"),
        ("UNLIMITED", "UNLIMITED"),
        ("30m", "0-00:30:00"),
        ("90s", "0-00:01:30"),
        ("2d", "2-00:00:00"),
    ],
)
def test_time_in_slurm_form(given: str, slurm: str) -> None:
    assert batch.slurm_time(given) == slurm


@pytest.mark.parametrize("junk", ["junk", "1:2:3:4", "-5", "0s", "3 hours", "1-"])
def test_time_junk_is_one_clear_line(junk: str) -> None:
    with pytest.raises(UserError, match="invalid --time"):
        batch.slurm_time(junk)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"gpus": "two"}, "invalid GPU count"),
        ({"nodes": "0"}, "invalid --nodes"),
        ({"mem": "lots"}, "invalid --mem"),
        ({"model": "a100; rm -rf /"}, "invalid --model"),
        ({"constraint": "a b"}, "invalid --constraint"),
        ({"partition": "x\ny"}, "invalid --partition"),
    ],
)
def test_bad_values_are_refused_before_slurm(kw: dict[str, str], match: str) -> None:
    with pytest.raises(UserError, match=match):
        batch.spec_of(["true"], **kw)  # type: ignore[arg-type]


def test_no_command_is_refused() -> None:
    with pytest.raises(UserError, match="no command"):
        batch.script(batch.spec_of([]))


# --- parsing Slurm's output ------------------------------------------------------------------


def test_queue_lines_map_states_and_reasons_to_the_queue_words() -> None:
    out = (
        "3|bob|PENDING|Resources|0:00|UNLIMITED|1|gres:gpu:2||wrap\n"
        "1|alice|RUNNING|None|1:02|1:00:00|1|gres:gpu:2|vm|a|b|c\n"
        "4|carol|PENDING|JobHeldUser|0:00|5:00|1|N/A||held\n"
        "5|dave|PENDING|ReqNodeNotAvail, UnavailableNodes:vm|0:00|5:00|1|(null)||x\n"
        "6|erin|COMPLETING|None|0:09|5:00|1|gres/gpu:1|vm|y\n"
        "7|finn|RUNNING|Prolog|0:03|5:00|1|gres/gpu:1|vm|z\n"
        "8|gus|COMPLETED|None|0:03|5:00|1|gres/gpu:1|vm|w\n"
        "squeue: warning: something\n"
    )
    jobs = tools.parse_queue(out)
    assert [(j.id, j.state, j.reason, j.gres) for j in jobs] == [
        ("3", "pending", "Resources", "gpu:2"),
        ("1", "running", "", "gpu:2"),
        ("4", "pending", "Held", ""),
        ("5", "pending", "Nodes", ""),
        ("6", "finishing", "", "gpu:1"),
        ("7", "starting", "Prolog", "gpu:1"),  # allocated, its prolog still running
        ("8", "done", "", "gpu:1"),  # ended: shown while Slurm keeps it (-t all)
    ]
    assert jobs[1].name == "a|b|c"  # the name is last: it may hold the separator


def test_state_and_reason_words() -> None:
    assert states.state_word("CANCELLED by 0") == "cancelled"
    assert states.state_word("OUT_OF_MEMORY") == "failed"
    assert states.state_word("WEIRD_NEW") == "weird_new"
    assert states.reason_word("Priority") == "Priority"
    assert states.reason_word("Dependency") == "Dependency"
    assert states.reason_word("JobHeldAdmin") == "Held"
    assert states.reason_word("None") == ""
    assert states.reason_word("SomethingNew") == "SomethingNew"


def test_parsable_submit_output() -> None:
    assert tools.parse_submitted("123\n") == "123"
    assert tools.parse_submitted("123;cluster\n") == "123"
    with pytest.raises(UserError, match="no job id"):
        tools.parse_submitted("sbatch: warning\n")


def test_scontrol_fields_may_hold_spaces() -> None:
    line = (
        "JobId=7 JobName=my job UserId=alice(1001) GroupId=alice(1001) JobState=RUNNING "
        "Reason=None Command=/bin/sh -c x StdOut=/tmp/a b/slurm-7.out Power="
    )
    info = tools.parse_show(line + "\n")
    assert info["JobName"] == "my job"
    assert info["StdOut"] == "/tmp/a b/slurm-7.out"
    assert info["Command"] == "/bin/sh -c x"
    assert slurm_logs._uid(info["UserId"]) == 1001


def test_slurm_error_text_is_one_line() -> None:
    text = "sbatch: error: Invalid --time specification\nsbatch: error: x\n"
    assert tools.slurm_text(text, "sbatch") == "Invalid --time specification; x"


def test_format_variables_are_removed() -> None:
    env = tools.clean_env({"SQUEUE_FORMAT": "%all", "SLURM_TIME_FORMAT": "relative", "A": "1"})
    assert env == {"A": "1"}


def test_missing_slurm_commands_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match=r"sbatch not found on PATH"):
        tools.submit("#!/bin/sh\ntrue\n")


@pytest.mark.parametrize("bad", ["12;rm", "-1", "abc", ""])
def test_job_ids_are_checked(bad: str) -> None:
    with pytest.raises(UserError, match="invalid Slurm job id"):
        tools.check_id(bad)


# --- gres.conf -------------------------------------------------------------------------------


def test_gres_lines_from_the_simulated_server(sim: object) -> None:
    sim("server-8xa100")  # type: ignore[operator]
    from gpuwarden.machine.inventory import read_snapshot

    snap = read_snapshot(processes=False, topology=True)
    devices = gres.read_devices(snap)
    assert [d.minor for d in devices] == list(range(8))
    lines = gres.gres_lines(snap, devices, dev_dir="/x/dev", gpu_type="a100")
    assert lines[0] == "Name=gpu Type=a100 File=/x/dev/nvidia0 Links=-1,12,12,12,12,12,12,12"
    assert lines[7].endswith("Links=12,12,12,12,12,12,12,-1")
    assert any("Cores= is left out" in n for n in gres.notes(devices))
    assert gres.node_line("vm.lab", 8, cpus=64, memory_mib=1000, gpu_type="a100") == (
        "NodeName=vm CPUs=64 RealMemory=1000 Gres=gpu:a100:8"
    )


def test_gres_falls_back_to_the_index_and_says_so() -> None:
    from types import SimpleNamespace

    devs = [gres.GresDevice(1, None, "8-15"), gres.GresDevice(0, None, "0-7")]
    assert gres.gres_lines(SimpleNamespace(nvlinks={}), devs) == [
        "Name=gpu File=/dev/nvidia0 Cores=0-7",
        "Name=gpu File=/dev/nvidia1 Cores=8-15",
    ]
    assert any("NVML index" in n for n in gres.notes(devs))


def test_cpu_list() -> None:
    assert gres.cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert gres.cpu_list([3]) == "3"


# --- prolog, drain ---------------------------------------------------------------------------


def test_job_gpus() -> None:
    assert prolog.job_gpus({"SLURM_JOB_GPUS": "0,2-3"}) == [0, 2, 3]
    assert prolog.job_gpus({}) == []
    with pytest.raises(UserError, match="SLURM_JOB_GPUS"):
        prolog.job_gpus({"SLURM_JOB_GPUS": "gpu0"})
    with pytest.raises(UserError, match="SLURM_JOB_ID"):
        prolog.job_id({"SLURM_JOB_ID": "../x"})


def test_prolog_holds_the_lease_after_it_returns_and_epilog_frees_it(sim: object) -> None:
    sim("server-8xa100")  # type: ignore[operator]
    from gpuwarden.leases import list_leases

    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "6,7"}
    assert "leased GPU 6,7" in prolog.prolog(env, timeout=1)
    held = list_leases()
    assert sorted(i.index for i in held) == [6, 7]
    assert {i.job for i in held} == {"slurm-42"}
    assert held[0].pid != os.getpid()  # a holder that outlives the prolog
    # the same GPUs again (a second job on them) wait, then fail with who holds them
    with pytest.raises(UserError, match=r"still leased locally after 0 s: GPU 6 \(\S+ pid"):
        prolog.prolog({"SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "6"}, timeout=0)
    assert "released GPU 6,7" in prolog.epilog(env)
    assert list_leases() == []
    assert "no leases held" in prolog.epilog(env)


def test_prolog_refuses_gpus_this_machine_lacks(sim: object) -> None:
    sim("server-8xa100")  # type: ignore[operator]
    with pytest.raises(UserError, match="GPU 8 of SLURM_JOB_GPUS is not on this machine"):
        prolog.prolog({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "7-8"}, timeout=0)


def test_drain_for_fault_only_when_configured() -> None:
    calls: list[tuple[str, str]] = []

    def drain(n: str, reason: str) -> None:
        calls.append((n, reason))

    off = {"slurm.drain_node": False}
    assert node.drain_for_fault(off, "3", "XID 79", drain=drain) is None
    assert calls == []
    on = {"slurm.drain_node": True, "slurm.node": "gpu07"}
    assert node.drain_for_fault(on, "3", "XID 79", drain=drain) == "gpu07"
    assert calls == [("gpu07", "gpuwarden: GPU 3: XID 79")]


# --- the output file -------------------------------------------------------------------------


def test_output_file_that_is_a_symlink_fifo_or_someone_elses_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.out"
    real.write_text("ok\n")
    fd = output.open_output(str(real), os.geteuid())
    os.close(fd)
    link = tmp_path / "link.out"
    link.symlink_to("/etc/shadow")
    with pytest.raises(UserError, match="symbolic link"):
        output.open_output(str(link), os.geteuid())
    fifo = tmp_path / "fifo.out"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        output.open_output(str(fifo), os.geteuid())
    if os.geteuid() == 0:
        os.chown(real, 12345, 12345)
        with pytest.raises(UserError, match="not to the job's user"):
            output.open_output(str(real), 4242)


# --- the CLI without Slurm -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("submit", "--", "true"),
        ("queue",),
        ("cancel", "12"),
        ("logs", "12"),
    ],
)
def test_local_queue_commands_say_the_service_is_missing(cli: object, argv: tuple[str]) -> None:
    done = cli(*argv)  # type: ignore[operator]
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"gpuwarden {argv[0]}: no gpuwarden service runs on this machine (")
    assert "gpuwarden serve" in line


@pytest.mark.parametrize("argv", [("queue",), ("run", "-g", "1", "--", "true")])
def test_a_socket_nobody_listens_on_is_called_a_stopped_service(
    cli: object, isolated: Path, argv: tuple[str, ...]
) -> None:
    """A service killed before it removed its socket: the socket says one was set up, so
    the line says it stopped (and how to find out why), not that there is none."""
    import socket

    path = isolated / "no-service.sock"  # GPUWARDEN_SOCKET in every test
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # bound, never listening: as a killed service leaves it
    done = cli(*argv)  # type: ignore[operator]
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert f"the gpuwarden service does not answer at {path} (stopped or crashed" in line
    assert "gpuwarden service status" in line


def test_submit_dry_run_prints_the_script(cli: object) -> None:
    done = cli("submit", "--slurm", "-g", "2", "--time", "1h", "--dry-run", "--", "echo", "hi")  # type: ignore[operator]
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --gres=gpu:2\n#SBATCH --time=0-01:00:00\nexec echo hi\n" in done.stdout
    array = cli("submit", "--slurm", "--array", "0-15:4%2", "--dry-run", "--", "true")  # type: ignore[operator]
    assert "#SBATCH --array=0-15:4%2\n" in array.stdout, array.stderr


def test_signal_is_slurms_own_in_the_form_that_reaches_the_command() -> None:
    """Without --ddp the batch script exec's the command, which has no step: `B:` reaches
    it. With --ddp the tasks are srun's step, which the plain form signals. srun has no
    batch script to name."""
    usr1 = {"number": 10, "before": 120.0, "batch": False}
    assert batch.slurm_signal(usr1, ddp=False, attached=False) == "B:10@120"
    assert batch.slurm_signal(usr1, ddp=True, attached=False) == "10@120"
    assert batch.slurm_signal(usr1, ddp=False, attached=True) == "10@120"
    assert batch.slurm_signal({**usr1, "batch": True}, ddp=True, attached=False) == "B:10@120"
    assert batch.slurm_signal(None, ddp=False, attached=False) is None
    with pytest.raises(UserError, match="has none"):
        batch.slurm_signal({**usr1, "batch": True}, ddp=False, attached=True)
    with pytest.raises(UserError, match="Slurm takes 65535 at most"):
        batch.slurm_signal({**usr1, "before": 70000.0}, ddp=False, attached=False)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (("submit", "--slurm", "--time", "junk", "--", "true"), "invalid --time 'junk'"),
        (("submit", "--slurm", "--min-free", "1G", "--", "true"), "--min-free chooses among"),
        (("run", "--slurm", "--mem", "1G", "--", "true"), "run --mem declares a share"),
        (("run", "--slurm", "--wait", "--", "true"), "--wait applies to this machine"),
        (("run", "--slurm", "--time", "5", "--signal", "B:USR1", "--", "true"), "names a batch"),
        (("submit", "--slurm", "--signal", "USR1", "--", "true"), "--signal needs --time"),
        (("submit", "--slurm", "--", "true"), "sbatch not found on PATH"),
        (("run", "--slurm", "--", "true"), "srun not found on PATH"),
        (("queue", "--slurm"), "squeue not found on PATH"),
    ],
)
def test_cli_errors_are_one_line(cli: object, argv: tuple[str], match: str) -> None:
    done = cli(*argv, env={"PATH": "/nonexistent"})  # type: ignore[operator]
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], done.stderr


def test_run_slurm_dry_run_is_the_srun_line(cli: object) -> None:
    done = cli("run", "--slurm", "-g", "2", "--ddp", "--dry-run", "--", "train.py")  # type: ignore[operator]
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"srun --gres=gpu:2 --ntasks-per-node=2 {sys.executable} train.py"
    )


def test_slurm_conf_on_the_simulated_server(cli: object, sim: object) -> None:
    sim("server-8xa100")  # type: ignore[operator]
    done = cli("slurm", "conf")  # type: ignore[operator]
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("Name=gpu File=/dev/nvidia") for line in lines) == 8
    assert lines[-1].startswith("NodeName=") and lines[-1].endswith("Gres=gpu:8")


def test_gres_takes_minor_and_affinity_from_the_snapshot_when_it_has_them() -> None:
    from types import SimpleNamespace

    gpus = [
        SimpleNamespace(index=0, minor=3, cpu_affinity=[0, 1, 2, 3]),
        SimpleNamespace(index=1, minor=2, cpu_affinity="4-7"),
    ]
    snap = SimpleNamespace(gpus=gpus, nvlinks={})
    devices = gres.read_devices(snap, nvml=object())  # NVML is not asked
    assert gres.gres_lines(snap, devices) == [
        "Name=gpu File=/dev/nvidia3 Cores=0-3",
        "Name=gpu File=/dev/nvidia2 Cores=4-7",
    ]


# --- one queue on a Slurm node: what holds a Slurm job in its prolog -------------------------


def _gpu(index: int, uuid: str = "") -> object:
    from types import SimpleNamespace

    return SimpleNamespace(index=index, uuid=uuid or f"GPU-{index}")


def _waiter(since: float, need: int = 1, allowed: object = None, user: str = "ann") -> object:
    from types import SimpleNamespace

    from gpuwarden.placement.request import Request

    key = f"{int(since * 1e9):020d}-{4242:08d}"  # the ticket's name: when it joined
    return SimpleNamespace(
        key=key, since=0.0, request=Request(count=need), allowed=allowed, user=user
    )


def test_a_drained_gpu_or_its_parent_holds_the_job_back() -> None:
    from types import SimpleNamespace

    drained = {"GPU-3": SimpleNamespace(reason="XID 79")}
    assert prolog.blockers([_gpu(2), _gpu(3)], drained, [], 10.0, 7, {}) == [
        "GPU 3 is drained (XID 79)"
    ]
    assert prolog.blockers([_gpu(2)], drained, [], 10.0, 7, {}) == []
    # a MIG slice of a drained GPU is held back too
    parents = {"MIG-a": "GPU-3"}
    assert prolog.blockers([_gpu(3, "MIG-a")], drained, [], 10.0, 7, parents) == [
        "GPU 3 is drained (XID 79)"
    ]


def test_a_local_waiter_first_in_line_goes_first() -> None:
    gpus = [_gpu(1)]
    said = prolog.blockers(gpus, {}, [_waiter(5.0)], 10.0, 8, {})
    assert said == ["ann's `gpuwarden run --wait` is first in line"]
    # one that joined after the job was allocated waits behind it
    assert prolog.blockers(gpus, {}, [_waiter(11.0)], 10.0, 8, {}) == []
    # one that could never be served (more GPUs than are in service) holds nothing
    assert prolog.blockers(gpus, {}, [_waiter(5.0, need=9)], 10.0, 8, {}) == []
    # one whose CUDA_VISIBLE_DEVICES leaves it other GPUs only is no reason to wait
    assert prolog.blockers(gpus, {}, [_waiter(5.0, allowed=("GPU-0",))], 10.0, 8, {}) == []


def test_prolog_waits_then_leases_and_clears_its_note(tmp_path: Path) -> None:
    """_hold: reasons are noted once each, the lease is taken when none is left, and
    the note is cleared; a job that ended meanwhile is left alone."""
    from gpuwarden.leases import dir as leasedir

    ld = leasedir.open_dir(str(tmp_path))
    answers = [["GPU 3 is drained (x)"], ["GPU 3 is drained (x)"], []]
    notes: list[str] = []
    held = prolog._hold(
        ld, "slurm-9", [_gpu(3)], 30.0, waiting=lambda: answers.pop(0), note=notes.append
    )
    try:
        assert held is not None and notes == ["GPU 3 is drained (x)", ""]
    finally:
        held.release()
    gone = prolog._hold(
        ld, "slurm-10", [_gpu(3)], 30.0, waiting=lambda: ["x"], note=notes.append, gone=lambda: True
    )
    assert gone is None


def test_running_jobs_on_drained_gpus_are_found_from_root_leases_only() -> None:
    from types import SimpleNamespace

    from gpuwarden.slurm import annotate

    def lease(job: str, uuid: str, user: str = "root", index: int = 3) -> object:
        return SimpleNamespace(job=job, uuid=uuid, user=user, index=index)

    found = annotate.on_drained(
        [
            lease("slurm-7", "GPU-3"),
            lease("slurm-8", "GPU-3", user="mallory"),  # anyone may name a lease so
            lease("slurm-9", "GPU-4", index=4),  # not drained
            lease("run-5", "GPU-3"),
        ],
        {"GPU-3": object()},
        "root",
    )
    assert found == {"7": [3]}


# --- jobs --slurm ----------------------------------------------------------------------------


def test_sacct_and_scontrol_history_map_to_the_local_columns() -> None:
    from gpuwarden.slurm import history

    sacct = (
        "12|alice|FAILED|1:0|65|2026-12-02T13:55:25|billing=1,cpu=1,gres/gpu=2,node=1|a|b\n"
        "13|bob|CANCELLED by 0|0:15|3|2026-12-02T13:56:00|cpu=1|x\n"
    )
    jobs = history.parse_sacct(sacct)
    assert [(j["id"], j["state"], j["exit_code"], j["signal"], j["count"]) for j in jobs] == [
        ("12", "failed", 1, None, 2),
        ("13", "cancelled", None, 15, 0),
    ]
    assert jobs[0]["command"] == ["a|b"] and jobs[0]["elapsed"] == 65.0
    line = (
        "JobId=5 JobName=wrap UserId=carol(1003) JobState=COMPLETED Reason=None ExitCode=0:0 "
        "RunTime=1-00:00:05 EndTime=2026-12-02T13:55:25 NumNodes=2 TRES=cpu=2,node=2 "
        "Command=/home/carol/x.sh StdOut=/tmp/o TresPerNode=gres:gpu:2\n"
        "JobId=6 JobName=run UserId=dan(1004) JobState=RUNNING ExitCode=0:0 RunTime=00:01 "
        "EndTime=Unknown NumNodes=1 Command=(null)\n"
    )
    jobs = history.parse_scontrol(line)
    assert jobs[0]["user"] == "carol" and jobs[0]["count"] == 4 and jobs[0]["exit_code"] == 0
    assert jobs[0]["elapsed"] == 86405.0 and jobs[0]["command"] == ["/home/carol/x.sh"]
    assert jobs[1]["state"] == "running" and jobs[1]["ended"] is None
    assert jobs[1]["command"] == ["run"]  # no script: the name


def test_history_reads_the_controller_where_no_slurmdbd_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuwarden.slurm import history

    asked: list[str] = []

    def call(argv: list[str], **_: object) -> tools.Done:
        asked.append(argv[0])
        if argv[0] == "sacct":
            raise UserError("sacct failed: Slurm accounting storage is disabled")
        return tools.Done(
            0,
            "JobId=5 UserId=c(1) JobState=COMPLETED ExitCode=0:0 RunTime=00:00:01 "
            "EndTime=2026-12-02T13:55:25\nJobId=6 UserId=c(1) JobState=RUNNING\n",
            "",
        )

    monkeypatch.setattr(tools, "call", call)
    jobs, source = history.ended_jobs(None, 10)
    assert source == "scontrol" and asked == ["sacct", "scontrol"]
    assert [j["id"] for j in jobs] == ["5"]  # the running one is not history


# --- logs: both files ------------------------------------------------------------------------


def test_a_separate_stderr_file_is_a_second_stream() -> None:
    same = {"StdOut": "/o/slurm-1.out", "StdErr": "/o/slurm-1.out"}
    assert [p for p, _ in slurm_logs.streams(same)] == ["/o/slurm-1.out"]
    both = {"StdOut": "/o/1_0_log.out", "StdErr": "/o/1_0_log.err"}
    assert [(p, to) for p, to in slurm_logs.streams(both)] == [
        ("/o/1_0_log.out", sys.stdout.buffer),
        ("/o/1_0_log.err", sys.stderr.buffer),
    ]
    assert slurm_logs.streams({"StdOut": "/dev/null", "StdErr": "/dev/null"}) == []


# --- MIG gres lines --------------------------------------------------------------------------


def test_mig_devices_get_typed_multiplefiles_lines(sim: object, tmp_path: Path) -> None:
    from gpuwarden.slurm import miggres

    sim("mixed")  # type: ignore[operator]
    from gpuwarden.machine.inventory import read_snapshot

    snap = read_snapshot(processes=False, topology=True)
    devices = gres.read_devices(snap)
    table = tmp_path / "mig-minors"
    table.write_text("config 1\nmonitor 2\ngpu3/gi1/access 390\ngpu3/gi1/ci0/access 391\n")
    lines = gres.gres_lines(snap, devices, dev_dir="/d", mig_minors=miggres.read_minors(str(table)))
    assert lines[:3] == [
        "Name=gpu Type=t4 File=/d/nvidia0",
        "Name=gpu Type=v100 File=/d/nvidia1",
        "Name=gpu Type=rtx_a6000 File=/d/nvidia2",
    ]
    caps = "/d/nvidia-caps/nvidia-cap"
    assert lines[3] == (
        f"Name=gpu Type=a100_3g.40gb MultipleFiles=/d/nvidia3,{caps}390,{caps}391"
    )  # from the driver's table
    # where the table does not say: the driver's rule (gpu 3, gi 2 -> 3 + 405 + 18)
    assert lines[4] == (f"Name=gpu Type=a100_2g.20gb MultipleFiles=/d/nvidia3,{caps}426,{caps}427")
    assert [x.split()[1] for x in lines[5:]] == ["Type=a100_1g.10gb"] * 2
    assert miggres.counts(lines) == (
        "gpu:t4:1,gpu:v100:1,gpu:rtx_a6000:1,gpu:a100_3g.40gb:1,gpu:a100_2g.20gb:1,"
        "gpu:a100_1g.10gb:2"
    )
    assert miggres.counts(["Name=gpu File=/d/nvidia0"] * 2) == "gpu:2"
    assert miggres.read_minors(str(tmp_path / "absent")) is None
    # and the prolog's positions are the same list's (SLURM_JOB_GPUS=5 -> a 1g.10gb slice)
    units = prolog.slurm_devices(snap)
    assert len(units) == len(lines) and units[5].uuid.startswith("MIG-")
