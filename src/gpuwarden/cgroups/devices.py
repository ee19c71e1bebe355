"""Device isolation for a job, with cgroups.

A job gets a cgroup of its own in which only its leased GPUs' device nodes can
be opened. NVIDIA's nodes are character devices of major 195: `/dev/nvidiaN`
has minor N (NVML's `nvmlDeviceGetMinorNumber`, which need not equal the
index), `nvidia-modeset` is 195:254 and `nvidiactl` 195:255; `nvidia-uvm` and
`nvidia-caps` have majors of their own. Only the GPU nodes of other GPUs are
denied: everything the job could open before stays open to it, the control
nodes included (CUDA needs them).

Mechanics (cgroup v1, the `devices` controller): the job's cgroup sits below
the starting process's own one, `<mount><own>/gpuwarden/<name>`, so whatever
limits a container or a service already has still bind it. `gpuwarden run`
moves *itself* into the new cgroup and then spawns the job, which inherits it
at fork, before it execs: there is no moment in which the job runs
unconfined, and `posix_spawn` (see `gpuwarden.jobs.launch`) needs no hook between
fork and exec. The wrapper stays there with its job (it holds the job's lease
descriptors, it is part of the job) and leaves when the job has ended, so the
empty cgroup can be removed.

Moving a process between cgroups waits for one RCU grace period of the kernel
(docs/performance.md has the figure) the first time in a
while. `prepare()` therefore starts the move in a thread while the caller
reads the GPUs and takes the lease, with the cgroup still allowing
everything; `Isolation.confine()` then writes the rules, which the kernel
checks at every open. The same cgroups (`cpuacct`, `memory`, where mounted)
give the job's CPU and memory usage and the list of its processes
(`gpuwarden.cgroups.accounting`).

cgroup v2 has no `devices` files: there a BPF_PROG_TYPE_CGROUP_DEVICE program
(`gpuwarden.cgroups.bpf`) attached to the job's cgroup decides, where no v1 `devices`
controller is mounted. systemd's `DeviceAllow=` (a transient scope) is not used:
see docs/enforcement.md.
"""

from __future__ import annotations

import os

from gpuwarden.base.errors import UserError
from gpuwarden.cgroups.hierarchy import detect, own_paths, read_text, v1_mounts, v2_mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Optional

    CapsDenied = Optional[tuple[int, tuple[int, ...]]]  # nvidia-caps major, minors to deny

NVIDIA_MAJOR = 195
MODESET_MINOR = 254
CTL_MINOR = 255
GPU_MINORS = range(0, MODESET_MINOR)  # what /dev/nvidiaN can be
GROUP = "gpuwarden"
# Accounting hierarchies joined when mounted; `devices` is the one that must be.
ACCOUNTING = ("cpuacct", "memory")
DEVICES = ("devices", "")  # the v1 controller, or the v2 hierarchy (a BPF program)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


class CgroupError(UserError):
    pass


# --- pure policy ---------------------------------------------------------------------------


def deny_rules(leased: Iterable[int], present: Iterable[int]) -> list[str]:
    """The v1 `devices.deny` lines for a job leased the GPUs of minors `leased`, on a machine
    whose GPU nodes have minors `present`: every other GPU node, nothing else.

    `present` is what the machine has (NVML's minors and the /dev/nvidiaN nodes), not all
    254 possible minors: each rule is one write, and a GPU the machine does not have
    cannot be opened anyway."""
    keep = set(leased)
    for minor in keep:
        if minor not in GPU_MINORS:
            raise ValueError(f"minor {minor} is not a GPU node's (0-{GPU_MINORS[-1]})")
    return [
        f"c {NVIDIA_MAJOR}:{m} rwm"
        for m in sorted(set(present))
        if m in GPU_MINORS and m not in keep
    ]


def device_rules(leased: Iterable[int], present: Iterable[int], caps: CapsDenied) -> list[str]:
    """Every v1 deny line for a job: other GPUs' nodes, and the caps nodes `caps` names."""
    rules = deny_rules(leased, present)
    if caps is not None:
        major, minors = caps
        rules += [f"c {major}:{minor} rwm" for minor in minors]
    return rules


def cgroup_name(pid: int, token: str) -> str:
    """The job cgroup's directory name: the wrapper's pid first, so that a cgroup whose
    wrapper died (SIGKILL) can be recognised and removed once it is empty."""
    name = f"run-{pid}-{token}"
    if not 1 <= len(name) <= 64 or not _NAME_CHARS.issuperset(name):
        raise ValueError(f"bad cgroup name {name!r}")
    return name


def owner_pid(name: str) -> Optional[int]:
    """The wrapper pid in a name made by `cgroup_name`; None for any other name."""
    # run-PID-TOKEN; str tests, not a pattern: a root `run` checks every name in the
    # parent, and compiling one would cost it more than all of them.
    kind, _, rest = name.partition("-")
    pid, _, token = rest.partition("-")
    if kind != "run" or not (pid.isascii() and pid.isdigit()) or not token:
        return None
    return int(pid) if all(c in "0123456789abcdef" for c in token) else None


# --- reading the machine -------------------------------------------------------------------


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def present_minors(gpus: Iterable[Any] = (), dev: str = "/dev") -> set[int]:
    """GPU minors on this machine: NVML's for `gpus`, and every /dev/nvidiaN node's, so a
    GPU NVML does not list (lost, or hidden from it) is still denied."""
    minors = {g.minor for g in gpus if getattr(g, "minor", None) is not None}
    try:
        names = os.listdir(dev)
    except OSError:
        names = []
    for name in names:
        if name.startswith("nvidia") and name[6:].isascii() and name[6:].isdigit():
            try:
                st = os.stat(os.path.join(dev, name))
            except OSError:
                continue
            if os.major(st.st_rdev) == NVIDIA_MAJOR:
                minors.add(os.minor(st.st_rdev))
    return {m for m in minors if m in GPU_MINORS}


# --- a job's cgroup --------------------------------------------------------------------------


def move_in(path: str, controller: str) -> None:
    """Move the calling thread (v1) or this whole process (v2) into the cgroup `path`.

    In a v1 hierarchy the caller's own thread moves through `tasks` ("0" names the
    caller): the kernel then skips the lock a whole-process move takes, and with it a
    wait for an RCU grace period, on every job's start and end (docs/performance.md). What
    the thread starts afterwards is born in the cgroup. In v2 (`controller` "") a
    thread may only move inside a threaded subtree, so the whole process moves."""
    if controller:
        _write(os.path.join(path, "tasks"), "0")
    else:
        _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))


class Isolation:
    """One job's cgroups (one per v1 hierarchy), made and joined by this process.

    `prepare()` makes it and starts moving this process in; `confine()` waits for that and
    writes the device rules; `close()` moves back out and removes what is empty. The
    thread that made it is the one that must start the job and close it (in v1 only
    that thread moves: `move_in`)."""

    def __init__(self, dirs: dict[str, str], home: dict[str, str]) -> None:
        self.dirs = dirs  # controller -> the job's cgroup directory
        self.home = home  # controller -> the cgroup this process came from
        self.error: Optional[OSError] = None
        self.confined = False
        import _thread  # built in: no import cost, unlike threading

        self._done = _thread.allocate_lock()
        self._done.acquire()
        if "" in dirs:  # v2: the whole process moves, after a grace period: overlap it
            _thread.start_new_thread(self._join, ())
        else:
            self._join()

    def _join(self) -> None:
        try:
            for controller, path in self.dirs.items():
                move_in(path, controller)
        except OSError as err:
            self.error = err
        finally:
            self._done.release()

    def wait(self) -> None:
        with self._done:
            pass
        if self.error is not None:
            raise CgroupError(f"cannot join the job's cgroup: {self.error.strerror}")

    def confine(
        self, minors: Sequence[Optional[int]], present: Iterable[int], caps: CapsDenied = None
    ) -> None:
        """Let this process and its children open only the GPU nodes of `minors`, and none
        of the nvidia-caps nodes `caps` names (other MIG slices': `migcaps.denied_for`)."""
        self.wait()
        if any(m is None for m in minors):
            raise CgroupError("NVML gives no minor number for a leased GPU: cannot isolate it")
        fence(self.dirs, [m for m in minors if m is not None], present, caps)
        self.confined = True

    def close(self) -> bool:
        """Leave the job's cgroups and remove them; False when one stays (a process the job
        started outlived it: it keeps the lease and stays confined; `sweep` removes it
        once empty)."""
        try:
            self.wait()
        except CgroupError:
            pass
        for controller in self.dirs:
            try:
                move_in(self.home[controller], controller)
            except OSError:
                pass
        return remove_dirs(self.dirs)


def fence(
    dirs: dict[str, str], leased: list[int], present: Iterable[int], caps: CapsDenied
) -> None:
    """Write the device rules of a job leased the GPUs of minors `leased` into its cgroups
    `dirs`: v1 `devices.deny` lines where the `devices` controller is, else a BPF device
    program on the v2 cgroup (`gpuwarden.cgroups.bpf`, loaded only there). Raises
    OSError when the kernel refuses."""
    if "devices" not in dirs:
        from gpuwarden.cgroups import bpf

        bpf.confine(dirs[""], leased, caps)  # every GPU minor but these
        return
    fd = os.open(os.path.join(dirs["devices"], "devices.deny"), os.O_WRONLY)
    try:
        for rule in device_rules(leased, present, caps):
            os.write(fd, rule.encode())  # the kernel takes one rule per write
    finally:
        os.close(fd)


def remove_dirs(dirs: dict[str, str]) -> bool:
    """rmdir a job's cgroups (each with the group a `run` inside it made); False when
    one still holds a process (rmdir refuses that, so nothing live is touched)."""
    removed = True
    for path in dirs.values():
        try:
            remove_cgroup(path)
        except FileNotFoundError:
            pass
        except OSError:
            removed = False
    return removed


def dirs_for(name: str, mode: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the job cgroup `name`'s directories, this process's own) by controller, in `mode`:
    below this process's own cgroups, in `GROUP`. OSError when /proc cannot be read."""
    own = own_paths(read_text("/proc/self/cgroup"))
    mounts_text = read_text("/proc/self/mounts", 1 << 20)
    if mode == "cgroup-v2-bpf":
        mount = v2_mount(mounts_text)
        places = {"": mount} if mount is not None else {}
    else:
        mounts = v1_mounts(mounts_text)
        places = {c: mounts[c] for c in ("devices", *ACCOUNTING) if c in mounts}
    dirs: dict[str, str] = {}
    home: dict[str, str] = {}
    for controller, mount in places.items():
        if controller not in own:
            continue
        base = os.path.join(mount, own[controller].lstrip("/"))
        home[controller] = base
        dirs[controller] = os.path.join(base, GROUP, name)
    return dirs, home


def prepare(mode: Optional[str] = None) -> Isolation:
    """Make this job's cgroups (allowing everything for now) and start moving this process
    into them; `mode` (default: what `detect` finds) is "cgroup-v1" or "cgroup-v2-bpf".
    Raises CgroupError when that is impossible here."""
    if mode is None:
        mode, why = detect()
        if mode == "none":
            raise CgroupError(f"no device isolation: {why}")
    name = cgroup_name(os.getpid(), os.urandom(3).hex())
    try:
        dirs, home = dirs_for(name, mode)
    except OSError as err:
        raise CgroupError(f"cannot read this process's cgroups: {err.strerror}") from None
    made: list[str] = []
    try:
        for path in dirs.values():
            parent = os.path.dirname(path)
            try:
                os.mkdir(parent, 0o755)
            except FileExistsError:
                pass
            sweep(parent)  # in every hierarchy: a killed wrapper leaves one in each
            try:
                os.mkdir(path, 0o755)
            except FileNotFoundError:  # an ending job's cgroup took the empty parent along
                try:
                    os.mkdir(parent, 0o755)
                except FileExistsError:
                    pass
                os.mkdir(path, 0o755)
            made.append(path)
    except OSError as err:
        if not any(dirs.get(c) in made for c in DEVICES):
            for path in made:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
            raise CgroupError(f"cannot create a device cgroup: {err.strerror}") from None
        dirs = {c: p for c, p in dirs.items() if p in made}  # accounting is optional
    if not any(c in dirs for c in DEVICES):
        raise CgroupError("this process is in no hierarchy that can control devices")
    return Isolation(dirs, home)


def sweep(parent: str) -> list[str]:
    """Remove the empty job cgroups under `parent` whose wrapper is gone (killed before it
    could). rmdir fails on a cgroup with a process in it, so nothing live is touched."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        pid = owner_pid(name)
        if pid is None or _alive(pid):
            continue
        try:
            remove_cgroup(os.path.join(parent, name))
        except OSError:  # a process in it after all, or another run removed it first
            continue
        removed.append(name)
    return removed


def remove_cgroup(path: str) -> None:
    """rmdir a job cgroup, and first the group a `gpuwarden run` inside the job made in it
    (that run removed its own cgroup, not the shared parent it may not be the last of)."""
    try:
        os.rmdir(os.path.join(path, GROUP))
    except OSError:
        pass
    os.rmdir(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- what `gpuwarden run` calls ----------------------------------------------------------------


def isolate(setting: str) -> list[Isolation]:
    """The job's cgroup being joined, or none. `setting` is `enforce.devices`: "auto" runs
    the job as before where isolation is impossible (a line on stderr when it should have
    worked), "require" refuses to start it."""
    try:
        return [prepare()]
    except CgroupError as err:
        if setting == "require":
            raise CgroupError(f"{err} (enforce.devices = require)") from None
        if detect()[0] != "none":
            import sys

            print(f"gpuwarden run: {err}; the job runs without it", file=sys.stderr)
        return []


def confine(cgroup: Isolation, leased: Sequence[Any], gpus: Sequence[Any], setting: str) -> None:
    """Confine the job to the GPUs `leased` out of the machine's `gpus` (see `isolate`):
    their GPU nodes, and on a machine with MIG slices, its slices' capability nodes only."""
    try:
        caps = None
        if any(getattr(g, "mig_mode", False) for g in gpus):  # else run never loads migcaps
            from gpuwarden.cgroups.migcaps import denied_for

            caps = denied_for(leased, gpus)
        cgroup.confine([g.minor for g in leased], present_minors(gpus), caps)
    except (CgroupError, OSError) as err:
        text = str(err) if isinstance(err, CgroupError) else f"cannot write device rules: {err}"
        if setting == "require":
            raise CgroupError(f"{text} (enforce.devices = require)") from None
        import sys

        print(f"gpuwarden run: {text}; the job runs without device isolation", file=sys.stderr)
