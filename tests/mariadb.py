"""A MariaDB server of a test's own (Debian's mariadb-server): a new data directory under
the test's, a unix socket there and no TCP port, no option file read (`--no-defaults`),
no systemd; stopped and gone with the directory. Any other MariaDB on this machine, and
/etc/mysql, are never touched. Clients reach it through `socket` (slurmdbd: the
MYSQL_UNIX_PORT variable, which MariaDB's client library reads for `localhost`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from waiting import wait_for

SERVER = "/usr/sbin/mariadbd"


def missing() -> str:
    """Why a test MariaDB cannot run here ('' when it can)."""
    if os.geteuid() != 0:
        return "a test MariaDB needs root (it runs as the mysql user)"
    if not os.path.exists(SERVER) or shutil.which("mariadb-install-db") is None:
        return "MariaDB is not installed (Debian: mariadb-server)"
    return ""


class MariaDB:
    def __init__(self, top: Path) -> None:
        self.data = top / "mariadb"
        self.socket = str(self.data / "mysqld.sock")
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        self.data.mkdir(mode=0o755)
        shutil.chown(self.data, "mysql", "mysql")
        made = subprocess.run(
            [
                *("mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={self.data}"),
                *("--auth-root-authentication-method=socket", "--skip-test-db"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        log = self.data / "error.log"
        self.proc = subprocess.Popen(
            [
                *(SERVER, "--no-defaults", "--user=mysql", f"--datadir={self.data}"),
                *(f"--socket={self.socket}", f"--pid-file={self.data}/mysqld.pid"),
                *("--skip-networking", f"--log-error={log}"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, log.read_text()[-2000:]
            return self.sql("SELECT 1").returncode == 0

        wait_for(up, 60, lambda: f"MariaDB answering on {self.socket}", 0.2)

    def sql(self, statement: str) -> subprocess.CompletedProcess[str]:
        """One statement as MariaDB's root (this machine's root, by the socket's peer)."""
        return subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self.socket}", "-u", "root", "-e", statement],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # mariadbd shuts down cleanly on SIGTERM
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
