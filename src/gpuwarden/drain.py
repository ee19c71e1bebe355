"""Drains: GPUs taken out of service with a reason, persisted and keyed by UUID.

Each drain is its own small JSON file, `drain.<UUID>.json`, in the state
directory (`gpuwarden.config.state_dir()`). One file per drain, owned by the
person who drained, lets the kernel enforce the rule "only the person who
drained or root may undrain" in the shared system directory: it is sticky, so
nobody else can delete or replace that file. The tool checks the same rule
first so the refusal is a clear line rather than EPERM.

Writes are atomic (temporary file, fsync, rename, fsync of the directory) and
serialised by an flock on `drains.lock`, so a reader never sees half a record
and two people draining at once do not lose either reason. Readers take no lock.
A record that cannot be read still counts as a drain: a GPU is never put back
into service by a corrupt file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

from gpuwarden.errors import UserError
from gpuwarden.records import record

TYPE_CHECKING = False  # typing costs ~2.5 ms to import; annotations need it only here
if TYPE_CHECKING:
    from typing import Optional, Union

    PathLike = Union[str, "os.PathLike[str]"]

PREFIX, SUFFIX = "drain.", ".json"
LOCK_NAME = "drains.lock"


@record
class Drain:
    """A GPU out of service: who took it out, when and why (one file on disk)."""

    uuid: str
    reason: str
    by: str  # user name, or "gpuwarden-health" for an automatic drain
    at: float  # time.time()
    auto: bool = False  # set by the health watch rather than a person
    uid: Optional[int] = None  # owner of the record: who may undrain (with root)


def _directory(directory: Optional[PathLike]) -> str:
    # Strings, not Paths: `status` and `run` list the drains, and pathlib costs ~3 ms
    # to import there.
    if directory is not None:
        return os.fspath(directory)
    from gpuwarden.config import state_location

    return state_location()


def _record_path(directory: str, uuid: str) -> str:
    if not uuid or "/" in uuid or uuid.startswith("."):
        raise UserError(f"invalid GPU UUID {uuid!r}")
    return os.path.join(directory, f"{PREFIX}{uuid}{SUFFIX}")


def _read(path: str) -> Drain:
    uuid = os.path.basename(path)[len(PREFIX) : -len(SUFFIX)]
    try:
        st = os.lstat(path)
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return Drain(
            uuid=uuid,
            reason=str(data.get("reason", "")),
            by=str(data.get("by", "?")),
            at=float(data.get("at", st.st_mtime)),
            auto=bool(data.get("auto", False)),
            uid=st.st_uid,
        )
    except (OSError, ValueError, TypeError, AttributeError) as err:
        try:
            st = os.lstat(path)
            at, uid = st.st_mtime, st.st_uid
        except OSError:
            at, uid = 0.0, None
        return Drain(uuid, f"unreadable drain record {path} ({err})", "?", at, False, uid)


def list_drains(directory: Optional[PathLike] = None) -> dict[str, Drain]:
    """Current drains by UUID (empty when the state directory does not exist yet)."""
    where = _directory(directory)
    try:
        names = os.listdir(where)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as err:
        raise UserError(f"cannot read drains in {where}: {err.strerror}") from None
    drains = {}
    for name in sorted(names):
        if name.startswith(PREFIX) and name.endswith(SUFFIX) and len(name) > 11:
            record = _read(os.path.join(where, name))
            drains[record.uuid] = record
    return drains


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    import fcntl

    from gpuwarden.paths import ensure_dir

    ensure_dir(directory, "state directory")
    # Read-only is enough for flock, and lets every user of a shared directory lock
    # a file that its first user created.
    fd = os.open(
        os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _may_change(record: Drain) -> bool:
    return os.getuid() == 0 or record.uid is None or record.uid == os.getuid()


def drain(
    uuid: str,
    reason: str,
    *,
    by: str | None = None,
    auto: bool = False,
    directory: Optional[PathLike] = None,
) -> Drain:
    """Take `uuid` out of service. Draining again updates the reason; a GPU drained
    by someone else raises UserError (only they or root may change it)."""
    from gpuwarden.paths import user_name

    if not reason or not reason.strip():
        raise UserError("a drain needs a reason (--reason TEXT), so others know why")
    where = _directory(directory)
    path = _record_path(where, uuid)
    record = Drain(uuid, reason.strip(), by or user_name(), time.time(), auto, os.getuid())
    with _locked(where):
        if os.path.lexists(path):
            old = _read(path)
            if not _may_change(old):
                raise UserError(
                    f"{uuid} is already drained by {old.by}: {old.reason} "
                    f"(only {old.by} or root may change it)"
                )
        body = {
            "uuid": uuid,
            "reason": record.reason,
            "by": record.by,
            "at": record.at,
            "auto": auto,
            "uid": record.uid,
        }
        _write_atomic(path, json.dumps(body, indent=1) + "\n")
    return record


def _write_atomic(path: str, text: str) -> None:
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UserError(f"cannot write drain record {path}: {err.strerror}") from None
    dir_fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def undrain(uuid: str, *, by: str | None = None, directory: Optional[PathLike] = None) -> None:
    """Put `uuid` back into service. Raises UserError if it is not drained, or was
    drained by someone else and the caller is not root."""
    where = _directory(directory)
    path = _record_path(where, uuid)
    with _locked(where):
        if not os.path.lexists(path):
            raise UserError(f"{uuid} is not drained")
        old = _read(path)
        if not _may_change(old):
            raise UserError(
                f"{uuid} was drained by {old.by} ({old.reason}); only {old.by} or root may "
                "undrain it"
            )
        try:
            os.unlink(path)
        except OSError as err:
            raise UserError(f"cannot remove drain record {path}: {err.strerror}") from None
