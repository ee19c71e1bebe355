"""`gpuwarden service install|uninstall`: set a machine up for the service, and take it down.

What is installed (docs/operations.md, lists the same):

- the systemd unit `/etc/systemd/system/gpuwarden.service` (also shipped as
  deploy/gpuwarden.service), running `gpuwarden serve`;
- the tmpfiles.d entry `/etc/tmpfiles.d/gpuwarden-service.conf` (also
  deploy/gpuwarden.tmpfiles) for the service's directories;
- a drop-in for the exporter's unit that keeps those directories 0755;
- the directories themselves, made now so the service can start without a reboot:
  /run/gpuwarden (the socket), /var/lib/gpuwarden/service (the journal, root only),
  /var/lib/gpuwarden/leases and /var/lib/gpuwarden/state (root's, 0755: with a
  service no user may create or hold lock files or drains there);
- a commented `[service]` table in /etc/gpuwarden/config.toml, only when the file has
  no such table (an admin's file is never rewritten: the table is appended);
- the manifest `/var/lib/gpuwarden/service/install.json`: what was written or
  changed, so that `uninstall` takes away exactly that and nothing an admin made.

Every write is idempotent: a second install finds its own files (same content as the
manifest says it wrote) and leaves them; a file that an admin changed since, or that
install did not write, is left alone and said so. The functions here return lines
for the command to print; nothing here talks to systemd (see `start_commands`).
The texts themselves are in `service.unitfiles`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.queueclient.probe import UNIT_PATH
from gpuwarden.service.runnable import cannot_export, not_for_everyone
from gpuwarden.service.unitfiles import (
    COMPANIONS,
    CONFIG_SECTION,
    EXPORTER_DROPIN_TEXT,
    TMPFILES,
    companion_unit,
    default_exec_start,
    unit_text,
)

# Not gpuwarden.conf, the name docs/monitoring.md gives the shared-directory snippet
# (deploy/gpuwarden.tmpfiles.conf, 1777): for a path named in both, systemd-tmpfiles
# applies the file whose name sorts first, and "gpuwarden-" sorts before "gpuwarden.".
TMPFILES_PATH = "/etc/tmpfiles.d/gpuwarden-service.conf"
# The exporter's unit makes the lease and state directories 1777 (StateDirectoryMode=)
# each time it starts; with a service this drop-in keeps them root's 0755.
EXPORTER_DROPIN_DIR = "/etc/systemd/system/gpuwarden-exporter.service.d"
EXPORTER_DROPIN = EXPORTER_DROPIN_DIR + "/gpuwarden-service.conf"
CONFIG_PATH = "/etc/gpuwarden/config.toml"
RUN_DIR = "/run/gpuwarden"
BASE_DIR = "/var/lib/gpuwarden"
SERVICE_DIR = "/var/lib/gpuwarden/service"
LEASE_DIR = "/var/lib/gpuwarden/leases"
STATE_DIR = "/var/lib/gpuwarden/state"
MANIFEST = "/var/lib/gpuwarden/service/install.json"
MANIFEST_VERSION = 1
MAX_MANIFEST = 1 << 20
CONFIG_DIR = "/etc/gpuwarden"  # made when missing, never changed: it is the admin's

# (path, mode): every directory install makes, parents first. With a service the lease
# and state directories are root's and not world-writable: a user who can create files
# there can hold a GPU's lock or drain it, which is what the service exists to prevent.
DIRECTORIES: tuple[tuple[str, int], ...] = (
    (RUN_DIR, 0o755),  # clients must reach the socket (itself 0666: the kernel says who)
    (BASE_DIR, 0o755),
    (SERVICE_DIR, 0o700),  # the journal: job commands and environments, root only
    (LEASE_DIR, 0o755),  # readable, so `status` shows every lease
    (STATE_DIR, 0o755),  # drains and the XID log, readable by every user's `status`
)


def systemd_running() -> bool:
    """Whether systemd is PID 1 (sd_booted(3): the directory exists only then)."""
    return os.path.isdir("/run/systemd/system")


def start_commands(companions: tuple[str, ...] = ()) -> list[list[str]]:
    names = [COMPANIONS[c].removesuffix(".service") for c in companions]
    return [
        ["systemd-tmpfiles", "--create", TMPFILES_PATH],
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "gpuwarden", *names],
    ]


def stop_commands(root: str = "/") -> list[list[str]]:
    """Stop and disable the service, and the exporter and web units install wrote (one
    command each: a unit an admin installed by hand is not ours to stop)."""
    ours = _read_manifest(root).files
    names = [n for c, n in COMPANIONS.items() if _companion_path(c) in ours]
    return [
        ["systemctl", "disable", "--now", "gpuwarden"],
        *(["systemctl", "disable", "--now", n.removesuffix(".service")] for n in names),
        ["systemctl", "daemon-reload"],
    ]


def _companion_path(name: str) -> str:
    return os.path.join(os.path.dirname(UNIT_PATH), COMPANIONS[name])


# -- the manifest ------------------------------------------------------------------------


@dataclass
class Manifest:
    """What install did, by system path: files it wrote (with their hash), directories
    it made or whose mode and owner it changed (with the old ones), text it appended."""

    files: dict[str, str] = field(default_factory=dict)  # path -> sha256 written
    dirs: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> before
    appended: dict[str, str] = field(default_factory=dict)  # path -> text appended

    def to_json(self) -> str:
        data = {
            "version": MANIFEST_VERSION,
            "files": self.files,
            "dirs": self.dirs,
            "appended": self.appended,
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str, where: str) -> Manifest:
        def bad(why: str) -> UserError:
            return UserError(f"install manifest {where} is damaged ({why}); remove it by hand")

        try:
            data = json.loads(text)
        except ValueError:
            raise bad("not JSON") from None
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise bad("unknown version")
        files, dirs, appended = data.get("files"), data.get("dirs"), data.get("appended")
        if not (
            isinstance(files, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
            and isinstance(appended, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in appended.items())
            and isinstance(dirs, dict)
            and all(isinstance(k, str) and _valid_before(v) for k, v in dirs.items())
        ):
            raise bad("wrong types")
        known = {p for p, _ in DIRECTORIES} | {CONFIG_DIR, EXPORTER_DROPIN_DIR}
        known |= {UNIT_PATH, TMPFILES_PATH, EXPORTER_DROPIN, CONFIG_PATH}
        known |= {_companion_path(c) for c in COMPANIONS}
        if not set(files) | set(dirs) | set(appended) <= known:
            raise bad("a path install never writes")
        return cls(files, dirs, appended)


def _valid_before(value: Any) -> bool:
    """{"created": true} or {"created": false, "mode": int, "uid": int, "gid": int}."""
    if not isinstance(value, dict) or not isinstance(value.get("created"), bool):
        return False
    if value["created"]:
        return True
    return all(
        isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
        for k in ("mode", "uid", "gid")
    )


def _read_manifest(root: str) -> Manifest:
    from gpuwarden.files.safefiles import UnsafeFile, read_small

    path = _at(root, MANIFEST)
    try:
        data, _ = read_small(path, MAX_MANIFEST, what="install manifest")
    except FileNotFoundError:
        return Manifest()
    except UnsafeFile as err:
        raise UserError(str(err)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"install manifest {path} is not UTF-8; remove it by hand") from None
    return Manifest.parse(text, path)


def _write_manifest(root: str, manifest: Manifest) -> None:
    from gpuwarden.files.safefiles import write_atomic

    write_atomic(_at(root, MANIFEST), manifest.to_json(), mode=0o600, what="install manifest")


# -- install -----------------------------------------------------------------------------


def _at(root: str, path: str) -> str:
    """`path` under the prefix `root` ("/" for the machine itself)."""
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_existing(path: str) -> Optional[bytes]:
    """The file's bytes, None when absent; anything but a regular file is refused: an
    install never writes through a symlink or into a FIFO someone left there."""
    from gpuwarden.files.safefiles import UnsafeFile, read_small

    try:
        return read_small(path, MAX_MANIFEST, what="file")[0]
    except FileNotFoundError:
        return None
    except UnsafeFile as err:
        raise UserError(f"{err}; move it away and install again") from None


def install(
    root: str = "/", exec_start: Optional[str] = None, companions: tuple[str, ...] = ()
) -> list[str]:
    """Make every directory, write the unit, the tmpfiles entry and the config section,
    record them in the manifest; return what was done, one line each."""
    as_root = os.geteuid() == 0
    if not as_root and root in ("", "/"):
        raise UserError("installing the service needs root (sudo gpuwarden service install)")
    manifest = _read_manifest(root)
    _preflight(root)
    exec_start = exec_start or default_exec_start()
    if "exporter" in companions:
        why = cannot_export(exec_start)
        if why is not None:
            raise UserError(f"refusing to install --exporter: {why}; nothing was changed")
    if root in ("", "/"):
        why = not_for_everyone(exec_start.split()[0])
        if why is not None:
            raise UserError(
                f"refusing to install: the unit would start {exec_start.split()[0]}, but {why}; "
                "install gpuwarden for every user first (sudo scripts/install-system)"
            )
    lines: list[str] = []
    for path, mode in DIRECTORIES:
        lines.append(_make_dir(root, path, mode, manifest, as_root))
    for path in (CONFIG_DIR, EXPORTER_DROPIN_DIR):
        if not os.path.lexists(_at(root, path)):
            lines.append(_make_dir(root, path, 0o755, manifest, as_root))
    units = [  # `--exporter`, `--web`
        (_companion_path(c), companion_unit(COMPANIONS[c], exec_start)) for c in companions
    ]
    for path, text in (
        (UNIT_PATH, unit_text(exec_start)),
        (TMPFILES_PATH, TMPFILES),
        (EXPORTER_DROPIN, EXPORTER_DROPIN_TEXT),
        *units,
    ):
        lines.append(_write_file(root, path, text, manifest))
    lines.append(_add_config(root, manifest))
    lines.extend(_foreign_lock_files(_at(root, LEASE_DIR)))
    _write_manifest(root, manifest)
    lines.append(f"recorded what was installed in {_at(root, MANIFEST)}")
    return lines


def _preflight(root: str) -> None:
    """Refuse before changing anything, so that a refusal leaves no half-install."""
    for path in (UNIT_PATH, TMPFILES_PATH, EXPORTER_DROPIN, CONFIG_PATH):
        _read_existing(_at(root, path))
    for path in (CONFIG_DIR, EXPORTER_DROPIN_DIR, *(p for p, _ in DIRECTORIES)):
        where = _at(root, path)
        if os.path.lexists(where) and not stat.S_ISDIR(os.lstat(where).st_mode):
            raise UserError(
                f"{where} exists and is not a directory; move it away and install again"
            )


def _foreign_lock_files(where: str) -> list[str]:
    """Files users left in a lease directory that was shared before: still theirs, so
    they could still open and lock them. Named, not removed: a job may hold one now."""
    owners: dict[str, int] = {}
    try:
        names = os.listdir(where)
    except OSError:
        return []
    from gpuwarden.files.paths import user_name

    for name in names:
        with contextlib.suppress(OSError):
            uid = os.lstat(os.path.join(where, name)).st_uid
            if uid != 0:
                owner = user_name(uid)
                owners[owner] = owners.get(owner, 0) + 1
    if not owners:
        return []
    who = ", ".join(f"{n} of {owner}" for owner, n in sorted(owners.items()))
    return [
        f"note: {where} still holds files of its users ({who}): once `gpuwarden status` "
        "shows no lease, remove them so that only the service's lock files remain"
    ]


def _make_dir(root: str, path: str, mode: int, manifest: Manifest, as_root: bool) -> str:
    where = _at(root, path)
    try:
        st = os.lstat(where)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(where), mode=0o755, exist_ok=True)
        os.mkdir(where, mode)
        os.chmod(where, mode)  # mkdir's mode passes through the umask
        if as_root:
            os.chown(where, 0, 0)
        manifest.dirs.setdefault(path, {"created": True})
        return f"created {where} (mode {mode:04o})"
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{where} exists and is not a directory; move it away and install again")
    old = stat.S_IMODE(st.st_mode)
    owner_ok = not as_root or (st.st_uid, st.st_gid) == (0, 0)
    if old == mode and owner_ok:
        return f"unchanged {where} (mode {mode:04o})"
    manifest.dirs.setdefault(
        path, {"created": False, "mode": old, "uid": st.st_uid, "gid": st.st_gid}
    )
    os.chmod(where, mode)
    if as_root:
        os.chown(where, 0, 0)
    return f"changed {where}: mode {old:04o} -> {mode:04o}, owner root"


def _write_file(root: str, path: str, text: str, manifest: Manifest) -> str:
    from gpuwarden.files.safefiles import write_atomic

    where = _at(root, path)
    data = text.encode("utf-8")
    existing = _read_existing(where)
    if existing == data:
        manifest.files.setdefault(path, _sha(data))
        return f"unchanged {where}"
    if existing is not None and manifest.files.get(path) != _sha(existing):
        return (
            f"left {where}: it exists and install did not write it (or it was edited since); "
            "compare it with deploy/" + os.path.basename(path)
        )
    os.makedirs(os.path.dirname(where), mode=0o755, exist_ok=True)
    write_atomic(where, data, mode=0o644, what=path)
    os.chmod(where, 0o644)
    manifest.files[path] = _sha(data)
    return f"{'updated' if existing is not None else 'created'} {where}"


def _add_config(root: str, manifest: Manifest) -> str:
    """A commented [service] table: a new file, or appended to an admin's file that has
    none. An admin's existing table, or a file that does not parse, is left as it is."""
    where = _at(root, CONFIG_PATH)
    existing = _read_existing(where)
    if existing is None:
        return _write_file(root, CONFIG_PATH, CONFIG_SECTION.lstrip("\n"), manifest)
    if CONFIG_PATH in manifest.files and manifest.files[CONFIG_PATH] == _sha(existing):
        return f"unchanged {where}"
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        table = tomllib.loads(existing.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return f"left {where}: it is not valid TOML; add a [service] table by hand (docs/config.md)"
    if "service" in table:
        return f"left {where}: it already has a [service] table (`gpuwarden config` shows it)"
    text = CONFIG_SECTION if existing.endswith(b"\n") or not existing else "\n" + CONFIG_SECTION
    fd = os.open(where, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        from gpuwarden.files.safefiles import write_all

        write_all(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    manifest.appended[CONFIG_PATH] = text
    return f"appended a commented [service] table to {where}"
