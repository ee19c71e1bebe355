"""`gpuwarden service uninstall [--purge [--force]]`: take away what `service install` made.

What install wrote and made is in its manifest (service.install); uninstall removes
exactly that, puts back what it changed, and leaves whatever an admin edited since,
naming it (`--purge` removes a file install wrote even so, as a package's purge
removes its edited configuration). The service's own lock files in the lease
directory go too, unless a job still running holds one (as with any stop, jobs
finish on their own). The manifest stays with the journal, so that a later
`--purge` still knows what install made; `--purge` removes both, and the service's
drains and XID log, saying what it removes, and refuses while the journal holds
queued or running jobs unless `--force`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from typing import Any

from gpuwarden.base.errors import UserError
from gpuwarden.service.install import (
    CONFIG_DIR,
    DIRECTORIES,
    EXPORTER_DROPIN_DIR,
    LEASE_DIR,
    MANIFEST,
    RUN_DIR,
    SERVICE_DIR,
    STATE_DIR,
    _at,
    _read_existing,
    _read_manifest,
    _sha,
)


def uninstall(root: str = "/", purge: bool = False, force: bool = False) -> list[str]:
    """Remove what the manifest says install made, restore what it changed, and keep
    the journal and the manifest unless `purge`. Anything changed since by an admin is
    left and named, unless `purge` (a file install wrote goes even so). `purge`
    refuses, changing nothing, while jobs are queued or running, unless `force`."""
    if os.geteuid() != 0 and root in ("", "/"):
        raise UserError("removing the service needs root (sudo gpuwarden service uninstall)")
    manifest = _read_manifest(root)
    if not (manifest.files or manifest.dirs or manifest.appended):
        raise UserError(
            f"nothing to remove: no install manifest at {_at(root, MANIFEST)} "
            "(`gpuwarden service install` writes it)"
        )
    if purge and not force:
        active = _active_jobs(_at(root, SERVICE_DIR))
        if active:
            raise UserError(
                f"the journal holds {active} queued or running job(s), which --purge would "
                "lose: cancel them (`gpuwarden cancel -u USER`) or wait, or add --force; "
                "nothing was removed"
            )
    lines: list[str] = []
    for path, sha in sorted(manifest.files.items()):
        where = _at(root, path)
        existing = _read_existing(where)
        if existing is None:
            lines.append(f"already gone {where}")
        elif _sha(existing) != sha and not purge:
            lines.append(f"left {where}: edited since install (--purge removes it)")
        elif _sha(existing) != sha:  # as a package's purge takes its edited conffiles
            os.unlink(where)
            lines.append(f"removed {where} (--purge), edited since install")
        else:
            os.unlink(where)
            lines.append(f"removed {where}")
    for path, text in manifest.appended.items():
        lines.append(_unappend(_at(root, path), text))
    for name in ("gpuwarden.sock", "gpuwarden.sock.lock"):  # a stopped service's own
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_at(root, os.path.join(RUN_DIR, name)))
            lines.append(f"removed {_at(root, os.path.join(RUN_DIR, name))}")
    lines.extend(_service_files(_at(root, LEASE_DIR), "lock file(s)"))
    if purge:
        lines.extend(_service_files(_at(root, STATE_DIR), "drain and XID record(s)"))
        lines.append(_purge(_at(root, SERVICE_DIR)))
    for path in (CONFIG_DIR, EXPORTER_DROPIN_DIR, *(p for p, _ in reversed(DIRECTORIES))):
        before = manifest.dirs.get(path)
        if before is not None:
            lines.append(_undo_dir(_at(root, path), before))
    if not purge and os.path.isdir(_at(root, SERVICE_DIR)):
        lines.append(
            f"kept the job journal and the install record in {_at(root, SERVICE_DIR)} "
            "(--purge removes them)"
        )
    return [line for line in lines if line]


def _active_jobs(folder: str) -> int:
    """How many jobs the journal in `folder` holds queued or running (0: no journal)."""
    journal = os.path.join(folder, "jobs.db")
    if not os.path.exists(journal):
        return 0
    import sqlite3

    from gpuwarden.service import store

    try:
        with contextlib.closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as db:
            marks = ",".join("?" * len(store.ACTIVE))
            row = db.execute(
                f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})", tuple(store.ACTIVE)
            ).fetchone()
    except sqlite3.Error as err:
        raise UserError(
            f"cannot read the journal {journal} ({err}) to see whether jobs are queued; "
            "--force purges it anyway"
        ) from None
    return int(row[0])


def _purge(folder: str) -> str:
    """Remove the service's folder (the journal, job records, the install record)."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return ""
    shutil.rmtree(folder, ignore_errors=True)
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    return f"removed {folder} (--purge): {shown or 'empty'}"


def _service_files(folder: str, what: str) -> list[str]:
    """Remove the service's (root's) regular files in `folder` that nobody holds: a lock
    held now is a running job's lease, left for it. Another user's file is left too."""
    removed, held = 0, []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # a symlink, or gone
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                held.append(name)
                continue
            os.unlink(path)
            removed += 1
        finally:
            os.close(fd)
    lines = [f"removed {removed} of the service's {what} in {folder}"] if removed else []
    if held:
        lines.append(f"left {len(held)} in {folder}: held by running jobs ({', '.join(held[:3])})")
    return lines


def _unappend(where: str, text: str) -> str:
    existing = _read_existing(where)
    raw = text.encode("utf-8")
    if existing is None or raw not in existing:
        return f"left {where}: the [service] table install appended was changed since"
    from gpuwarden.files.safefiles import write_atomic

    st = os.lstat(where)
    index = existing.rindex(raw)
    write_atomic(where, existing[:index] + existing[index + len(raw) :], mode=0o644, what=where)
    os.chmod(where, stat.S_IMODE(st.st_mode))
    with contextlib.suppress(OSError):
        os.chown(where, st.st_uid, st.st_gid)
    return f"removed the [service] table install appended to {where}"


def _undo_dir(where: str, before: dict[str, Any]) -> str:
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        return ""
    if not stat.S_ISDIR(st.st_mode):
        return f"left {where}: no longer a directory"
    if before["created"]:
        try:
            os.rmdir(where)
        except OSError:
            return f"left {where}: not empty"
        return f"removed {where}"
    os.chmod(where, before["mode"])
    with contextlib.suppress(OSError):
        os.chown(where, before["uid"], before["gid"])
    return f"restored {where} to mode {before['mode']:04o}"
