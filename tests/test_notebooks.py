"""Jupyter kernels under a lease, with the real jupyter_client and ipykernel: a kernel
started by `KernelManager` from the kernelspec `gpuwarden kernel install` writes holds a
lease in its own process, sees exactly its GPU, keeps it across a restart, and frees it
when shut down and when killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from components import require
from gpuwarden.leases import list_leases
from hermetic import hermetic
from waiting import wait_for


def _jupyter() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("jupyter_client", "ipykernel"))


@pytest.fixture
def kernels(tmp_path: Path, sim, cli, monkeypatch: pytest.MonkeyPatch) -> Path:
    require(_jupyter(), "jupyter_client and ipykernel (the test dependency group)")
    sim("server-8xa100")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    done = cli("kernel", "install", "-g", "1", "--exclude", "0,1,2,3,4,5")
    assert done.returncode == 0, done.stderr
    assert "'Python (1 GPU)' as gpuwarden-1gpu" in done.stdout
    return tmp_path / "jupyter" / "kernels" / "gpuwarden-1gpu" / "kernel.json"


def _visible(km) -> str:  # type: ignore[no-untyped-def]
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        out: list[str] = []

        def keep(msg) -> None:  # type: ignore[no-untyped-def]
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUWARDEN_JOB'])"
        kc.execute_interactive(code, output_hook=keep, timeout=60)
        return "".join(out).strip()
    finally:
        kc.stop_channels()


def test_a_kernel_leases_its_gpu_keeps_it_across_a_restart_and_frees_it(kernels: Path) -> None:
    from jupyter_client import KernelManager

    spec = json.loads(kernels.read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "gpuwarden"
    km = KernelManager(kernel_name="gpuwarden-1gpu")
    km.start_kernel()
    try:
        pid = km.provisioner.pid
        [lease] = list_leases()
        assert lease.pid == pid  # the kernel is the lease's job
        visible, job = _visible(km).split()
        assert visible in ("6", "7") and job == lease.job and str(lease.index) == visible
        km.restart_kernel(now=True)
        assert km.provisioner.pid != pid
        [again] = list_leases()
        assert (again.job, again.uuid) == (lease.job, lease.uuid)  # the same lease, kept
        assert again.pid == km.provisioner.pid
        assert _visible(km).split() == [visible, job]
    finally:
        km.shutdown_kernel(now=True)
    assert list_leases() == []


def test_a_killed_kernel_frees_its_gpu(kernels: Path) -> None:
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="gpuwarden-1gpu")
    km.start_kernel()
    try:
        [lease] = list_leases()
        os.kill(km.provisioner.pid, signal.SIGKILL)
        wait_for(lambda: list_leases() == [], 30, "the lease is freed")
        assert lease.pid == km.provisioner.pid
    finally:
        km.shutdown_kernel(now=True)


def test_a_kernel_that_finds_no_gpu_does_not_start(kernels: Path, cli) -> None:
    from jupyter_client import KernelManager

    from gpuwarden.base.errors import UserError

    kms = [KernelManager(kernel_name="gpuwarden-1gpu") for _ in range(3)]
    kms[0].start_kernel()
    kms[1].start_kernel()
    try:
        with pytest.raises(UserError, match="GPU"):
            kms[2].start_kernel()
        assert len(list_leases()) == 2
    finally:
        for km in kms[:2]:
            km.shutdown_kernel(now=True)
    assert list_leases() == []


@pytest.fixture
def service(tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The queue service, with a grace long enough for a kernel to shut down on a busy
    machine (the default is 30 s)."""
    from servicetools import serving

    yield from serving(tmp_path, open_dir, monkeypatch, "--grace", "20s")


def test_with_a_queue_service_a_kernel_holds_its_gpus_through_it(
    kernels: Path, service, cli, sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service owns the leases there: the kernel's GPUs are an allocation of the
    service (a job in its queue), kept across a restart while another user's job waits
    for them and across a restart of the service, and the allocation ends when the
    kernel is shut down or killed, and the kernel when the job is cancelled."""
    from jupyter_client import KernelManager

    from servicetools import attached_again, submit
    from users import make_user

    sim(service.spec)  # this process sees the service's machine
    done = cli("kernel", "install", "-g", "2", "--name", "two")  # 2 of the service's 4
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("GPUWARDEN_SOCKET", service.socket)
    for stop in ("shutdown", "kill", "cancel"):
        km = KernelManager(kernel_name="two")
        km.start_kernel()
        waiting = None
        try:
            visible, job = _visible(km).split()
            leases = wait_for(
                lambda: len(list_leases()) == 2 and list_leases(), 30, "the service's leases"
            )
            assert {lease.job for lease in leases} == {job}
            assert sorted(str(lease.index) for lease in leases) == sorted(visible.split(","))
            assert service.job(int(job))["state"] == "RUNNING"
            if stop == "shutdown":
                # Another user's job that needs 3 GPUs waits: 2 are the kernel's.
                waiting = submit(
                    service, make_user("bob"), ["/bin/sleep", "600"], request={"count": 3}
                )
                assert service.wait_state(waiting, ("PENDING",))["state"] == "PENDING"
                km.restart_kernel(now=True)
                assert _visible(km).split() == [visible, job]  # the same GPUs, the same job
                assert {lease.job for lease in list_leases()} == {job}
                assert service.job(waiting)["state"] == "PENDING"
            elif stop == "kill":
                os.kill(km.provisioner.pid, signal.SIGKILL)  # the kernel dies of itself
                wait_for(lambda: list_leases() == [], 30, "the allocation ends")
            else:  # the job cancelled (as the idle policy releases it): the kernel ends
                # A restart of the service is no end of the allocation: the kernel lives on.
                service.kill(signal.SIGKILL)
                service.start()
                attached_again(service, 1)
                assert _visible(km).split() == [visible, job]
                assert service.job(int(job))["state"] == "RUNNING"
                assert "error" not in service.call(None, "cancel", jobs=[int(job)])
                wait_for(lambda k=km: not k.is_alive(), 30, "the kernel ends")
        finally:
            km.shutdown_kernel(now=stop != "shutdown")
        state = service.wait_state(int(job), ("COMPLETED", "FAILED", "CANCELLED"))["state"]
        assert state == ("CANCELLED" if stop == "cancel" else "COMPLETED"), state
        if waiting is not None:  # the GPUs are free again: the waiting job gets them
            assert service.wait_state(waiting, ("RUNNING",))["state"] == "RUNNING"
            service.call(None, "cancel", jobs=[waiting])
            service.wait_state(waiting, ("CANCELLED",))
        wait_for(lambda: list_leases() == [], 30, "the leases are freed")


def test_the_kernelspec_says_what_was_asked_and_names_it() -> None:
    from gpuwarden.jupyter.kernelspec import default_name, display_name, spec

    kernel = spec({"n": 2, "model": "A100", "mem": None}, "/py", wait=True, timeout=60, uuid=True)
    config = kernel["metadata"]["kernel_provisioner"]["config"]
    assert config == {
        "request": {"n": 2, "model": "A100"},
        "uuid": True,
        "wait_for_gpus": True,
        "wait_timeout": 60,
    }
    assert kernel["argv"][:3] == ["/py", "-m", "ipykernel_launcher"]
    assert (default_name({"n": 2}), display_name({"n": 2})) == ("gpuwarden-2gpu", "Python (2 GPUs)")
    assert default_name({"mem": "10GiB"}) == "gpuwarden-10gib"
    assert display_name({"mem": "10GiB"}) == "Python (10GiB of a GPU)"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("-g", "99"), "asked for 99 GPUs but this machine has only 8 GPUs"),
        (("--model", "H100"), "does not match 'H100'"),
        (("--gpus", "12"), "unknown GPU '12': this machine has GPUs 0-7"),
    ],
)
def test_a_kernel_that_could_never_start_here_is_refused_at_install(
    tmp_path: Path, sim, cli, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], said: str
) -> None:
    """Every start of such a kernel would fail in the notebook: `kernel install` says so
    at once, in one line, and writes no kernelspec."""
    sim("server-8xa100")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))
    done = cli("kernel", "install", *args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert said in done.stderr
    assert not (tmp_path / "jupyter").exists()


#: A user's notebook: start the kernel `one`, print its pid and job, hold it until told.
USER_NOTEBOOK = r"""
import json, sys
from jupyter_client import KernelManager
km = KernelManager(kernel_name="one")
km.start_kernel()
try:
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    out = []
    keep = lambda m: m["msg_type"] == "stream" and out.append(m["content"]["text"])
    code = "import os; print(os.environ['GPUWARDEN_JOB'])"
    kc.execute_interactive(code, output_hook=keep, timeout=120)
    kc.stop_channels()
    print(json.dumps({"pid": km.provisioner.pid, "job": int("".join(out))}), flush=True)
    sys.stdin.readline()
finally:
    km.shutdown_kernel(now=True)
"""


def _users_venv(service, who) -> Path:  # type: ignore[no-untyped-def]
    """`who`'s own venv, made by them from the system Python, with Jupyter and this
    checkout installed (a copy they own: a build writes beside its sources)."""
    from repo import ROOT
    from servicetools import become

    home = service.work / who.name
    home.mkdir(mode=0o755)
    os.chown(home, who.uid, who.gid)
    source = home / "gpuwarden"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for path in (source, *source.rglob("*")):
        os.chown(path, who.uid, who.gid)
    env = {
        **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},  # the local index
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
    }
    venv = home / "venv"
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    for argv in (
        ["/usr/bin/python3", "-m", "venv", str(venv)],
        [*pip, "ipykernel", "jupyter_client", str(source)],
    ):
        made = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            preexec_fn=become(who),
            cwd=str(home),
        )
        require(made.returncode == 0, f"a venv with Jupyter from the package index: {made.stderr}")
    return venv


@pytest.mark.timeout(1200)  # a venv with Jupyter from the index, under load
def test_a_kernel_of_the_service_runs_inside_its_jobs_device_cgroup(service) -> None:
    """As a batch job's processes are: a user's kernel (a child of their Jupyter side,
    not of the job) is moved into its allocation's cgroup, where only its GPUs open.
    Nobody moves another's process, or a process not below the asker, into a job."""
    from gpuwarden.cgroups import hierarchy
    from servicetools import become
    from users import make_user

    mode, why = hierarchy.detect()
    require(mode != "none", f"no device isolation here ({why})")
    alice = make_user("alice", ("lab",))
    venv = _users_venv(service, alice)
    home = service.work / alice.name
    env = {
        **hermetic(),
        "HOME": str(home),
        "PATH": f"{venv}/bin:/usr/bin:/bin",
        "JUPYTER_DATA_DIR": str(home / "jupyter"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "GPUWARDEN_SOCKET": service.socket,
        "GPUWARDEN_SIM": service.spec,
        "GPUWARDEN_LEASE_DIR": os.environ["GPUWARDEN_LEASE_DIR"],
    }
    py = str(venv / "bin/python")
    as_alice = {"env": env, "cwd": str(home), "preexec_fn": become(alice), "text": True}
    installed = subprocess.run(
        [py, "-m", "gpuwarden", "kernel", "install", "-g", "1", "--name", "one"],
        capture_output=True,
        timeout=120,
        **as_alice,  # type: ignore[call-overload]
    )
    assert installed.returncode == 0, installed.stderr
    notebook = subprocess.Popen(
        [py, "-c", USER_NOTEBOOK],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        **as_alice,  # type: ignore[call-overload]
    )
    try:
        assert notebook.stdout is not None and notebook.stdin is not None
        line = notebook.stdout.readline()
        assert line, f"the kernel did not start\n{service.log_tail()}"
        kernel = json.loads(line)
        pid, job = int(kernel["pid"]), int(kernel["job"])
        assert service.job(job)["user"] == alice.name
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        ours = ":devices:" if mode == "cgroup-v1" else "0::"
        devices = [line for line in lines if ours in line]
        assert devices and all(f"/job-{job}" in line for line in devices), lines
        # Her own job, but a process of hers that is not below the asking one (the
        # kernel, asked for from another process of hers), or not hers at all.
        for other in (pid, service.proc.pid):
            refused = service.call(alice, "join", job=job, pid=other)
            assert "is not yours and below the asking process" in refused["error"], refused
        bob = make_user("bob")
        theirs = service.call(bob, "join", job=job, pid=pid)
        assert f"belongs to {alice.name}: only its owner or an admin" in theirs["error"], theirs
        held = service.call(alice, "submit", argv=["sleep", "60"], cwd=str(service.work), env={})
        service.wait_state(held["job"], ("RUNNING",))
        batch = service.call(alice, "join", job=held["job"], pid=os.getpid())
        assert "is not a running allocation" in batch["error"], batch
    finally:
        if notebook.stdin:
            notebook.stdin.close()  # the notebook shuts its kernel down
        notebook.wait(60)
