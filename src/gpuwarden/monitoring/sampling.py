"""Recording: one CSV row per GPU per sample, like `nvidia-smi dmon` plus who held it.

Long format (a row per GPU per sample) rather than one wide row per sample, so
a file stays readable by spreadsheets, pandas and `gpuwarden plot` even when
GPUs come and go. Files rotate by size (`record.max_bytes`): FILE.csv becomes
FILE.csv.1 (the older .1 becomes .2, ...), so a forgotten recorder never fills
the disk.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.machine.inventory import Snapshot

COLUMNS = (
    "time",  # ISO 8601, local time with offset
    "epoch",  # seconds since 1970, for arithmetic
    "gpu",  # nvidia-smi index
    "uuid",
    "model",
    "sm_pct",  # dmon's sm: utilization.gpu
    "mem_pct",  # dmon's mem: utilization.memory
    "fb_used_mib",
    "fb_total_mib",
    "temp_c",
    "pwr_w",
    "pclk_mhz",
    "health",
    "drained",  # the drain reason, empty when in service
    "lease_users",  # ';'-joined
    "lease_jobs",
    "users",  # owners of processes on the GPU, ';'-joined
    "pids",  # pid:MiB;pid:MiB
)
KEEP = 3  # rotated files kept beside the current one


def _num(value: Optional[float], digits: int = 0) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}f}"


def rows(
    snapshot: Snapshot,
    leases: Iterable[Any] = (),
    drains: Optional[Mapping[str, Any]] = None,
    health: Optional[Mapping[str, str]] = None,
) -> list[list[str]]:
    """The CSV rows for one snapshot (pure)."""
    drains = drains or {}
    health = health or {}
    by_gpu: dict[str, list] = {}
    for lease in leases:
        by_gpu.setdefault(lease.uuid, []).append(lease)
    stamp = datetime.fromtimestamp(snapshot.taken_at, timezone.utc).astimezone()
    out = []
    for gpu in snapshot.gpus:
        mine = by_gpu.get(gpu.uuid, [])
        procs = sorted(gpu.processes, key=lambda p: p.pid)
        users = sorted({p.user for p in procs if p.user})
        drain = drains.get(gpu.uuid)
        out.append(
            [
                stamp.isoformat(timespec="seconds"),
                f"{snapshot.taken_at:.3f}",
                str(gpu.index),
                gpu.uuid,
                gpu.name or "",
                _num(gpu.utilization_gpu),
                _num(gpu.utilization_memory),
                _num(None if gpu.memory_used is None else gpu.memory_used / 2**20),
                _num(None if gpu.memory_total is None else gpu.memory_total / 2**20),
                _num(gpu.temperature),
                _num(gpu.power_draw, 1),
                _num(gpu.clock_sm),
                "lost" if gpu.lost else health.get(gpu.uuid, ""),
                "" if drain is None else (getattr(drain, "reason", "") or "drained"),
                ";".join(sorted({lease.user for lease in mine})),
                ";".join(sorted({lease.job or str(lease.pid) for lease in mine})),
                ";".join(users),
                ";".join(
                    f"{p.pid}:{_num(None if p.used_memory is None else p.used_memory / 2**20)}"
                    for p in procs
                ),
            ]
        )
    return out


def to_csv(table: Iterable[Iterable[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(table)
    return buf.getvalue()


class Recorder:
    """Appends samples to a CSV file, rotating it when it grows past `max_bytes`."""

    def __init__(self, path: str, max_bytes: int = 100 * 2**20, keep: int = KEEP) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self.header = to_csv([COLUMNS])
        self._check()

    def _fail(self, err: OSError) -> UserError:
        return UserError(f"cannot write {self.path}: {err.strerror or err}")

    def _check(self) -> None:
        """Fail now, in one line, rather than at the first sample."""
        # os.path.isdir, not Path.is_dir: the latter raises PermissionError for a path
        # in a directory this user cannot enter; the open below then says so in one line.
        if os.path.isdir(self.path):
            raise UserError(f"cannot write {self.path}: it is a directory")
        try:
            with open(self.path, "a", encoding="utf-8"):
                pass
        except OSError as err:
            raise self._fail(err) from None
        try:
            with open(self.path, encoding="utf-8") as fh:
                first = fh.readline()
        except (OSError, UnicodeDecodeError):
            first = "?"
        if first and first != self.header:
            raise UserError(
                f"{self.path} is not a gpuwarden recording (its first line differs); "
                "choose a new file"
            )

    def write(self, text: str) -> None:
        try:
            size = self.path.stat().st_size if self.path.exists() else 0
            if size and self.max_bytes and size + len(text) > self.max_bytes:
                self._rotate()
                size = 0
            with open(self.path, "a", encoding="utf-8") as fh:
                if size == 0:
                    fh.write(self.header)
                fh.write(text)
        except OSError as err:
            raise self._fail(err) from None

    def _rotate(self) -> None:
        oldest = self.path.with_name(f"{self.path.name}.{self.keep}")
        if oldest.exists():
            oldest.unlink()
        for n in range(self.keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{n}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()


def sample(read: Optional[Callable[[], Snapshot]] = None) -> list[list[str]]:
    """Read the machine once and return its rows, with leases, drains and health."""
    from gpuwarden.health.judgement import judge, level
    from gpuwarden.health.xidlog import xids_seen

    if read is None:
        from gpuwarden.machine.inventory import read_snapshot

        snap = read_snapshot()
    else:
        snap = read()
    from gpuwarden.health.drain import list_drains
    from gpuwarden.leases import list_leases

    leases = list_leases()
    drains = list_drains()
    xids = xids_seen()
    health = {g.uuid: level(judge(g, xids.get(g.uuid, ()))) for g in snap.gpus}
    return rows(snap, leases, drains, health)


def record(
    path: str,
    *,
    interval: float = 1.0,
    count: Optional[int] = None,
    max_bytes: int = 100 * 2**20,
    read: Optional[Callable[[], Snapshot]] = None,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Optional[Callable[[int], None]] = None,
) -> int:
    """Sample every `interval` seconds, `count` times (forever when None); returns
    the number of samples written. Drift-free: sleeps to the next tick."""
    recorder = Recorder(path, max_bytes=max_bytes)
    done = 0
    start = time.monotonic()
    while count is None or done < count:
        recorder.write(to_csv(sample(read)))
        done += 1
        if on_sample is not None:
            on_sample(done)
        if count is not None and done >= count:
            break
        next_tick = start + done * interval
        sleep(max(0.0, next_tick - time.monotonic()))
    return done


def read_csv(path: str) -> list[dict[str, str]]:
    """A recording's rows as dicts; raises UserError for a missing or foreign file."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or not {"epoch", "gpu", "sm_pct"} <= set(
                reader.fieldnames
            ):
                raise UserError(
                    f"{path} is not a gpuwarden recording (no epoch/gpu/sm_pct columns)"
                )
            return list(reader)
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise UserError(f"cannot read {path}: {err}") from None
