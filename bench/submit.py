"""A CLI `gpuwarden submit` into the queue service against `sbatch`, side by side.

    .venv/bin/python bench/submit.py [--rounds 15] [--clients 1,8]      # root

Starts a queue service here (the simulated four A100s, its own socket and state) and
a throw-away single-node Slurm (scripts/slurm-ci start), then times, interleaved
round by round so the machine's load hits them alike, with `--clients` submissions
at once in each round:

  gpuwarden submit --hold -g 1 -- true     the console script, as a user types it
  sbatch --hold --gres=gpu:1 --wrap true   Slurm's own held submission
  python -c pass                           the interpreter's start, for scale

  with --compare DIR: the same `gpuwarden submit` of another tree (DIR/src first
  on PYTHONPATH; e.g. the previous main), its client into its own service

  with --lab: as a lab's users run it, from the install `scripts/install-system`
  makes (a venv of /usr/bin/python3 holding gpuwarden and its dependencies alone,
  under the bench's folder), each install's console script into a service it
  runs itself; `python -c pass` of that interpreter beside it; with --compare,
  the other tree's install too (each tree's own install-system, from a copy of
  its sources). The checkout's .venv above carries the test tools (torch and
  some 240 packages: its interpreter's start lists them all) and a pyenv build.

Printed: the median wall and CPU time of one submission of each, the ratio
gpuwarden / sbatch (the line: <= 3x, with one client and with eight at once), and
gpuwarden / `python -c pass` (what the client adds to the interpreter's start),
for the checkout's .venv and, with --lab, for the lab's install.
With each gpuwarden row, its service's journal commits and fsyncs over the rounds
(the submits answered in one turn of its loop share an fsync). Then each
service's own share of a submit's wait: its CPU time (every thread of
`gpuwarden serve`, /proc schedstat) over SERVED short submits sent one after
another from here, without a client process each; what the client waits beyond
it is the journal's fsync and the scheduler. `--profile FILE` runs this tree's
service under cProfile (stats to FILE). Every job is held and removed at the end.
Slurm listens on a free pair of ports (`SLURM_CI_PORT` when set), so the bench
runs beside another Slurm.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SPEC = str(ROOT / "tests" / "data" / "idle-4xa100.toml")
LINE = 3.0
SERVED = 200


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{argv[0]} failed: {done.stderr.strip()}")
    return took


def free_port_pair() -> int:
    """A free loopback port whose next one is free too (slurmctld, then slurmd)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with contextlib.suppress(OSError), socket.socket() as t:
            t.bind(("127.0.0.1", port + 1))
            return port
    sys.exit("no two free ports in a row")


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def serve(
    work: Path, name: str, env: dict[str, str], profile: Optional[str], python: str = sys.executable
) -> Any:
    """A queue service of `python` (the tree on env's PYTHONPATH), at env's
    GPUWARDEN_SOCKET."""
    return subprocess.Popen(
        [
            python,
            *(["-m", "cProfile", "-o", profile] if profile else []),
            "-m",
            "gpuwarden",
            "serve",
            "--socket",
            env["GPUWARDEN_SOCKET"],
            "--state-dir",
            str(work / f"service-{name}"),
            "--log-level",
            "WARNING",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# Run with the tree's own PYTHONPATH and the submitter's environment: the message is
# that tree's short client's, as its console script sends it.
SERVING = """
import os, socket, sys
from gpuwarden.queueclient import shortwire, thin
pid, count, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
path = os.environ["GPUWARDEN_SOCKET"]
data = thin._request(argv, path)
def cpu():
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total
before = cpu()
for _ in range(count):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(data)
        reply = shortwire.decoded(shortwire.answer(sock, path))
    if reply.get("code") != 0:
        sys.exit(f"the service at {path} did not take a short submit: {reply}")
print((cpu() - before) / count / 1e9)
"""


def journal(env: dict[str, str]) -> tuple[int, int]:
    """(commits, fsyncs) of the service at env's socket so far (its `stats`)."""
    from gpuwarden.queueclient import protocol

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(env["GPUWARDEN_SOCKET"])
        sock.sendall(protocol.encode({"v": protocol.VERSION, "op": "stats"}))
        decoder, replies = protocol.Decoder(), []
        while not replies:
            data = sock.recv(1 << 20)
            if not data:
                sys.exit(f"the service at {env['GPUWARDEN_SOCKET']} closed the connection")
            replies = decoder.feed(data)
    said = replies[0]["journal"]
    return int(said["commits"]), int(said["fsyncs"])


def served(pid: int, env: dict[str, str], argv: list[str], python: str) -> float:
    """The service's CPU seconds per short submit of `argv`, SERVED of them one after
    another, each on its own connection as the console script sends it."""
    done = subprocess.run(
        [python, "-c", SERVING, str(pid), str(SERVED), *argv],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(done.stderr.strip())
    return float(done.stdout)


def lab_install(tree: Path, work: Path, name: str) -> Path:
    """`tree` installed as a lab installs it (its own scripts/install-system, from a
    copy of its sources: pip builds in the source folder) under work/name: the
    prefix, whose bin/gpuwarden and bin/python the users run."""
    source = work / f"{name}-source"
    for part in ("pyproject.toml", "README.md", "LICENSE"):
        source.mkdir(exist_ok=True)
        shutil.copy2(tree / part, source / part)
    shutil.copytree(tree / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(tree / "scripts", source / "scripts")
    prefix, bindir = work / name, str(work / f"{name}-bin")
    done = subprocess.run(
        [str(source / "scripts" / "install-system"), "--prefix", str(prefix), "--bin", bindir],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"install-system of {tree} failed: {done.stderr.strip()[-2000:]}")
    return prefix


def main() -> int:
    from conditions import bytecode, tree_root

    bytecode()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--clients", default="1,8")
    p.add_argument("--compare", metavar="DIR", help="also time the submit of the tree in DIR")
    p.add_argument("--profile", metavar="FILE", help="run the service under cProfile, to FILE")
    p.add_argument(
        "--lab", action="store_true", help="also time the lab's install (scripts/install-system)"
    )
    args = p.parse_args()
    if args.compare:
        args.compare = str(tree_root(args.compare))
        bytecode((Path(args.compare),))
    if os.geteuid() != 0:
        sys.exit("run as root: the service and Slurm's daemons are")
    work = Path(tempfile.mkdtemp(prefix="gw-bench-submit-"))
    work.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "SLURM_"))}
    env.update(
        PYTHONPATH=str(ROOT / "src"),
        GPUWARDEN_SIM=SPEC,
        GPUWARDEN_SIM_STATE=str(work / "sim"),
        GPUWARDEN_LEASE_DIR=str(work / "leases"),
        GPUWARDEN_STATE_DIR=str(work / "state"),
        GPUWARDEN_SYSTEM_CONFIG=str(work / "etc" / "config.toml"),
        XDG_CONFIG_HOME=str(work / "xdg"),
        GPUWARDEN_SOCKET=str(work / "gw.sock"),
        SLURM_CI_PORT=os.environ.get("SLURM_CI_PORT") or str(free_port_pair()),
        SLURM_CONF=str(work / "slurm" / "slurm.conf"),
    )
    slurm = str(ROOT / "scripts" / "slurm-ci")
    labs: dict[str, Path] = {}  # row -> the install's prefix
    trees = {"lab: gpuwarden submit": ROOT} if args.lab else {}
    if args.lab and args.compare:
        trees["lab: before"] = Path(args.compare)
    try:
        for name, tree in trees.items():
            labs[name] = lab_install(tree, work, f"lab{len(labs)}")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    cases = {
        "gpuwarden submit --hold": [
            str(BIN / "gpuwarden"),
            "submit",
            "--hold",
            "-g",
            "1",
            "--output",
            "/dev/null",
            "--",
            "true",
        ],
        "sbatch --hold": [
            "sbatch",
            "--hold",
            "-Q",
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            "-D",
            str(work),
            "--wrap",
            "true",
        ],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    envs = {name: env for name in cases}
    pythons = {name: sys.executable for name in cases}  # each service's and client's
    services = {"gpuwarden submit --hold": serve(work, "this", env, args.profile)}

    def own_service(name: str, tag: str, argv: list[str], python: str, **more: str) -> None:
        """A row of `argv` submitting into a service of its own (`python`'s); an empty
        value in `more` unsets that variable."""
        cases[name] = argv
        envs[name] = {
            k: v
            for k, v in dict(
                env,
                GPUWARDEN_SOCKET=str(work / f"{tag}.sock"),
                GPUWARDEN_SIM_STATE=str(work / f"sim-{tag}"),
                GPUWARDEN_LEASE_DIR=str(work / f"leases-{tag}"),
                **more,
            ).items()
            if v
        }
        pythons[name] = python
        services[name] = serve(work, tag, envs[name], None, python)

    submit = cases["gpuwarden submit --hold"]
    if args.compare:
        name = f"before ({args.compare})"
        own_service(name, "before", submit, sys.executable, PYTHONPATH=f"{args.compare}/src")
    for i, (name, prefix) in enumerate(labs.items()):  # each runs its own gpuwarden
        own_service(
            name,
            f"lab{i}",
            [str(prefix / "bin" / "gpuwarden"), *submit[1:]],
            str(prefix / "bin" / "python"),
            PYTHONPATH="",
        )
        if i == 0:
            cases["lab: python -c pass"] = [str(prefix / "bin" / "python"), "-c", "pass"]
            envs["lab: python -c pass"] = envs[name]
    results: dict[int, dict[str, tuple[float, float]]] = {}
    service_cpu: dict[str, float] = {}
    shared: dict[tuple[int, str], tuple[int, int]] = {}  # the rounds' commits, fsyncs
    try:
        subprocess.run([slurm, "start", str(work / "slurm")], check=True, env=env)
        for _ in range(100):
            if all(os.path.exists(envs[name]["GPUWARDEN_SOCKET"]) for name in services):
                break
            time.sleep(0.1)
        for name, argv in cases.items():  # warm: bytecode, page cache, the daemons
            timed(argv, envs[name])
        load = os.getloadavg()[0]
        for clients in (int(c) for c in args.clients.split(",")):
            times: dict[str, list[float]] = {name: [] for name in cases}
            cpus: dict[str, list[float]] = {name: [] for name in cases}
            was = {name: journal(envs[name]) for name in services}
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                for _ in range(args.rounds):
                    for name, argv in cases.items():
                        cpu = cpu_of_children()
                        e = envs[name]
                        took = list(pool.map(lambda _i, a=argv, e=e: timed(a, e), range(clients)))
                        times[name] += took
                        cpus[name].append((cpu_of_children() - cpu) / clients)
            results[clients] = {
                n: (statistics.median(times[n]), statistics.median(cpus[n])) for n in cases
            }
            for name in services:
                commits, fsyncs = journal(envs[name])
                shared[clients, name] = (commits - was[name][0], fsyncs - was[name][1])
        after = os.getloadavg()[0]
        for name, proc in services.items():
            service_cpu[name] = served(proc.pid, envs[name], cases[name][2:], pythons[name])
    finally:
        subprocess.run(["scancel", "-u", "root"], env=env, capture_output=True)
        subprocess.run([slurm, "stop", str(work / "slurm")], env=env, capture_output=True)
        for proc in services.values():
            proc.send_signal(signal.SIGTERM)
        for proc in services.values():
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print(f"median of {args.rounds} rounds, interleaved; load average {load:.2f} -> {after:.2f}")
    ok = True
    for clients, got in results.items():
        print(f"{clients} client(s) at once:")
        for name, (wall, cpu) in got.items():
            commits, fsyncs = shared.get((clients, name), (0, 0))
            its = f"   the journal's fsyncs {fsyncs} for {commits} commits" if commits else ""
            print(f"  {name:<26} wall {wall * 1000:7.1f} ms   cpu {cpu * 1000:6.1f} ms{its}")
        pairs = [("", "gpuwarden submit --hold", "python -c pass")]
        if args.lab:
            pairs.append(("lab: ", "lab: gpuwarden submit", "lab: python -c pass"))
        for tag, ours, floor_row in pairs:
            ratio = got[ours][0] / got["sbatch --hold"][0]
            floor = got[floor_row][0] / got["sbatch --hold"][0]
            over = got[ours][0] / got[floor_row][0]
            ok = ok and ratio <= LINE
            print(
                f"  {tag}gpuwarden submit / sbatch = {ratio:.2f} (line <= {LINE:.0f}); "
                f"python -c pass / sbatch = {floor:.2f}; gpuwarden submit / python -c pass = "
                f"{over:.2f}"
            )
    print(f"the service's CPU per short submit ({SERVED} one after another):")
    for name, cpu in service_cpu.items():
        print(f"  {name:<26} {cpu * 1000:6.2f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
