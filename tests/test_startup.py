"""What `gpuwarden status` and `gpuwarden run` load at start-up.

Both are short processes paid again and again (`run` prefixes every training
command), so modules they do not need stay off their way; docs/performance.md
says what each one cost. These tests fail when one creeps back in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from gpuwarden import config
from gpuwarden.files import configfiles
from repo import SRC
from servicetools import Server

# Report the modules loaded once the command is done (for `run`: after the job).
PROBE = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))
sys.argv = ["gpuwarden", *sys.argv[1:]]
from gpuwarden.cli import main
raise SystemExit(main())
"""

# Not needed to show the machine or to start a job on it. ctypes.util (subprocess,
# tempfile) is what nvidia-ml-py imports for Windows only, threading for one lock
# (gpuwarden.machine.nvmlload keeps both out; from Python 3.14 ctypes itself imports threading,
# through sysconfig); shutil only measured the terminal; shtab only writes completion
# scripts. The command modules other than the chosen one stay unimported too.
CTYPES_BRINGS_THREADING = sys.version_info >= (3, 14)
UNNEEDED = (
    *("pathlib", "urllib.parse", "ipaddress", "typing", "tomllib", "psutil", "torch"),
    *("ctypes.util", "subprocess", "tempfile", "shutil", "shtab", "logging"),
    *(() if CTYPES_BRINGS_THREADING else ("threading",)),
    *("gpuwarden.cli.completion", "gpuwarden.cli.reserve", "gpuwarden.cli.select"),
    "gpuwarden.sim.machine",  # the simulator's steering side: no NVML client reads it
    "gpuwarden.machine.processuse",  # per-process use: the efficiency sampler's alone
)

# The simulator's modules that only other NVML clients (nvitop, pynvml_utils, an
# exporter's GPM) ask for.
LATER_SIM = tuple(f"gpuwarden.sim.{m}" for m in ("board", "pcie", "clocks", "ecc", "gpm", "fields"))


def loaded(*args: str, env: Optional[dict[str, str]] = None) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), **(env or {}))
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "args, also_unneeded",
    [
        # The board, link, clock-table, ECC-location and GPM answers are for other
        # NVML tools: status shows none of them.
        (("status",), ("gpuwarden.health.xids", *LATER_SIM)),
        # CUDA_VISIBLE_DEVICES is unset: nothing of visible's reading side is needed,
        # nor the Xid catalogue (no XID seen), nor MIG's capability nodes (no slices),
        # nor the detached holder of `reserve` and Slurm jobs.
        (
            ("run", "-g", "1", "--", "true"),
            (
                "gpuwarden.jobs.holder",
                # the standard module's enums: the job's start uses `_signal`'s numbers
                "signal",
                "gpuwarden.placement.visible",
                "gpuwarden.health.xids",
                "gpuwarden.cgroups.migcaps",
                "gpuwarden.sim.sensors",
                "gpuwarden.sim.links",
                "gpuwarden.sim.events",
                "gpuwarden.sim.handles",
                "gpuwarden.sim.procinfo",
                *LATER_SIM,
                "gpuwarden.sim.specparse",
                "math",
            ),
        ),
    ],
)
def test_status_and_run_leave_unneeded_modules_alone(
    sim, args: tuple[str, ...], also_unneeded: tuple[str, ...]
) -> None:
    sim("server-8xa100")
    loaded(*args)  # the first client of a machine parses its spec (tomllib), then caches it
    modules = loaded(*args)
    assert "gpuwarden.machine.inventory" in modules  # the probe saw the command's imports
    unneeded = {*UNNEEDED, *also_unneeded}
    if sys.version_info < (3, 12):  # dataclasses loads them for every class from 3.12
        unneeded |= {"inspect", "copy", "ast", "dis", "contextlib"}
    assert not modules & unneeded, sorted(modules & unneeded)


def test_the_writing_side_lives_in_launch_alone() -> None:
    """launch writes CUDA_VISIBLE_DEVICES, visible reads it: neither reaches into the
    other (no forwarding names), so the two never import each other."""
    from gpuwarden.jobs import launch
    from gpuwarden.placement import visible

    assert callable(launch.export_value) and callable(visible.allowed_uuids)
    assert not hasattr(visible, "export_value") and not hasattr(visible, "export_env")
    assert not hasattr(launch, "allowed_uuids")


@pytest.mark.parametrize(
    "cwd", ["/", "/a/b", "/a//b/", "/a/./b/.", "/a/../b", "rel", "./rel/../x", "rel//y/."]
)
def test_absolute_spells_a_path_as_pathlib_does(cwd: str) -> None:
    assert configfiles.absolute(cwd) == str(Path(cwd).absolute())


def test_locations_are_absolute_strings(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One function per location, a string (the run path does not import pathlib)."""
    from gpuwarden.files import locations

    monkeypatch.delenv("GPUWARDEN_STATE_DIR")
    monkeypatch.delenv("GPUWARDEN_LEASE_DIR")
    # the per-user fallback, whether or not this machine has a system-wide install
    monkeypatch.setattr(locations, "SYSTEM_STATE_DIR", str(isolated / "no-system-state"))
    monkeypatch.setattr(locations, "SYSTEM_LEASE_DIR", str(isolated / "no-system-leases"))
    monkeypatch.setenv("XDG_STATE_HOME", str(isolated / "xdg-state"))
    assert locations.state_location() == str(isolated / "xdg-state" / "gpuwarden")
    assert locations.lease_location() == str(isolated / "xdg-state" / "gpuwarden" / "leases")
    cfg = config.load({"state.dir": "s", "lease.dir": "l"})
    assert locations.state_location(cfg) == str(isolated / "cwd" / "s")
    assert locations.lease_location(cfg) == str(isolated / "cwd" / "l")


def _project_file_by_pathlib(cwd: str | Path) -> Path | None:
    """The walk as it was written with pathlib, before the path work became strings."""
    here = Path(cwd).absolute()
    home = Path(os.path.expanduser("~")).absolute()
    for directory in (here, *here.parents):
        candidate = directory / config.PROJECT_FILE
        if candidate.is_file():
            return candidate
        if directory == home or (directory / ".git").exists():
            return None
    return None


def test_project_file_found_as_pathlib_found_it(isolated: Path) -> None:
    repo = isolated / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub" / "deeper").mkdir(parents=True)
    (repo / "gpuwarden.toml").write_text("[run]\nmax_util = 5\n")
    spellings = (
        repo / "sub" / "deeper",
        f"{repo}//sub/./deeper/",
        f"{repo}/sub/../sub",
        f"{repo}/sub/deeper/../..",
        isolated,
        "/",
    )
    for cwd in spellings:
        found = _project_file_by_pathlib(cwd)
        assert config.project_config(cwd) == (None if found is None else str(found)), cwd
    assert config.project_config(repo / "sub") == str(repo / "gpuwarden.toml")


@pytest.mark.parametrize(
    "path, name",
    [
        *(("a.toml", "a"), ("/x/a.b.toml", "a.b"), ("/x/.toml", ".toml"), ("/x/a", "a")),
        # a trailing dot stays part of the name, as in Path.stem before Python 3.14
        *(("/x/a.", "a."), ("a..toml", "a.")),
    ],
)
def test_spec_names_are_file_names_without_their_suffix(path: str, name: str) -> None:
    from gpuwarden.sim import specs

    assert specs._name_of(path) == name


def test_simulator_paths_are_strings_in_one_form() -> None:
    from gpuwarden.sim import fake, specs

    bundled = os.path.join(specs.SPEC_DIR, "server-8xa100.toml")
    assert isinstance(specs.SPEC_DIR, str) and os.path.isfile(bundled)
    assert isinstance(fake.SHIM_DIR, str) and os.path.isfile(
        os.path.join(fake.SHIM_DIR, "pynvml.py")
    )
    assert specs.spec_path("server-8xa100") == bundled
    assert "server-8xa100" in specs.bundled()
    assert os.path.dirname(fake.real_pynvml_path()) != fake.SHIM_DIR
    spec = specs.load("server-8xa100")
    state = os.path.join(os.environ["GPUWARDEN_SIM_STATE"], "server-8xa100.json")
    assert specs.state_file(spec) == state
    for twin in ("_spec_file", "_state_file", "_real_pynvml_file"):
        assert not hasattr(specs, twin) and not hasattr(fake, twin)


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter on this tree's sources: what it imports is its own."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )


NO_INTERPRETER_STATE = """
import gc, sys, weakref

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

before = [cycle() for _ in range(20000)]  # garbage the caller made before the import
threshold, frozen = gc.get_threshold(), gc.get_freeze_count()  # 3.12 starts with some
import gpuwarden.cli
assert gpuwarden.cli.main(["config"]) == 0
assert gc.isenabled() and gc.get_freeze_count() == frozen and gc.get_threshold() == threshold
gc.collect()
assert all(ref() is None for ref in before), "the caller's garbage was never freed"
made = [n for n, m in sys.modules.items() if n != "__main__" and getattr(m, "__spec__", 0) is None]
assert not made, made  # every module left is one the import system made
import argparse, gettext  # argparse translates its words as it would without gpuwarden
assert getattr(argparse, "_", gettext.gettext) is gettext.gettext
assert getattr(argparse, "ngettext", gettext.ngettext) is gettext.ngettext
print("ok")
"""


def test_the_command_line_changes_no_interpreter_wide_state() -> None:
    """Importing and calling `gpuwarden.cli` from a program (a test runner, a notebook)
    leaves its collector, its frozen objects, its modules and argparse as they were."""
    out = run_script(NO_INTERPRETER_STATE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


NVML_LOAD = """
import sys
from gpuwarden.machine.nvmlload import without_unused_modules

import ctypes
threading_before = "threading" in sys.modules  # Python 3.14's ctypes imports it
module = without_unused_modules(lambda: __import__("pynvml"))
assert "ctypes.util" not in sys.modules and "subprocess" not in sys.modules
assert ("threading" in sys.modules) == threading_before
lock = module.libLoadLock
with lock:  # a real lock, held and released
    assert lock.locked()
assert not lock.locked()
assert module.threading.current_thread().name == "MainThread"  # the real module, now
import threading
assert sys.modules["threading"].__file__.endswith("threading.py")  # not the stand-in
assert type(lock) is type(threading.Lock())
import ctypes
assert not hasattr(ctypes, "util")
assert module.find_library("c") is not None  # the real one, loaded now
import ctypes.util
assert type(sys.modules["ctypes.util"]) is type(sys) and ctypes.util.find_library is not None
assert sys.modules["ctypes.util"].__file__.endswith("util.py")  # not the stand-in
assert module.find_library("c") == ctypes.util.find_library("c")
print("ok")
"""


DATACLASSES_LOAD = """
import sys
from gpuwarden.base.lazyimport import import_dataclasses

dataclasses = import_dataclasses()
assert "inspect" not in sys.modules and "copy" not in sys.modules
import inspect, copy
assert inspect.__file__.endswith("inspect.py") and copy.__file__.endswith("copy.py")

@dataclasses.dataclass
class NoDocstring:  # dataclasses calls inspect.signature for its doc
    x: list
    y: int = 2

assert NoDocstring.__doc__ == "NoDocstring(x: list, y: int = 2)"
a = NoDocstring([1])
b = dataclasses.replace(a, y=3)
assert dataclasses.asdict(b) == {"x": [1], "y": 3} and dataclasses.asdict(b)["x"] is not b.x
assert dataclasses.inspect is inspect and dataclasses.copy is copy  # stand-ins replaced
print("ok")
"""


def test_dataclasses_loads_without_inspect_and_leaves_no_stand_in() -> None:
    if sys.version_info >= (3, 12):
        pytest.skip("from Python 3.12 dataclasses uses inspect for every class: nothing deferred")
    out = run_script(DATACLASSES_LOAD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_nvidia_ml_py_loads_without_ctypes_util_or_threading_and_leaves_no_stand_in() -> None:
    out = run_script(NVML_LOAD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


STAND_IN_TOUCHED_DURING_LOAD = """
import sys
from gpuwarden.base import lazyimport

stand_in = sys.modules["copy"] = lazyimport._OnFirstUse("copy")  # as inside the window
assert stand_in.deepcopy([[1]]) == [[1]]  # the real function, not endless recursion
assert sys.modules["copy"] is not stand_in and sys.modules["copy"].__file__.endswith("copy.py")
print("ok")
"""


def test_a_stand_in_touched_inside_its_window_loads_the_real_module() -> None:
    out = run_script(STAND_IN_TOUCHED_DURING_LOAD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


THREADING_DURING_LOAD = """
import sys
from gpuwarden.machine.nvmlload import without_unused_modules

def load():  # as a newer nvidia-ml-py might: more of threading than Lock, while it loads
    import threading
    return threading.Lock(), threading.RLock()

lock, rlock = without_unused_modules(load)
import threading
assert sys.modules["threading"] is threading and threading.__file__.endswith("threading.py")
with rlock, rlock:  # the real RLock: re-entrant
    pass
assert type(lock) is type(threading.Lock())
print("ok")
"""


def test_more_of_threading_while_loading_gets_the_real_module() -> None:
    out = run_script(THREADING_DURING_LOAD)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_loaded_modules_are_left_as_they_are() -> None:
    import ctypes.util
    import threading

    from gpuwarden.machine.nvmlload import without_unused_modules

    real = sys.modules["ctypes.util"]
    assert without_unused_modules(lambda: sys.modules["ctypes.util"]) is real
    assert sys.modules["ctypes.util"] is real is ctypes.util
    assert without_unused_modules(lambda: sys.modules["threading"]) is threading
    assert sys.modules["threading"] is threading


def test_run_through_the_service_loads_nothing_of_choosing_or_leasing(
    server: Server,
) -> None:
    """With a queue service the service chooses, leases and starts: `run` only asks it
    and waits, so NVML, the lease and selection code and the typing of the service's
    own modules stay off its start-up."""
    env = {"GPUWARDEN_SOCKET": server.socket}
    modules = loaded("run", "-g", "1", "--", "true", env=env)
    assert "gpuwarden.queueclient.client" in modules  # it did go through the service
    unneeded = {*UNNEEDED, "pynvml", "gpuwarden.machine.inventory", "gpuwarden.jobs.allocation"}
    unneeded |= {"gpuwarden.leases", "gpuwarden.health", "gpuwarden.jobs.holder"}
    unneeded.add("gpuwarden.sim.library")
    unneeded.add("gpuwarden.service")  # the daemon's package: the client side is queueclient
    if sys.version_info < (3, 12):
        unneeded |= {"inspect", "copy", "ast", "dis"}
    assert not modules & unneeded, sorted(modules & unneeded)


def test_submit_loads_nothing_of_choosing_or_of_the_machine(server: Server) -> None:
    """`submit` passes the request on; the service judges it (selection, NVML, the
    configuration's policy), so the client imports none of that: its cost is the
    interpreter's start, argparse and one request (docs/performance.md)."""
    env = {"GPUWARDEN_SOCKET": server.socket}
    modules = loaded("submit", "-g", "1", "--min-free", "1G", "--", "true", env=env)
    assert "gpuwarden.queueclient.client" in modules  # it did submit
    unneeded = {*UNNEEDED, "pynvml", "gpuwarden.machine.inventory", "gpuwarden.placement.selection"}
    unneeded |= {
        "gpuwarden.placement.mig",
        "gpuwarden.placement.refusals",
        "gpuwarden.leases",
        "gpuwarden.health",
    }
    unneeded |= {"gpuwarden.cli.jobtables", "gpuwarden.sim.library", "gpuwarden.service"}
    if sys.version_info < (3, 12):
        unneeded |= {"inspect", "copy", "ast", "dis"}
    assert not modules & unneeded, sorted(modules & unneeded)
