"""Starting the job: its environment, its process group, signals and exit status.

The job runs in a process group of its own so that a signal reaches all of it
(its DataLoader workers, torchrun's ranks), and it is handed the terminal when
`gpuwarden run` had it, so Ctrl-C, Ctrl-Z and a debugger's prompt behave as if
the job had been started by the shell directly. SIGINT, SIGTERM and SIGHUP
sent to the wrapper are forwarded to the group; a signal the wrapper was
started with ignored (`nohup`) stays ignored for the job.

`os.posix_spawnp` rather than `subprocess` (an import every training run would
pay) or `os.fork` (which copies a Python process's page tables; posix_spawn uses
vfork; docs/performance.md has both costs). It sets the new
process group and default signal dispositions in the child, and reports a
failed exec as an error, so "command not found" is a clear line and exit 127
(126: found but not runnable), as in the shell. The terminal is handed over
right after the spawn; a job that touches it in that instant is continued.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    import signal
else:
    # The C module the standard `signal` wraps: the same calls and numbers, without
    # the three enums `signal` builds for readable names when it is imported (3.5 M
    # instructions, 2% of what `run` adds to a job's start; docs/performance.md).
    # A job's start compares and passes numbers only, never shows a name.
    import _signal as signal
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, Optional

    from gpuwarden.machine.inventory import Gpu

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_TERMINAL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
# Dispositions the wrapper inherited: an ignored one (nohup) stays ignored for the job.
_INHERITED_IGNORED = {s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN}

# Variables a job inherits from an enclosing lease that must not leak into this one.
OURS = (
    "GPUWARDEN_JOB",
    "GPUWARDEN_GPUS",
    "GPUWARDEN_GPU_INDICES",
    "GPUWARDEN_LEASE",
    "GPUWARDEN_MEM_LIMIT",
    "GPUWARDEN_DDP_BACKEND",
)


def export_value(gpus: Sequence[Gpu], use_uuid: bool = False) -> str:
    """`CUDA_VISIBLE_DEVICES` naming exactly `gpus`, in that order.

    Indices are NVML's and so mean the right GPUs only together with
    `CUDA_DEVICE_ORDER=PCI_BUS_ID` (see `export_env`); UUIDs are right in any
    order, and a MIG device is always given by its UUID. An empty list hides every
    GPU. A GPU given twice would make CUDA expose none, so it is refused. (The
    reading side is `gpuwarden.placement.visible`; starting a job needs only this one.)
    """
    seen: set[str] = set()
    for gpu in gpus:
        if gpu.uuid in seen:
            raise ValueError(f"GPU {gpu.uuid} given twice: CUDA would expose no GPU at all")
        seen.add(gpu.uuid)
    # A MIG device has no index of its own that CUDA would read: only its MIG- UUID
    # names it (the parent's index names the GPU, and CUDA then picks a MIG device).
    return ",".join(
        gpu.uuid if use_uuid or gpu.uuid.startswith("MIG-") else str(gpu.index) for gpu in gpus
    )


def export_env(gpus: Sequence[Gpu], use_uuid: bool = False) -> dict[str, str]:
    """Both variables a child needs so that its cuda:N are exactly `gpus`, in order."""
    return {
        "CUDA_VISIBLE_DEVICES": export_value(gpus, use_uuid),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def job_env(
    base: Mapping[str, str],
    gpus: Sequence[Gpu],
    *,
    use_uuid: bool = False,
    job: Optional[str] = None,
    mem: Optional[int] = None,
) -> dict[str, str]:
    """The job's environment: `base` plus the GPUs (an empty list hides every GPU)."""
    env = {k: v for k, v in base.items() if k not in OURS}
    env.update(export_env(gpus, use_uuid))
    env["GPUWARDEN_GPUS"] = ",".join(g.uuid for g in gpus)
    env["GPUWARDEN_GPU_INDICES"] = ",".join(str(g.index) for g in gpus)
    if job is not None:
        env["GPUWARDEN_JOB"] = job
        env["GPUWARDEN_LEASE"] = "exclusive" if mem is None else "shared"
    if mem is not None:
        env["GPUWARDEN_MEM_LIMIT"] = str(mem)
    return env


def command_text(argv: Sequence[str]) -> str:
    """The command as one line for lease metadata and status."""
    return " ".join(a if a and " " not in a else repr(a) for a in argv)


_PYTHONS = ("python", "python3")


def _is_python(word: str) -> bool:
    base = os.path.basename(word)
    return base in _PYTHONS or base.startswith("python3.") or word == sys.executable


def ddp_argv(argv: Sequence[str], nproc: int, python: Optional[str] = None) -> list[str]:
    """torchrun (`python -m torch.distributed.run`) starting `nproc` copies of the job on
    this machine; `--standalone` makes it rendezvous on a free local port. The job may
    be given as `train.py ARGS`, `python train.py ARGS` or `python -m pkg ARGS`; any other
    program runs with `--no-python` and must read LOCAL_RANK itself.

    torchrun runs under the job's own interpreter, never gpuwarden's (on a lab install
    that is a venv under /opt with no torch): `~/venv/bin/python train.py` runs that
    venv's torchrun, a script's `#!` line names its interpreter, and only a script
    with neither runs under this Python. `python` overrides all of them."""
    args = list(argv)
    script = False  # `python X`: X is a script whatever its name
    given: Optional[str] = None  # the interpreter the command names
    if args and _is_python(args[0]):
        given = args[0]
        args = args[1:]
        script = True
        if args and args[0].startswith("-") and args[0] != "-m":
            raise UserError(
                f"--ddp: interpreter option {args[0]!r} is not passed through torchrun; give "
                "the script and its arguments after --, e.g. `-- train.py --epochs 3`"
            )
    if not args or not args[0] or (args[0] == "-m" and len(args) < 2):
        raise UserError("--ddp: no script given after --, e.g. `-- train.py --epochs 3`")
    _check_ddp_target(args, script or args[0].endswith(".py"))
    if python is None and given is None and args[0] != "-m":
        python = _shebang_python(args[0])
    python = python or given or sys.executable
    if python == sys.executable:
        import importlib.machinery

        if importlib.machinery.PathFinder.find_spec("torch") is None:
            # Else every rank would print Python's "Error while finding module
            # specification for 'torch.distributed.run'".
            raise LaunchError(
                f"--ddp starts the job with torchrun, which comes with PyTorch, and "
                f"{sys.executable} has no torch: name the Python that has it "
                "(`-- ~/venv/bin/python train.py`), or run your own launcher without --ddp",
                exit_code=127,
            )
    head = [python, "-m", "torch.distributed.run", "--standalone"]
    head.append(f"--nproc-per-node={nproc}")
    if args[0] == "-m":
        return [*head, "-m", *args[1:]]
    if not (script or args[0].endswith(".py")):
        head.append("--no-python")
    return [*head, *args]


def _shebang_python(target: str) -> Optional[str]:
    """The Python a script's `#!` line names (`#!/usr/bin/env python3`: `python3`, found
    on the job's PATH when it starts), or None: no such line, or not a Python."""
    import shutil

    path = target if os.path.isfile(target) else shutil.which(target)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if len(words) != 1 or not _is_python(words[0]):
        return None  # interpreter options are not passed through torchrun
    return words[0]


def _check_ddp_target(args: Sequence[str], script: bool) -> None:
    """Refuse a script, program or module that is not there, with one line: torchrun
    would start every rank only to print a 40-line traceback per failure."""
    if args[0] == "-m":
        # Only the top-level package is looked up, without importing anything: the
        # ranks run with the working directory first on sys.path, as `python -m` does.
        import importlib.machinery

        top = args[1].split(".")[0]
        if not top or (
            top not in sys.builtin_module_names
            and importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path]) is None
        ):
            raise LaunchError(f"--ddp: no module named {args[1]!r}", exit_code=127)
        return
    target = args[0]
    if script:
        if not os.path.isfile(target):
            why = "is not a file" if os.path.exists(target) else "not found"
            raise LaunchError(f"--ddp: script {why}: {target}", exit_code=127)
        return
    import shutil

    if shutil.which(target) is None:
        raise LaunchError(f"command not found: {target}", exit_code=127)


def _foreground_tty() -> Optional[int]:
    """stdin when it is a terminal whose foreground we own (we were started by an
    interactive shell in the foreground); the job is then given the terminal."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _set_foreground(tty: Optional[int], pgid: int) -> None:
    if tty is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # we may be in the background
    try:
        os.tcsetpgrp(tty, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


class LaunchError(UserError):
    pass


class StartedJob:
    """A started job: its pid (also its process group id)."""

    def __init__(self, pid: int, tty: Optional[int]) -> None:
        self.pid = pid
        self.tty = tty
        self._saved: dict[int, Any] = {}
        # Called with each forwarded signal too: a container's runtime stops the
        # container, which is not in the job's process group (gpuwarden.containers).
        self.on_signal: Optional[Callable[[int], object]] = None

    def _forward(self, signum: int, _frame: Optional[FrameType]) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass
        if self.on_signal is not None and signum != signal.SIGCONT:
            self.on_signal(signum)

    def _owns_terminal(self) -> bool:
        try:
            return self.tty is not None and os.tcgetpgrp(self.tty) == self.pid
        except OSError:
            return False

    def _suspend(self) -> None:
        """The job was stopped from the terminal (Ctrl-Z): stop ourselves so the shell
        sees the job stopped, and carry on both when it resumes us (fg/bg)."""
        _set_foreground(self.tty, os.getpgrp())
        os.kill(os.getpid(), signal.SIGSTOP)
        if self.tty is not None and os.tcgetpgrp(self.tty) == os.getpgrp():
            _set_foreground(self.tty, self.pid)
        self._forward(signal.SIGCONT, None)

    def wait(self) -> int:
        """Wait for the job's main process; its exit code, or 128+N if signal N killed it."""
        try:
            while True:
                _, status = os.waitpid(self.pid, os.WUNTRACED)
                if os.WIFSTOPPED(status):
                    stop = os.WSTOPSIG(status)
                    if stop in _TERMINAL_STOPS and self.tty is not None:
                        if stop != signal.SIGTSTP and self._owns_terminal():
                            # It touched the terminal a moment before we handed it over.
                            self._forward(signal.SIGCONT, None)
                        else:
                            self._suspend()
                    continue
                break
        finally:
            _set_foreground(self.tty, os.getpgrp())
            for signum, handler in self._saved.items():
                signal.signal(signum, handler)
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code


def start(
    argv: Sequence[str],
    env: Mapping[str, str],
    pass_fds: Iterable[int] = (),
    numbered: Sequence[int] = (),
) -> StartedJob:
    """Start `argv` in a new process group with `env`, the descriptors `pass_fds` inherited
    (the lease locks), and the wrapper's signals forwarded to the group. `numbered` are
    also given to the job as descriptors 3, 4, ... (what Podman's --preserve-fds passes)."""
    if not argv:
        raise UserError("no command given: put it after --, e.g. `-- python train.py`")
    if not argv[0]:
        # posix_spawnp raises ValueError for it; the shell says "command not found".
        raise LaunchError("command not found: '' (the command name is empty)", exit_code=127)
    fds = tuple(pass_fds)
    tty = _foreground_tty()
    forwarded = [s for s in FORWARDED if s not in _INHERITED_IGNORED]
    # Python ignores SIGPIPE and SIGXFSZ for itself; the job gets the defaults back.
    defaults = [*forwarded, signal.SIGPIPE, signal.SIGXFSZ]
    # Signals wait until the handlers know the job's pid: none is lost or mishandled.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in fds:
            os.set_inheritable(fd, True)
        # Copies above the targets first, so that no dup2 overwrites a later source.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + len(numbered)) for fd in numbered]
        moves = [(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(high)]
        try:
            pid = os.posix_spawnp(
                argv[0],
                list(argv),
                dict(env),
                file_actions=moves,
                setpgroup=0,
                setsigdef=defaults,
                setsigmask=old_mask,
            )
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise LaunchError(f"command not found: {argv[0]}", exit_code=127) from None
            raise LaunchError(
                f"cannot run {argv[0]}: {err.strerror or err}", exit_code=126
            ) from None
        finally:
            for fd in fds:
                os.set_inheritable(fd, False)
            for fd in high:
                os.close(fd)
        _set_foreground(tty, pid)
        job = StartedJob(pid, tty)
        for signum in forwarded:
            job._saved[signum] = signal.signal(signum, job._forward)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return job
