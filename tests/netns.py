"""Hosts for tests of several machines, made on this one: each is a network namespace
(`ip netns`) with its own address on a veth pair to this namespace and, where a test
starts one, its own hostname (a UTS namespace per daemon) and sshd.

Addresses are /30 pairs in 10.231.0.0/16, in a /24 no interface here uses yet, so
traffic only ever goes to addresses these namespaces own. `Lab.close()` ends every
process started in them and deletes the namespaces (their veths go with them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

SSHD = "/usr/sbin/sshd"


def missing() -> str:
    """Why namespaced hosts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux, openssh-client)"
    if not os.path.exists(SSHD):
        return f"no sshd at {SSHD} (openssh-server)"
    return ""


def _ip(*argv: str, ns: Optional[str] = None) -> None:
    full = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *argv]
    done = subprocess.run(full, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(full)}: {done.stderr.strip()}")


def _free_subnet() -> int:
    """A third octet of 10.231.X.0/24 that no interface here has an address in."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    start = os.getpid() % 250
    for step in range(250):
        third = (start + step) % 250
        if f" 10.231.{third}." not in used:
            return third
    raise RuntimeError("every 10.231.X.0/24 is in use")


class Host:
    def __init__(self, name: str, ns: str, address: str, peer: str) -> None:
        self.name = name  # its hostname, for the daemons a test starts in it
        self.ns = ns
        self.address = address  # the namespace's own address
        self.peer = peer  # this namespace's address on the same link
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: Path, env: Optional[dict[str, str]] = None) -> None:
        """A daemon in this host's namespace, under its own hostname (a UTS namespace)."""
        script = 'hostname "$0" && exec "$@"'
        full = ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", script]
        with open(log, "ab") as out:
            self.procs.append(
                subprocess.Popen(
                    [*full, self.name, *argv],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            )

    def pids(self) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split() if p.isdigit()]

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """Every process in the namespace (its daemons and what they started)."""
        deadline = time.monotonic() + 10
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, sig)
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


class Lab:
    """`Lab(["node1", "node2"])`: one namespace per name, each reachable from here."""

    def __init__(self, names: list[str]) -> None:
        self.tag = f"gw{os.getpid() % 100000}"
        self.hosts: list[Host] = []
        third = _free_subnet()
        try:
            for i, name in enumerate(names):
                ns, here, there = f"{self.tag}{name}", f"{self.tag}h{i}", f"{self.tag}n{i}"
                mine, theirs = f"10.231.{third}.{4 * i + 1}", f"10.231.{third}.{4 * i + 2}"
                _ip("netns", "add", ns)
                self.hosts.append(Host(name, ns, theirs, mine))
                _ip("link", "add", here, "type", "veth", "peer", "name", there)
                _ip("link", "set", there, "netns", ns)
                _ip("addr", "add", f"{mine}/30", "dev", here)
                _ip("link", "set", here, "up")
                _ip("addr", "add", f"{theirs}/30", "dev", there, ns=ns)
                _ip("link", "set", there, "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for host in self.hosts:
            host.stop_all()
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", host.ns)  # its end of the veth goes, and with it ours


def wait_port(host: Host, port: int, deadline: float = 20) -> None:
    """Until something accepts connections on host.address:port (from this namespace)."""
    import socket

    end = time.monotonic() + deadline
    while True:
        with socket.socket() as s:
            s.settimeout(1)
            try:
                s.connect((host.address, port))
                return
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError(f"nothing listens on {host.address}:{port}") from None
        time.sleep(0.05)
