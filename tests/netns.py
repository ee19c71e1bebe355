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

from waiting import wait_for

SSHD = "/usr/sbin/sshd"


def missing() -> str:
    """Why namespaced hosts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare", "ssh", "ssh-keygen"):
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

    def start(
        self,
        argv: list[str],
        log: Path,
        env: Optional[dict[str, str]] = None,
        prelude: str = "",
    ) -> None:
        """A daemon in this host's namespace, under its own hostname (a UTS namespace).
        With a `prelude` (shell commands, e.g. `mount --bind` of this host's own
        /etc/passwd), it runs first in a mount namespace of the daemon's own, so what
        it mounts is this host's alone, as on another machine."""
        script = 'hostname "$0" && ' + (f"{prelude} && " if prelude else "") + 'exec "$@"'
        # nsenter, not `ip netns exec`: that one also remounts /sys for the namespace,
        # which hides the cgroup file systems mounted under it (slurmd needs them).
        net = f"--net=/run/netns/{self.ns}"
        private = ["--mount", "--propagation", "private"] if prelude else []
        full = ["nsenter", net, "unshare", "--uts", *private, "sh", "-c", script]
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
                # The rest of the lab's addresses through this namespace (a controller
                # here reached on another host's link address); nothing beyond them.
                _ip("route", "add", f"10.231.{third}.0/24", "via", mine, ns=ns)
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

    refused: list[OSError] = []

    def accepts() -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            try:
                s.connect((host.address, port))
            except OSError as err:
                refused[:] = [err]
                return False
            return True

    wait_for(accepts, deadline, lambda: f"something listening on {host.address}:{port} {refused}")


class SshLab:
    """Hosts with an sshd each, and a real user who reaches them with a key made for the
    test (~/.ssh/config names each host; known_hosts holds their key). `env[name]` is
    what that host's sshd gives every session (SetEnv): its simulated machine and where
    its leases and state live, as a site's sshd or shell profile would."""

    def __init__(
        self,
        top: Path,
        user: str,
        python: list[str],
        path: str,
        env: dict[str, dict[str, str]],
        preludes: Optional[dict[str, str]] = None,
    ) -> None:
        import pwd

        self.top, self.user, self.python, self.path = top, user, python, path
        account = pwd.getpwnam(user)
        self.home = Path(account.pw_dir)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(top / "host_key")],
            check=True,
        )
        self.lab = Lab(list(env))
        self.hosts = {h.name: h for h in self.lab.hosts}
        try:
            self._user_ssh(account.pw_uid, account.pw_gid)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-sep dir
            for host in self.lab.hosts:
                conf = self._sshd_config(host, {**env[host.name], "PYTHONPATH": path})
                prelude = (preludes or {}).get(host.name, "")
                host.start(
                    [SSHD, "-D", "-e", "-f", str(conf)], top / f"{host.name}.log", None, prelude
                )
            for host in self.lab.hosts:
                wait_port(host, 22)
        except BaseException:
            self.close()
            raise

    def _sshd_config(self, host: Host, env: dict[str, str]) -> Path:
        conf = self.top / f"sshd-{host.name}.conf"
        conf.write_text(
            f"ListenAddress {host.address}\nHostKey {self.top / 'host_key'}\nPidFile none\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            "PermitRootLogin no\n"
            "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()) + "\n"
        )
        return conf

    def _user_ssh(self, uid: int, gid: int) -> None:
        """The user's key (authorized on every host: one home here), known hosts, config."""
        ssh = self.home / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        key = ssh / "gw_test_key"
        for old in (key, key.with_suffix(".pub")):
            old.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (ssh / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
        hostkey = " ".join((self.top / "host_key.pub").read_text().split()[:2])
        addresses = ",".join(h.address for h in self.lab.hosts)
        (ssh / "known_hosts_gw").write_text(f"{addresses} {hostkey}\n")
        (ssh / "config").write_text(
            "".join(
                f"Host {h.name}\n  HostName {h.address}\n  IdentityFile {key}\n"
                f"  UserKnownHostsFile {ssh / 'known_hosts_gw'}\n  StrictHostKeyChecking yes\n"
                for h in self.lab.hosts
            )
        )
        for path in (ssh, *ssh.iterdir()):
            os.chown(path, uid, gid)
            path.chmod(0o700 if path.is_dir() else 0o600)

    def cli(self, *argv: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        """`gpuwarden ARGV` as the test user, from this namespace; the hosts run the same
        gpuwarden (`hosts.command`)."""
        full = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": self.path,
            "GPUWARDEN_SYSTEM_CONFIG": str(self.top / "none.toml"),
            "GPUWARDEN_HOSTS_COMMAND": f"{' '.join(self.python)} -m gpuwarden",
            **env,
        }
        words = [f"{k}={v}" for k, v in full.items()]
        command = ["runuser", "-u", self.user, "--", "env", "-i", *words, *self.python]
        return subprocess.run(
            [*command, "-m", "gpuwarden", *argv], capture_output=True, text=True, timeout=timeout
        )

    def close(self) -> None:
        self.lab.close()
        shutil.rmtree(self.home / ".ssh", ignore_errors=True)


def ssh_lab(top: Path, specs: dict[str, str], preludes: Optional[dict[str, str]] = None) -> SshLab:
    """An SshLab whose hosts simulate `specs[name]`, each with its own state under top,
    reached by the test user gw-hosts (useradd'ed once); `preludes[name]` runs before
    that host's sshd, in a mount namespace of its own (Host.start)."""
    import subprocess as sp

    from pythons import python_for
    from users import make_user

    person = make_user("hosts")
    # useradd locks a new account ("!" for a password), and sshd refuses a locked account
    # even a key: "*" is no password at all, not a lock.
    sp.run(["usermod", "-p", "*", person.name], check=True)
    python, path = python_for(person.name)
    env = {}
    for name, spec in specs.items():
        state = top / name
        state.mkdir(mode=0o755)
        env[name] = {
            "GPUWARDEN_SIM": spec,
            "GPUWARDEN_SIM_STATE": str(state / "sim"),
            "GPUWARDEN_LEASE_DIR": str(state / "leases"),
            "GPUWARDEN_STATE_DIR": str(state / "state"),
            "GPUWARDEN_SYSTEM_CONFIG": str(top / "none.toml"),
            "GPUWARDEN_SOCKET": str(state / "gpuwarden.sock"),  # a test may start one
        }
    return SshLab(top, person.name, python, path, env, preludes)
