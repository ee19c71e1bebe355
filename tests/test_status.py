"""`gpuwarden status`: the table, the versioned JSON, CUDA marks, no-driver and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from waiting import wait_for

SRC = Path(__file__).resolve().parent.parent / "src"


def test_table_shows_every_gpu_with_processes_and_health(sim, cli):
    sim("server-8xa100")
    out = cli("status")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "550.54.15" in lines[0] and "12.4" in lines[0]
    rows = [ln for ln in lines if ln.lstrip()[:1].isdigit()]
    assert len(rows) == 8
    assert "alice(71.0GiB)" in rows[0] and "71.0GiB / 80.0GiB" in rows[0]
    assert "remap-pending" in rows[6]
    assert "carol(30.0GiB)" in rows[5]


def test_json_schema_1(sim, cli):
    sim("server-8xa100")
    out = cli("status", "--json")
    data = json.loads(out.stdout)
    assert data["schema"] == 1 and data["source"] == "sim:server-8xa100"
    assert data["cuda_driver_version"] == "12.4"
    g = data["gpus"][0]
    assert g["memory_total"] == 81920 * 2**20 and g["compute_capability"] == "8.0"
    assert g["processes"][0]["user"] == "alice"
    assert g["health"]["level"] == "ok" and g["drain"] is None and g["leases"] == []
    assert data["gpus"][6]["health"]["findings"][0]["code"] == "remap-pending"


def test_cuda_visible_devices_marks_cuda_indices(sim, cli):
    sim("server-8xa100")
    env = {"CUDA_VISIBLE_DEVICES": "5,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    data = json.loads(cli("status", "--json", env=env).stdout)
    assert {g["index"]: g["cuda_index"] for g in data["gpus"] if g["cuda_index"] is not None} == {
        5: 0,
        2: 1,
    }
    text = cli("status", env=env).stdout
    row5 = next(ln for ln in text.splitlines() if ln.startswith("  5"))
    assert row5.split()[1] == "0"


def test_no_driver_one_line_exit_0(sim, cli):
    sim("laptop-none")
    out = cli("status")
    assert out.returncode == 0
    assert out.stdout.strip() == "no NVIDIA driver found (libnvidia-ml.so.1 not loadable); CPU only"
    data = json.loads(cli("status", "--json").stdout)
    assert data["gpus"] == [] and "no NVIDIA driver" in data["error"]


def test_unknown_spec_is_one_line(cli):
    out = cli("--sim", "nope", "status")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "server-8xa100" in out.stderr


def test_lost_gpu_shown(sim, cli):
    sim("server-8xa100")
    assert cli("sim", "inject", "lose", "--gpu", "3").returncode == 0
    text = cli("status").stdout
    row = next(ln for ln in text.splitlines() if ln.startswith("  3"))
    assert "LOST" in row and "n/a" in row


def test_occupy_shows_up_and_goes_away(sim, cli):
    sim("workstation-3x3090")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    args = ["sim", "occupy", "--gpu", "2", "--mem", "8GiB", "--util", "40", "--user", "zoe"]
    occupy = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", *args, "--", *sleep],
        env=env,
    )
    try:

        def occupied() -> Optional[dict[str, Any]]:
            gpu = json.loads(cli("status", "--json").stdout)["gpus"][2]
            return gpu if gpu["processes"] else None

        gpu = wait_for(occupied, 20, "the occupying process on GPU 2 in `status --json`", 0.2)
        assert gpu["processes"][0]["user"] == "zoe"
        assert gpu["memory_used"] == 8 * 2**30 and gpu["utilization_gpu"] == 40
    finally:
        occupy.send_signal(signal.SIGINT)
        occupy.wait(timeout=20)
    gpu = json.loads(cli("status", "--json").stdout)["gpus"][2]
    assert gpu["processes"] == [] and gpu["memory_used"] == 0


def _watch(args: list[str], stdout: object, until: str, read: object) -> str:
    """Run `status --watch 0.2 ARGS` until `until` shows up twice in what `read` returns
    (generous deadline), then Ctrl-C it; everything it wrote."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "status", "--watch", "0.2", *args],
        env=env,
        stdout=stdout,
    )
    got: list[str] = []

    def twice() -> bool:
        assert proc.poll() is None, f"status --watch ended ({proc.returncode}): {''.join(got)!r}"
        got.append(read())  # type: ignore[operator]
        return "".join(got).count(until) >= 2

    try:
        wait_for(
            twice,
            30,
            lambda: f"{until!r} twice in what status --watch wrote: {''.join(got)[-2000:]!r}",
        )
        out = "".join(got)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        out += read()  # type: ignore[operator]
    finally:
        if proc.poll() is None:
            proc.kill()
    return out


def test_watch_refreshes_a_terminal_in_place_and_ctrl_c_exits_0(sim):
    import pty
    import select

    sim("workstation-3x3090")
    main, child = pty.openpty()

    def read() -> str:
        ready, _, _ = select.select([main], [], [], 0.2)
        try:
            return os.read(main, 65536).decode() if ready else ""
        except OSError:  # the child closed its end
            return ""

    try:
        out = _watch([], child, "\x1b[H\x1b[2J", read)
    finally:
        os.close(child)
        os.close(main)
    assert out.count("\x1b[H\x1b[2J") >= 2 and "RTX 3090" in out


def _tail(path: Path):  # type: ignore[no-untyped-def]
    """A reader of what was appended to `path` since the last call."""
    seen = [0]

    def read() -> str:
        data = path.read_bytes()[seen[0] :]
        seen[0] += len(data)
        return data.decode()

    return read


def test_watch_into_a_file_writes_plain_frames(sim, tmp_path: Path):
    sim("workstation-3x3090")
    path = tmp_path / "frames.txt"
    with open(path, "w") as sink:
        out = _watch([], sink, "--- ", _tail(path))
    assert "\x1b" not in out
    frames = [f for f in out.split("\n\n") if f.strip()]
    assert len(frames) >= 2
    for frame in frames:
        assert frame.startswith("--- ") and "RTX 3090" in frame


def test_watch_json_into_a_pipe_writes_one_document_per_line(sim, tmp_path: Path):
    sim("workstation-3x3090")
    path = tmp_path / "frames.jsonl"
    with open(path, "w") as sink:
        out = _watch(["--json"], sink, "\n", _tail(path))
    lines = out.splitlines()
    assert len(lines) >= 2 and "\x1b" not in out
    assert all(json.loads(line)["schema"] == 1 for line in lines)


def test_watch_rejects_nonpositive(sim, cli):
    sim("workstation-3x3090")
    out = cli("status", "--watch", "0")
    assert out.returncode == 2 and "positive" in out.stderr


def test_power_and_fan_columns_and_json(sim, cli):
    sim("workstation-3x3090")
    assert cli("sim", "set", "--gpu", "1", "power=342.4", "fan=78").returncode == 0
    lines = cli("status").stdout.splitlines()
    assert lines[1].split()[:7] == ["GPU", "NAME", "TEMP", "FAN", "POWER", "UTIL", "MEMORY"]
    row = next(ln for ln in lines if ln.startswith("  1"))
    assert " 78% " in row and " 342/350W " in row
    gpu = json.loads(cli("status", "--json").stdout)["gpus"][1]
    assert (gpu["fan_speed"], gpu["power_draw"], gpu["power_limit"]) == (78, 342.4, 350.0)


def test_a_card_without_a_fan_shows_n_a(sim, cli):
    sim("server-8xa100")  # data-centre cards: nvmlDeviceGetFanSpeed is NotSupported
    lines = cli("status").stdout.splitlines()
    fan = lines[1].split().index("FAN")
    assert lines[2].split()[fan] == "n/a"
    assert json.loads(cli("status", "--json").stdout)["gpus"][0]["fan_speed"] is None


def test_power_column_formats():
    from gpuwarden.cli.statustable import _power

    assert _power(61.6, 400.0) == "62/400W"
    assert _power(None, 400.0) == "n/a/400W"
    assert _power(61.6, None) == "62W"
    assert _power(None, None) == "n/a"


def _reserve(cli, *args: str) -> str:
    r = cli("reserve", *args)
    assert r.returncode == 0, r.stderr
    return next(
        line.split("=", 1)[1].strip("'\"")
        for line in r.stdout.splitlines()
        if line.startswith("export GPUWARDEN_RESERVATION=")
    )


def test_lease_rows_show_job_user_age_and_expiry(sim, cli):
    from gpuwarden.files.paths import user_name

    sim("server-8xa100")
    rid = _reserve(cli, "-g", "2", "--for", "1h")
    try:
        text = cli("status").stdout
        data = json.loads(cli("status", "--json").stdout)
    finally:
        assert cli("release", rid).returncode == 0
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("LEASE "))
    assert lines[head].split() == ["LEASE", "USER", "JOB", "PID", "AGE", "EXPIRES", "COMMAND"]
    rows = [ln.split() for ln in lines[head + 1 : head + 3]]
    me = user_name()
    for row in rows:
        assert row[0] == "GPU" and row[2] == me and row[3] == rid
        assert row[6] == "in" and row[7].startswith(("59m", "1h00m"))  # --for 1h
    held = [(g["index"], x) for g in data["gpus"] for x in g["leases"]]
    assert len(held) == 2 and {f"GPU {i}" for i, _ in held} == {" ".join(r[:2]) for r in rows}
    for _, lease in held:
        assert lease["job"] == rid and lease["user"] == me
        assert 0 <= lease["age"] < 60 and 3500 < lease["expires"] - data["taken_at"] <= 3600


def test_user_narrows_gpus_processes_and_leases(sim, cli):
    from gpuwarden.files.paths import user_name

    sim("server-8xa100")
    data = json.loads(cli("status", "--json", "--user", "carol").stdout)
    assert data["user"] == "carol" and [g["index"] for g in data["gpus"]] == [5]
    assert {p["user"] for p in data["gpus"][0]["processes"]} == {"carol"}
    alice = cli("status", "--user", "alice").stdout
    rows = [ln for ln in alice.splitlines() if ln.lstrip()[:1].isdigit()]
    assert [r.split()[0] for r in rows] == ["0", "1", "2", "3"]
    assert "bob" not in alice and "carol" not in alice
    rid = _reserve(cli, "-g", "1", "--for", "1h")
    try:
        mine = json.loads(cli("status", "--json", "--user", user_name()).stdout)
        theirs = cli("status", "--user", "bob").stdout
    finally:
        assert cli("release", rid).returncode == 0
    assert len(mine["gpus"]) == 1 and mine["gpus"][0]["processes"] == []
    assert [x["job"] for x in mine["gpus"][0]["leases"]] == [rid]
    assert rid not in theirs  # bob sees only his own GPU 4, and no lease table
    assert not any(ln.startswith("LEASE ") for ln in theirs.splitlines())
    assert [ln.split()[0] for ln in theirs.splitlines() if ln.lstrip()[:1].isdigit()] == ["4"]


def test_user_with_nothing_or_nobody(sim, cli):
    sim("server-8xa100")
    out = cli("status", "--user", "root")
    assert out.returncode == 0 and out.stdout.strip() == "root holds no GPU, process or lease here"
    assert json.loads(cli("status", "--json", "--user", "root").stdout)["gpus"] == []
    for name, words in (("no-such-user-x", "no user 'no-such-user-x'"), ("", "needs a user name")):
        out = cli("status", "--user", name)
        assert out.returncode != 0 and out.stderr.count("\n") == 1 and words in out.stderr


def test_lease_rows_for_shared_expired_and_job_bound_leases():
    from gpuwarden.cli.status import Status, for_user
    from gpuwarden.cli.statustable import _lease_rows
    from gpuwarden.leases import LeaseInfo
    from gpuwarden.machine.inventory import Gpu, GpuProcess, Snapshot
    from gpuwarden.monitoring.machineview import MachineView

    gpus = (
        Gpu(index=0, uuid="GPU-a", processes=(GpuProcess(pid=1, used_memory=None, user="ann"),)),
        Gpu(index=1, uuid="GPU-b", processes=(GpuProcess(pid=2, used_memory=None, user="ben"),)),
    )
    snap = Snapshot(taken_at=1000.0, hostname="h", gpus=gpus)
    leases = [
        LeaseInfo("GPU-b", "ann", 7, "train", 400.0, mem=20 << 30, job="17"),
        LeaseInfo("GPU-a", "ann", 8, "", 990.0, expires=999.0),
    ]
    rows = _lease_rows(snap, leases)
    assert rows[0] == ["GPU 1 shared 20.0GiB", "ann", "17", "7", "10m00s", "with job", "train"]
    assert rows[1] == ["GPU 0", "ann", "-", "8", "10s", "now", "-"]
    data = Status(MachineView(snap, leases=tuple(leases)))
    ann = for_user(data, "ann").machine
    assert [g.index for g in ann.snapshot.gpus] == [0, 1]  # a process on 0, a lease on 1
    assert ann.snapshot.gpus[1].processes == ()  # ben's process is not ann's
    ben = for_user(data, "ben")
    assert [g.index for g in ben.machine.snapshot.gpus] == [1] and ben.machine.leases == ()
    assert ben.user == "ben"


def test_status_reads_the_configuration_once_and_its_directories_count(
    sim, tmp_path: Path, monkeypatch
) -> None:
    """One reading of the configuration names the lease and state directories and the
    health rules and who sees others' commands: a drain in the state directory of the
    config file shows, and nothing below `gather` reads the configuration again."""
    from gpuwarden import config
    from gpuwarden.cli import status
    from gpuwarden.health import drain

    sim("server-8xa100")
    state = tmp_path / "its-state"
    (tmp_path / "xdg" / "gpuwarden").mkdir(parents=True)
    conf = tmp_path / "xdg" / "gpuwarden" / "config.toml"
    conf.write_text(f'[state]\ndir = "{state}"\n[lease]\ndir = "{tmp_path / "its-leases"}"\n')
    monkeypatch.delenv("GPUWARDEN_STATE_DIR", raising=False)
    monkeypatch.delenv("GPUWARDEN_LEASE_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    snapshot_uuid = status.collect(config.load()).machine.snapshot.gpus[3].uuid
    drain.drain(snapshot_uuid, "in the config file's state directory", directory=state)
    readings = []
    real_load = config.load
    monkeypatch.setattr(config, "load", lambda *a, **k: readings.append(1) or real_load(*a, **k))
    data = status.gather()
    assert len(readings) == 1
    assert data.machine.drains[snapshot_uuid].reason == "in the config file's state directory"
