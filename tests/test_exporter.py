"""Metric rendering on hand-built snapshots, idle-held logic, the view cache, serving."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import parse_listen
from gpuwarden.exporter.metrics import IdleTracker, View, render
from gpuwarden.exporter.server import ViewCache, serve
from gpuwarden.health.judgement import judge
from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, Snapshot
from machines import busy_box
from scraping import samples, value
from waiting import wait_for

GiB = 2**30


def test_gpu_metrics_have_units_and_labels():
    text = render(View(busy_box()))
    found = samples(text)
    gpu0 = {"gpu": "0", "uuid": "GPU-aaaa", "model": "NVIDIA A100-SXM4-40GB", "hostname": "box"}
    assert value(found, "gpuwarden_gpu_memory_used_bytes", **gpu0) == 10 * GiB
    assert value(found, "gpuwarden_gpu_memory_total_bytes", **gpu0) == 40 * GiB
    assert value(found, "gpuwarden_gpu_utilization_ratio", **gpu0) == 0.5
    assert value(found, "gpuwarden_gpu_temperature_celsius", **gpu0) == 61
    assert value(found, "gpuwarden_gpu_power_watts", **gpu0) == 250.5
    assert value(found, "gpuwarden_gpu_energy_joules_total", **gpu0) == 12345.0
    assert value(found, "gpuwarden_gpu_sm_clock_hertz", **gpu0) == 1410e6
    assert value(found, "gpuwarden_gpu_ecc_errors_total", gpu="0", type="corrected") == 3
    assert "# TYPE gpuwarden_gpu_energy_joules_total counter" in text


def test_lost_gpu_still_listed_while_others_are_served():
    found = samples(render(View(busy_box())))
    assert value(found, "gpuwarden_gpu_lost", gpu="2") == 1
    assert value(found, "gpuwarden_gpu_lost", gpu="0") == 0
    assert not [
        k for k in found if k[0] == "gpuwarden_gpu_memory_used_bytes" and ("gpu", "2") in k[1]
    ]


def test_process_and_user_memory():
    found = samples(render(View(busy_box())))
    assert value(found, "gpuwarden_process_memory_used_bytes", pid="101", user="alice") == 6 * GiB
    assert value(found, "gpuwarden_user_memory_used_bytes", user="alice") == 8 * GiB
    assert value(found, "gpuwarden_user_memory_used_bytes", user="bob") == 4 * GiB


def test_leases_drains_health_and_xids():
    from gpuwarden.health.drain import Drain

    snap = busy_box()
    lease = LeaseInfo("GPU-aaaa", "alice", 101, "python train.py", 1.0, job="exp-7")
    view = View(
        snap,
        leases=(lease,),
        drains={
            "GPU-cccc": Drain("GPU-cccc", "health: GPU is lost", "root", 1.0, True, 0),
            "GPU-bbbb": Drain("GPU-bbbb", "fan", "carol", 1.0, True, 1000),
        },
        findings={g.uuid: judge(g, (79,) if g.index == 2 else ()) for g in snap.gpus},
        xids={"GPU-cccc": (13, 79)},
    )
    found = samples(render(view))
    assert value(found, "gpuwarden_gpu_leased", gpu="0", user="alice", job="exp-7") == 1
    assert value(found, "gpuwarden_gpu_leased", gpu="1", user="") == 0
    assert value(found, "gpuwarden_gpu_drained", gpu="2", auto="true") == 1
    # root's watch drains as `gpuwarden-health`; a user's record is that user's, `auto`
    # or not (the file says `auto`, the kernel says who wrote it)
    assert value(found, "gpuwarden_gpu_drained", gpu="2", by="gpuwarden-health") == 1
    assert value(found, "gpuwarden_gpu_drained", gpu="1", by="carol", auto="true") == 1
    assert value(found, "gpuwarden_gpu_drained", gpu="0") == 0
    assert value(found, "gpuwarden_gpu_health", gpu="2", state="fatal") == 1
    assert value(found, "gpuwarden_gpu_health", gpu="0", state="ok") == 1
    assert value(found, "gpuwarden_gpu_xid_errors_total", gpu="2", xid="79") == 1
    assert value(found, "gpuwarden_gpu_last_xid", gpu="2") == 79


def test_dcgm_compat_names_units_and_labels():
    view = View(busy_box(), xids={"GPU-aaaa": (48,)})
    found = samples(render(view, dcgm_compat=True))
    labels = {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "hostname": "box",  # dcgm-exporter 3.3 and later; `Hostname` before
        "pci_bus_id": "",  # not in this hand-built snapshot
    }
    assert value(found, "DCGM_FI_DEV_GPU_UTIL", **labels) == 50
    assert value(found, "DCGM_FI_DEV_FB_USED", **labels) == 10 * 1024  # MiB
    assert value(found, "DCGM_FI_DEV_FB_FREE", **labels) == 30 * 1024
    assert value(found, "DCGM_FI_DEV_GPU_TEMP", **labels) == 61
    assert value(found, "DCGM_FI_DEV_POWER_USAGE", **labels) == 250.5
    assert value(found, "DCGM_FI_DEV_SM_CLOCK", **labels) == 1410
    assert value(found, "DCGM_FI_DEV_MEM_COPY_UTIL", **labels) == 20
    assert value(found, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **labels) == 12345000.0  # mJ
    assert value(found, "DCGM_FI_DEV_XID_ERRORS", **labels) == 48
    text = "double-bit (uncorrectable) ECC error"  # NVIDIA's Xid catalogue, as err_msg
    assert value(found, "DCGM_FI_DEV_XID_ERRORS", err_code="48", err_msg=text) == 48
    assert value(found, "DCGM_FI_DEV_XID_ERRORS", gpu="1", err_code="0", err_msg="No Error") == 0
    assert not any(n.startswith("DCGM_") for n, _ in samples(render(view)))


def test_idle_held_needs_a_holder_and_time():
    tracker = IdleTracker(idle_util=5)
    first = tracker.update(busy_box(t=1000, util0=0), leased=[])
    assert first["GPU-aaaa"] == 0 and first["GPU-bbbb"] == 0
    later = tracker.update(busy_box(t=1700, util0=0), leased=[])
    assert later["GPU-aaaa"] == 700 and later["GPU-bbbb"] == 700
    busy = tracker.update(busy_box(t=1800, util0=90), leased=[])
    assert busy["GPU-aaaa"] == 0 and busy["GPU-bbbb"] == 800
    assert busy["GPU-cccc"] == 0  # lost: not "idle"
    empty = Snapshot(2000, "box", (Gpu(0, "GPU-dddd", utilization_gpu=0),))
    assert IdleTracker().update(empty, leased=[])["GPU-dddd"] == 0  # nobody holds it
    tracker2 = IdleTracker()
    tracker2.update(empty, leased=["GPU-dddd"])
    assert tracker2.update(Snapshot(2900, "box", empty.gpus), ["GPU-dddd"])["GPU-dddd"] == 900
    found = samples(render(View(busy_box(), idle_seconds={"GPU-bbbb": 900}, idle_after=600)))
    assert value(found, "gpuwarden_gpu_idle_held", gpu="1") == 1
    assert value(found, "gpuwarden_gpu_idle_held", gpu="0") == 0
    assert value(found, "gpuwarden_gpu_idle_held_seconds", gpu="1") == 900


def test_cache_reads_once_per_period_and_counts_errors():
    clock = [0.0]
    reads = []

    def read():
        reads.append(1)
        if len(reads) == 2:
            raise RuntimeError("NVML went away")
        return busy_box()

    cache = ViewCache(read, cache_seconds=5, clock=lambda: clock[0])
    first = cache.get()
    assert cache.get() is first and len(reads) == 1
    assert first.scrape_errors == 1  # the lost GPU
    clock[0] = 6
    second = cache.get()  # the whole read failed: old GPUs served, error counted
    assert len(reads) == 2 and second.scrape_errors == 2 and not second.nvml_up
    assert [g.uuid for g in second.snapshot.gpus] == [g.uuid for g in first.snapshot.gpus]
    found = samples(render(second))
    assert value(found, "gpuwarden_scrape_errors_total") == 2
    assert value(found, "gpuwarden_nvml_up") == 0


def test_parse_listen():
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen(":9500") == ("0.0.0.0", 9500)
    assert parse_listen("9401") == ("127.0.0.1", 9401)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    with pytest.raises(UserError, match="invalid listen address"):
        parse_listen("localhost:http")
    with pytest.raises(UserError, match="invalid listen address"):
        parse_listen("host:0")  # any free port: only where the caller allows it
    assert parse_listen("127.0.0.1:0", any_port=True) == ("127.0.0.1", 0)


def test_the_config_reads_a_listen_address_as_the_exporter_does(tmp_path, monkeypatch):
    """`--listen 9400` (a bare port) and `:9400` were accepted by the exporter's parser
    and refused by the config's: both now parse through units.parse_listen."""
    from gpuwarden import config

    for text, where in (("9400", ("127.0.0.1", 9400)), (":9400", ("0.0.0.0", 9400))):
        assert config.load({"exporter.listen": text}).get("exporter.listen") == text
        assert parse_listen(text) == where
    for bad in ("localhost", "host:0", "host:99999", "host:٣"):
        with pytest.raises(UserError, match="listen"):
            config.load({"exporter.listen": bad})


def test_serve_and_port_in_use():
    cache = ViewCache(busy_box, cache_seconds=0)
    server = serve("127.0.0.1:0", cache=cache)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert "gpuwarden_gpu_memory_used_bytes" in body
        assert "gpuwarden_exporter_process_cpu_seconds_total" in body
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{server.port}: address"):
            serve(f"127.0.0.1:{server.port}", cache=cache)
    finally:
        server.close()


def test_port_in_use_by_another_program_is_one_line(cli):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = cli("--sim", "server-8xa100", "exporter", "--listen", f"127.0.0.1:{port}")
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"gpuwarden exporter: cannot listen on 127.0.0.1:{port}")
    )
    assert "Traceback" not in done.stderr


def test_xid_events_exist_at_zero_before_the_first_so_increase_sees_it():
    # Per code, a series is born at 1 with its first XID (Prometheus sees no
    # increase); the per-GPU counters are there at 0 from the first scrape.
    before = samples(render(View(busy_box())))
    for gpu in ("0", "1", "2"):
        assert value(before, "gpuwarden_gpu_xid_events_total", gpu=gpu, fatal="true") == 0
        assert value(before, "gpuwarden_gpu_xid_events_total", gpu=gpu, fatal="false") == 0
    after = samples(render(View(busy_box(), xids={"GPU-bbbb": (13, 79, 13, 48)})))
    assert value(after, "gpuwarden_gpu_xid_events_total", gpu="1", fatal="true") == 2
    assert value(after, "gpuwarden_gpu_xid_events_total", gpu="1", fatal="false") == 2
    assert value(after, "gpuwarden_gpu_xid_events_total", gpu="0", fatal="true") == 0
    assert value(after, "gpuwarden_gpu_xid_errors_total", gpu="1", xid="79", fatal="true") == 1
    assert value(after, "gpuwarden_gpu_xid_errors_total", gpu="1", xid="13", fatal="false") == 2


def test_fatal_label_follows_the_configured_fatal_list():
    from gpuwarden.health.judgement import DEFAULT_FATAL_XIDS

    fatal = (DEFAULT_FATAL_XIDS - {79}) | {13}  # health.fatal_xids = "+13 -79"
    xids = {"GPU-aaaa": (13, 79)}
    found = samples(render(View(busy_box(), xids=xids, fatal_xids=fatal)))
    assert value(found, "gpuwarden_gpu_xid_errors_total", xid="13", fatal="true") == 1
    assert value(found, "gpuwarden_gpu_xid_errors_total", xid="79", fatal="false") == 1
    assert value(found, "gpuwarden_gpu_xid_events_total", gpu="0", fatal="true") == 1


def test_view_cache_labels_xids_with_its_rules(monkeypatch):
    import gpuwarden.health.xidlog as xidlog
    from gpuwarden.health.judgement import Rules

    event = {"uuid": "GPU-aaaa", "xid": 13, "at": 1.0}
    monkeypatch.setattr(xidlog, "xid_events", lambda since=None, state=None: [event])
    cache = ViewCache(busy_box, rules=Rules(fatal_xids=frozenset({13})))
    found = samples(render(cache.get()))
    assert value(found, "gpuwarden_gpu_xid_errors_total", xid="13", fatal="true") == 1


@pytest.mark.parametrize("args", [["--once"], ["--listen", "127.0.0.1:0"]])
def test_without_prometheus_client_the_exporter_says_so_in_one_line(cli, tmp_path, args):
    from pathlib import Path

    hidden = tmp_path / "prometheus_client"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('not installed')\n")
    src = Path(__file__).resolve().parent.parent / "src"
    done = cli("--sim", "server-8xa100", "exporter", *args, env={"PYTHONPATH": f"{tmp_path}:{src}"})
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "gpuwarden exporter: the exporter needs prometheus-client: "
        "pip install 'gpuwarden[exporter]'"
    ]


def test_a_lease_of_the_wrong_types_costs_its_labels_not_the_scrape():
    hostile = LeaseInfo("GPU-aaaa", 123, "abc", 5, 1.0, job=["x"])  # type: ignore[arg-type]
    newline = LeaseInfo("GPU-bbbb", "eve", 7, "a\nb", 1.0, job=None)
    shown = View(busy_box(), leases=(hostile, newline), show_commands=True)
    found = samples(render(shown))
    assert value(found, "gpuwarden_gpu_leased", gpu="0", user="123", job="['x']", pid="abc") == 1
    assert value(found, "gpuwarden_gpu_leased", gpu="1", user="eve", job="a b") == 1
    assert value(found, "gpuwarden_gpu_memory_used_bytes", gpu="0") == 10 * GiB


def test_command_lines_stay_out_of_the_labels_unless_the_admin_shows_them():
    """Anyone who reaches the port reads the metrics: a lease without a job id and a
    process show no command line unless `exporter.show_commands` is set."""
    lease = LeaseInfo("GPU-bbbb", "eve", 7, "python secret.py --token x", 1.0, job=None)
    hidden = render(View(busy_box(), leases=(lease,)))
    assert "secret" not in hidden
    assert value(samples(hidden), "gpuwarden_gpu_leased", gpu="1", user="eve", job="") == 1
    assert "secret" in render(View(busy_box(), leases=(lease,), show_commands=True))


def test_a_failing_drain_or_xid_reader_costs_a_scrape_error_not_the_scrape(monkeypatch):
    import gpuwarden.health.drain as drain
    import gpuwarden.health.xidlog as xidlog

    calls = []

    def drains(directory=None):
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("a drain record no reader expected")
        return {}

    def broken_xids(since=None, state=None):
        raise TypeError("an XID line of the wrong type")

    monkeypatch.setattr(drain, "list_drains", drains)
    monkeypatch.setattr(xidlog, "xid_events", broken_xids)
    clock = [0.0]
    cache = ViewCache(busy_box, cache_seconds=1, clock=lambda: clock[0])
    first = cache.get()
    assert first.scrape_errors == 2  # the lost GPU and the XID reader
    clock[0] = 5
    second = cache.get()
    assert second.scrape_errors == 5 and second.drains == first.drains
    found = samples(render(second))
    assert value(found, "gpuwarden_gpu_memory_used_bytes", gpu="0") == 10 * GiB
    assert value(found, "gpuwarden_scrape_errors_total") == 5


def test_a_hung_read_serves_the_last_view_instead_of_hanging_the_scrape():
    import threading
    import time

    release = threading.Event()
    calls = []

    def read():
        calls.append(1)
        if len(calls) == 2:  # NVML stuck on a failing GPU, or a reader on a FIFO
            release.wait(30)
        return busy_box()

    cache = ViewCache(read, cache_seconds=0, read_timeout=2.0)
    first = cache.get()
    started = time.monotonic()
    stale = cache.get()
    assert time.monotonic() - started < 10
    assert stale.snapshot == first.snapshot and stale.scrape_errors == first.scrape_errors + 1
    started = time.monotonic()
    assert cache.get() is stale and time.monotonic() - started < 1.5  # no second wait
    assert len(calls) == 2  # one read at a time, however many scrapes
    release.set()
    wait_for(lambda: cache.get() is not stale, 10, "a fresh view", 0.01)
    assert cache.get() is not stale and len(calls) >= 3


def test_a_first_read_that_hangs_gives_an_nvml_down_view():
    import threading

    release = threading.Event()
    cache = ViewCache(lambda: release.wait(30) and busy_box(), read_timeout=0.1)
    try:
        view = cache.get()
        assert (
            not view.nvml_up
            and view.snapshot.gpus == ()
            and "longer than" in str(view.snapshot.error)
        )
        found = samples(render(view))
        assert value(found, "gpuwarden_nvml_up") == 0
        assert value(found, "gpuwarden_scrape_errors_total") == 1
    finally:
        release.set()
