"""Reading and writing the small state files kept in directories other users can write.

A lease, ticket, drain or XID file in a shared directory may have been made by an
adversary: a FIFO (a plain `open()` for reading blocks forever), a symlink to
`/dev/zero` (a plain `read()` never ends), a device, a directory, a huge file, or
well-formed JSON with fields of the wrong type. Every reader here opens with
`O_NONBLOCK` and `O_NOFOLLOW` (a config file's symlink, judged by `config.trust`
first, is followed), accepts only a regular file, and reads at most a bound;
the caller validates each field. Every writer writes a temporary file of its own
and renames it, so a reader never sees half a record; `sweep_temporaries` removes
what a killed writer left behind.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False  # typing stays off the start-up path of `run` and `status`
if TYPE_CHECKING:
    from typing import Optional, Union

    PathLike = Union[str, "os.PathLike[str]"]

#: Bound for one record (lease metadata, ticket, drain): they are a few hundred bytes.
MAX_RECORD = 64 * 1024

TMP_SUFFIX = ".tmp"


class UnsafeFile(UserError):
    """A file that is not what a state file must be (kind, size); the message says why."""


class TooLarge(UnsafeFile):
    """A file over the bound its reader keeps to (`read_bounded`, `read_small`)."""


class Unreadable(UnsafeFile):
    """A regular file whose read failed (`read_small`); `strerror` says how."""

    def __init__(self, message: str, strerror: str) -> None:
        super().__init__(message)
        self.strerror = strerror


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: PathLike,
    flags: int = os.O_RDONLY,
    mode: int = 0o644,
    *,
    what: str = "file",
    dir_fd: Optional[int] = None,
    follow: bool = False,
) -> tuple[int, os.stat_result]:
    """Open `path` without following a symlink (unless `follow`: the caller judged the
    link) or blocking on a FIFO, and return the descriptor with its `fstat` once it
    is known to be a regular file.

    Raises UnsafeFile for anything else, and lets FileNotFoundError through (a record
    that vanished between listing and opening is ordinary in a shared directory).
    """
    try:
        nofollow = 0 if follow else os.O_NOFOLLOW
        fd = os.open(path, flags | nofollow | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFile(f"refusing {what} {os.fspath(path)}: it is a symbolic link") from None
        if err.errno == errno.ENXIO:  # write-open of a FIFO nobody reads
            raise UnsafeFile(f"refusing {what} {os.fspath(path)}: it is a FIFO") from None
        if err.errno == errno.EISDIR:
            raise UnsafeFile(f"refusing {what} {os.fspath(path)}: it is a directory") from None
        if err.errno == errno.EACCES and _is_symlink(path, dir_fd):
            # fs.protected_symlinks refuses another user's symlink in a sticky directory
            # before O_NOFOLLOW is looked at: the same refusal, said the same way.
            raise UnsafeFile(f"refusing {what} {os.fspath(path)}: it is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"refusing {what} {os.fspath(path)}: it is {_kind(st.st_mode)}")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _is_symlink(path: PathLike, dir_fd: Optional[int]) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def read_bounded(fd: int, limit: int = MAX_RECORD, *, what: str = "file") -> bytes:
    """All of a regular file's bytes from the current offset, refusing more than `limit`."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > limit:
        raise TooLarge(f"refusing {what}: larger than {limit} bytes")
    return data


def read_small(
    path: PathLike,
    limit: int = MAX_RECORD,
    *,
    what: str = "file",
    dir_fd: Optional[int] = None,
    follow: bool = False,
) -> tuple[bytes, os.stat_result]:
    """(contents, fstat) of a small regular file; see `open_regular` for what is refused
    (TooLarge: over `limit`; Unreadable: the read failed)."""
    fd, st = open_regular(path, what=what, dir_fd=dir_fd, follow=follow)
    try:
        if st.st_size > limit:
            raise TooLarge(
                f"refusing {what} {os.fspath(path)}: {st.st_size} bytes, more than {limit}"
            )
        try:
            return read_bounded(fd, limit, what=f"{what} {os.fspath(path)}"), st
        except OSError as err:
            raise Unreadable(
                f"cannot read {what} {os.fspath(path)}: {err.strerror}", err.strerror or ""
            ) from None
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """`os.write` until every byte is written (a write may be partial)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_new(path: str, data: bytes, mode: int) -> None:
    """Create `path` with `data`: never through a link nor over an existing file. A
    write that fails (a full disk) removes the file it made before the OSError goes on."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        write_all(fd, data)
    except OSError:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def temporary_name(path: PathLike) -> str:
    """A name beside `path` that no other writer picks: dot-prefixed (listings skip it)
    and ending in TMP_SUFFIX (so `sweep_temporaries` recognises it)."""
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(folder, f".{name}.{os.getpid()}-{os.urandom(4).hex()}{TMP_SUFFIX}")


def write_atomic(
    path: PathLike,
    data: Union[bytes, str],
    *,
    mode: int = 0o644,
    what: str = "file",
    durable: bool = True,
) -> None:
    """Replace `path` with `data` all at once: a reader sees the old or the new file,
    never a part. With `durable`, the data and the rename reach the disk before this
    returns (a drain must survive a power cut). Failures, a full disk included, raise
    UserError naming the file; the temporary file is removed."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    target = os.fspath(path)
    tmp = temporary_name(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            write_all(fd, raw)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, target)
    except OSError as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"cannot write {what} {target}: {err.strerror}") from None
    if durable:
        sync_directory(os.path.dirname(target) or ".")


def flock_within(fd: int, patience: float) -> bool:
    """Take an exclusive flock on `fd`, polling, for at most `patience` seconds; False
    when it stayed held. A blocking flock cannot be given a timeout, and a lock held
    by a stopped, stuck or hostile process must not stop every other client."""
    import fcntl

    deadline = time.monotonic() + patience
    delay = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 0.05)


def sync_directory(folder: str) -> None:
    """fsync a directory, so a rename or unlink in it is on disk; best effort."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sweep_temporaries(folder: str, older_than: float = 600.0, now: Optional[float] = None) -> int:
    """Remove this user's temporary files in `folder` older than `older_than` seconds,
    left by writers that were killed between create and rename. Returns how many.
    Others' files are left alone: in a sticky directory only their owner (or root)
    may remove them, and root removes only its own, so it never deletes a file that
    a live writer of another user is about to rename."""
    now = time.time() if now is None else now
    me = os.geteuid()
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
            if st.st_uid == me and stat.S_ISREG(st.st_mode) and now - st.st_mtime > older_than:
                os.unlink(path)
                removed += 1
        except OSError:
            continue
    return removed


def printable(text: str) -> str:
    """`text` from another user (a drain reason, a command line) made safe to print on a
    terminal: control characters, including escape sequences that could rewrite the
    screen or hide a line, are shown as `\\xNN`/`\\uNNNN` escapes; everything else
    (accented letters, CJK) is kept."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def owner_name(uid: Optional[int]) -> str:
    """The login name of a file's owner (`st_uid`), the number when unknown: who made a
    record, as the kernel says, for messages. The one uid-to-name helper."""
    if uid is None:
        return "?"
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)
