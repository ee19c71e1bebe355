"""Containers under a lease: the command line gpuwarden builds for Docker, Podman and
Apptainer, and a real Podman (runc, the local busybox image of scripts/containers-ci)
with stand-in /dev/nvidiaN nodes on the simulated server: the container opens exactly
its leased node, keeps the lease after its client is SIGKILLed, frees it when it ends,
stops on SIGTERM with its own exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from components import require
from gpuwarden.base.errors import UserError
from gpuwarden.containers import command
from gpuwarden.leases.holders import is_gone
from podmantools import IMAGE, PROBE, podman_ready
from repo import SRC
from waiting import wait_for

A = SimpleNamespace(uuid="GPU-aaaa", index=3, minor=3)
B = SimpleNamespace(uuid="GPU-bbbb", index=5, minor=7)


def _plan(argv: str, gpus=(A, B), **kw):  # type: ignore[no-untyped-def]
    return command.plan(argv.split(), list(gpus), "123-45", 1000, **kw)


def test_other_commands_are_left_alone() -> None:
    assert _plan("python train.py") is None
    assert _plan("podman ps -a") is None
    assert _plan("docker --log-level debug build .") is None


def test_podman_gets_the_leased_nodes_labels_and_the_lease_descriptors(tmp_path: Path) -> None:
    (tmp_path / "nvidiactl").touch()
    plan = _plan(
        "podman --log-level info run -it --rm img nvidia-smi -L", nfds=4, dev=str(tmp_path)
    )
    assert plan is not None and plan.name == "gpuwarden-123-45" and plan.preserve
    assert not plan.keeper
    added = plan.argv[4:-3]
    assert plan.argv[:4] == ["podman", "--log-level", "info", "run"]
    assert plan.argv[-5:] == ["-it", "--rm", "img", "nvidia-smi", "-L"]
    assert f"--device={tmp_path}/nvidia3:/dev/nvidia3" in added
    assert f"--device={tmp_path}/nvidia7:/dev/nvidia7" in added
    assert f"--device={tmp_path}/nvidiactl:/dev/nvidiactl" in added
    assert not any("nvidia-uvm" in a for a in added)  # not on this machine: not passed
    assert "--label=gpuwarden.lease=123-45" in added
    assert "--label=gpuwarden.user=1000" in added
    assert "--env=CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in added
    assert "--env=CUDA_DEVICE_ORDER=PCI_BUS_ID" in added
    assert "--env=NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb" in added
    assert "--preserve-fds=4" in added


def test_docker_uses_its_gpus_option_or_cdi_and_never_preserves_descriptors() -> None:
    plan = _plan("docker run --name mine -e X=1 img", nfds=4)
    assert plan is not None and plan.name == "mine" and not plan.preserve and plan.keeper
    assert plan.argv[2:4] == ["--gpus", '"device=GPU-aaaa,GPU-bbbb"']
    assert not any(a.startswith("--name=") for a in plan.argv)  # the user's name is kept
    cdi = _plan("docker container run img", cdi=True)
    assert cdi is not None
    assert cdi.argv[4:6] == ["--device=nvidia.com/gpu=GPU-aaaa", "--device=nvidia.com/gpu=GPU-bbbb"]


@pytest.mark.parametrize(
    "argv",
    [
        "docker run --gpus all img",
        "podman run --gpus=all img",
        "podman run --privileged img",
        "docker run --device /dev/nvidia0 img",
        "podman run --device=nvidia.com/gpu=all img",
        "docker run -e NVIDIA_VISIBLE_DEVICES=all img",
        "podman run --env CUDA_VISIBLE_DEVICES=0 img",
        "podman run -eNVIDIA_VISIBLE_DEVICES=all img",
    ],
)
def test_options_that_widen_the_container_are_refused(argv: str) -> None:
    with pytest.raises(UserError, match="outside its lease"):
        _plan(argv)


def test_words_after_the_image_are_the_containers_own() -> None:
    plan = _plan("podman run -v /a:/b img --gpus all --privileged")
    assert plan is not None and plan.argv[-3:] == ["--gpus", "all", "--privileged"]


def test_mig_devices_need_a_cdi_spec() -> None:
    mig = SimpleNamespace(uuid="MIG-1234", index=0, minor=0)
    with pytest.raises(UserError, match="CDI spec"):
        _plan("podman run img", gpus=[mig])
    plan = _plan("podman run img", gpus=[mig], cdi=True)
    assert plan is not None and "--device=nvidia.com/gpu=MIG-1234" in plan.argv


def test_apptainer_is_a_child_and_gets_its_env_variables() -> None:
    plan = _plan("apptainer exec --nv --cleanenv img.sif python x.py")
    assert plan is not None and plan.argv[1] == "exec" and plan.name is None
    assert plan.env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert plan.env["APPTAINERENV_CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_cdi_spec_is_found_where_nvidia_ctk_writes_it(tmp_path: Path) -> None:
    assert command.cdi_spec([str(tmp_path / "none"), str(tmp_path)]) is None
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    assert command.cdi_spec([str(tmp_path)]) == str(tmp_path / "nvidia.yaml")


# --- with a real podman -------------------------------------------------------------------------


@pytest.fixture
def podman(tmp_path: Path, sim, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stand-in nodes /dev/nvidia0..7 (major 195) in a folder passed as GPUWARDEN_DEV_DIR."""
    require(podman_ready(), f"podman (as root) with the image {IMAGE}: run scripts/containers-ci")
    sim("server-8xa100")
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor in range(8):
        os.mknod(dev / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    monkeypatch.setenv("GPUWARDEN_DEV_DIR", str(dev))
    return dev


def _run(*args: str, **kw):  # type: ignore[no-untyped-def]
    env = dict(os.environ, PYTHONPATH=str(SRC))
    cmd = [sys.executable, "-m", "gpuwarden", "run", *args]
    return subprocess.Popen(cmd, env=env, text=True, stderr=subprocess.PIPE, **kw)


def _leases() -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "status", "--json"],
        env=dict(os.environ, PYTHONPATH=str(SRC)),
        capture_output=True,
        text=True,
        check=True,
    )
    return [x for g in json.loads(out.stdout)["gpus"] for x in g["leases"]]


def _started(proc: subprocess.Popen[str], flags: Path) -> bool:
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
    return (flags / "started").exists()


def test_the_container_opens_exactly_its_leased_node(podman: Path) -> None:
    proc = _run(
        "--gpus",
        "3",
        "--",
        "podman",
        "run",
        "--rm",
        IMAGE,
        "sh",
        "-c",
        PROBE,
        stdout=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 7, err  # the container's own exit status
    lines = out.split()
    assert "nvidia3" in lines and "No" in lines  # it opens: ENXIO, the driver's absence
    assert [w for w in lines if w.startswith("nvidia")] == ["nvidia3"]
    assert [w for w in lines if w.startswith("CVD=")] == ["CVD=GPU-" + lines[-1].split("GPU-")[1]]
    assert _leases() == []


# `docker`'s command line run by podman, without Docker's NVIDIA runtime option: the
# keeper that holds a Docker container's lease runs `docker wait` through it.
DOCKER = """#!/bin/sh
skip=0
for a in "$@"; do
  shift
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in --gpus) skip=1; continue;; esac
  set -- "$@" "$a"
done
exec podman "$@"
"""


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_the_lease_outlives_a_killed_client_until_the_container_ends(
    podman: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    """Podman: the container's own processes hold the lease descriptors. Docker (played
    by podman behind a `docker` script): a keeper holds them until `docker wait` returns."""
    if runtime == "docker":
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "docker").write_text(DOCKER)
        (tmp_path / "bin" / "docker").chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    flags = tmp_path / "flags"
    flags.mkdir()
    script = "touch /f/started; while [ ! -e /f/go ]; do sleep 0.05; done"
    proc = _run(
        "--gpus",
        "2",
        "--",
        runtime,
        "run",
        "--rm",
        "-v",
        f"{flags}:/f",
        IMAGE,
        "sh",
        "-c",
        script,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _started(proc, flags), 60, "the container started")
        lease = wait_for(_leases, 60, "the lease is published")[0]
        client = int(lease["pid"])  # type: ignore[arg-type]
        os.kill(proc.pid, signal.SIGKILL)
        os.killpg(client, signal.SIGKILL)  # the podman client too: only the container is left
        proc.wait(timeout=30)
        wait_for(lambda: is_gone(client), 60, "the client is gone")
        held = _leases()
        assert [x["job"] for x in held] == [lease["job"]]  # still held, by the container
        refused = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "run", "--gpus", "2", "--", "true"],
            env=dict(os.environ, PYTHONPATH=str(SRC)),
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 75, refused.stderr
    finally:
        (flags / "go").touch()
    wait_for(lambda: _leases() == [], 60, "the lease is freed when the container ends")


def test_sigterm_stops_the_container_and_run_exits_with_its_status(
    podman: Path, tmp_path: Path
) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    script = 'trap "exit 9" TERM; touch /f/started; while :; do sleep 0.05; done'
    proc = _run(
        "--gpus", "1", "--", "podman", "run", "--rm", "-v", f"{flags}:/f", IMAGE, "sh", "-c", script
    )
    wait_for(lambda: _started(proc, flags), 60, "the container started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 9, proc.stderr.read() if proc.stderr else ""
    wait_for(lambda: _leases() == [], 60, "the lease is freed")


def test_a_containers_process_is_its_lease_s_and_one_started_alone_is_reported(
    podman: Path, tmp_path: Path
) -> None:
    """The process NVML would list (the container's, a child of conmon, not of `run`) is
    the lease's in `status`; a GPU container started without gpuwarden is unreserved
    use that `enforce` names as such."""
    from gpuwarden.sim import Machine

    flags = tmp_path / "flags"
    flags.mkdir()
    script = "touch /f/started; while [ ! -e /f/go ]; do sleep 0.05; done"
    volume = ["-v", f"{flags}:/f", IMAGE, "sh", "-c", script]
    proc = _run("--gpus", "4", "--", "podman", "run", "--rm", *volume)
    alone = f"gw-alone-{os.getpid()}"
    plain = ["podman", "run", "--rm", "-d", "--name", alone, *volume]
    try:
        wait_for(lambda: _started(proc, flags), 60, "the container started")
        job = wait_for(_leases, 60, "the lease is published")[0]["job"]
        subprocess.run(plain, check=True, capture_output=True)

        def host_pid(name: str) -> int:
            out = subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Pid}}", name],
                capture_output=True,
                text=True,
                check=True,
            )
            return int(out.stdout)

        leased, stray = host_pid(f"gpuwarden-{job}"), host_pid(alone)
        machine = Machine.open()
        machine.add_process(4, leased, "1GiB")
        machine.add_process(4, stray, "1GiB")
        env = dict(os.environ, PYTHONPATH=str(SRC))
        status = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        gpu = json.loads(status.stdout)["gpus"][4]
        assert stray in gpu["unleased_pids"] and leased not in gpu["unleased_pids"]
        found = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "enforce", "--once"],
            env=env,
            capture_output=True,
            text=True,
        )
        report = found.stdout + found.stderr
        assert f"pid {stray} " in report and "container started without gpuwarden" in report
        assert f"pid {leased} " not in report
    finally:
        (flags / "go").touch()
        subprocess.run(["podman", "rm", "-f", "-t", "0", alone], capture_output=True)
    assert proc.wait(timeout=60) == 0


CID = "c3f7c7cec12b2713e3d067ef26b3807c6799474055d7e54d984949f11743b405"


@pytest.mark.parametrize(
    "line, engine",
    [
        (f"5:devices:/libpod_parent/libpod-{CID}", "podman"),
        (f"0::/machine.slice/libpod-{CID}.scope/container", "podman"),
        (f"0::/system.slice/docker-{CID}.scope", "docker"),
        (f"4:memory:/docker/{CID}", "docker"),
        ("0::/user.slice/user-1000.slice/session-3.scope", None),
    ],
)
def test_the_container_of_a_process_comes_from_its_cgroup(
    tmp_path: Path, line: str, engine: str | None
) -> None:
    from gpuwarden.machine.ancestry import container_of

    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(line + "\n")
    assert container_of(42, str(tmp_path)) == (None if engine is None else (engine, CID))
    assert container_of(43, str(tmp_path)) is None


def test_a_container_label_counts_for_its_owner_or_for_root_only() -> None:
    from gpuwarden.usage.enforcement import Lease, Use, lease_of, owner

    alice = Lease("GPU-a", 100, "alice", "100-1")
    rootful = Use(7, "GPU-a", "root", container="100-1")
    assert lease_of(rootful, [alice]) is alice and owner(rootful, alice) == "alice"
    assert lease_of(Use(7, "GPU-a", "alice", container="100-1"), [alice]) is alice
    forged = Use(7, "GPU-a", "mallory", container="100-1")  # a rootless label is anyone's
    assert lease_of(forged, [alice]) is None and owner(forged, None) == "mallory"
    assert lease_of(Use(7, "GPU-b", "root", container="100-1"), [alice]) is None
    assert lease_of(Use(7, "GPU-a", "root", container=""), [alice]) is None


def test_views_show_a_rootful_containers_process_as_its_lease_owners() -> None:
    from gpuwarden.leases.attribution import attribute
    from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot

    procs = (
        GpuProcess(pid=99, used_memory=1, user="root"),
        GpuProcess(pid=98, used_memory=1, user="root"),
    )
    snap = Snapshot(taken_at=0.0, hostname="h", gpus=(Gpu(index=0, uuid="GPU-a", processes=procs),))
    lease = SimpleNamespace(uuid="GPU-a", pid=5, user="alice", job="5-1", mem=None)
    labels = {99: "5-1", 98: ""}  # 98: a GPU container started without gpuwarden
    shown = attribute(snap, [lease], lambda p: (p,), labels.get)
    assert [p.user for p in shown.gpus[0].processes] == ["alice", "root"]
    assert attribute(snap, [], lambda p: (p,), labels.get) is snap


def test_a_container_in_a_reserved_shell_gets_the_reserved_gpu(podman: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    gw = [sys.executable, "-m", "gpuwarden"]
    out = subprocess.run(
        [*gw, "reserve", "--gpus", "6"], env=env, capture_output=True, text=True, check=True
    ).stdout
    shell = dict(env)
    for line in out.splitlines():  # export NAME=VALUE lines for eval
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            shell[name] = value.strip("'\"")
    assert shell.get("GPUWARDEN_RESERVATION")
    try:
        run = subprocess.run(
            [*gw, "run", "--", "podman", "run", "--rm", IMAGE, "sh", "-c", PROBE],
            env=shell,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 7, run.stderr
        assert [w for w in run.stdout.split() if w.startswith("nvidia")] == ["nvidia6"]
        assert len(_leases()) == 1  # only the reservation's: the container ran under it
    finally:
        subprocess.run([*gw, "release"], env=shell, capture_output=True, check=True)


def test_apptainer_under_run_is_a_child_with_the_variables(
    tmp_path: Path, sim, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apptainer is not packaged here: a stand-in `apptainer` (what `exec --nv --cleanenv`
    would see: the APPTAINERENV_ variables, the lease descriptors it inherits as a child)
    shows what gpuwarden hands it."""
    sim("server-8xa100")
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "apptainer"
    script.write_text(
        "#!/bin/sh\n"
        'echo "inside=$APPTAINERENV_CUDA_VISIBLE_DEVICES order=$APPTAINERENV_CUDA_DEVICE_ORDER"\n'
        'ls -l /proc/$$/fd | grep -c "\\.lock$"\n'
        "exit 3\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    ran = cli(
        "run", "--gpus", "7", "--", "apptainer", "exec", "--nv", "--cleanenv", "x.sif", "nvidia-smi"
    )
    assert ran.returncode == 3, ran.stderr
    inside, locks = ran.stdout.split("\n")[:2]
    assert inside.startswith("inside=GPU-") and inside.endswith("order=PCI_BUS_ID")
    assert locks == "1"  # the lease's lock, inherited by the container's process


def test_the_idle_policy_releases_a_container_s_lease_by_stopping_it(
    podman: Path, tmp_path: Path
) -> None:
    """A container's PID 1 that ignores SIGTERM outlives the signal to its client's group,
    and holds the lease on: the enforcer stops the container itself."""
    from gpuwarden.leases import list_leases
    from gpuwarden.machine.inventory import read_snapshot
    from gpuwarden.monitoring.enforcer import Enforcer
    from gpuwarden.sim import Machine
    from gpuwarden.usage.enforcement import EnforceSettings

    flags = tmp_path / "flags"
    flags.mkdir()
    argv = ["podman", "run", "--rm", "--network=none", "--stop-timeout=1", "-v", f"{flags}:/f"]
    argv += [IMAGE, "sh", "-c", "touch /f/started; while :; do sleep 0.05; done"]
    proc = _run("--gpus", "6", "--", *argv)
    try:
        wait_for(lambda: _started(proc, flags), 60, "the container started")
        [lease] = wait_for(list_leases, 60, "the lease is published")
        out = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Pid}}", f"gpuwarden-{lease.job}"],
            capture_output=True,
            text=True,
            check=True,
        )
        Machine.open().add_process(6, int(out.stdout), "1GiB")  # idle: 0% all along
        enforcer = Enforcer(EnforceSettings(idle_after=60, idle_action="release"))
        first = enforcer.step(read_snapshot(), list_leases(), 0.0)
        assert [a for a in first if a.policy != "unleased"] == []  # the colleagues' use
        acts = enforcer.step(read_snapshot(), list_leases(), 61.0)
        acts = [a for a in acts if a.policy != "unleased"]
        assert [(a.policy, a.kind, a.index) for a in acts] == [("idle", "release", 6)]
        enforcer.carry_out(acts, 61.0)
        wait_for(lambda: list_leases() == [], 60, "the container is stopped and the lease freed")
        assert proc.wait(timeout=30) == 137  # stopped after its grace: SIGKILL
    finally:
        if proc.poll() is None:
            subprocess.run(["podman", "rm", "-f", "-t", "0", f"gpuwarden-{lease.job}"])
            proc.wait(timeout=30)
