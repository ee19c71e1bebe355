"""Settings from TOML files, `GPUWARDEN_*` variables and the command line, with provenance.

Precedence, lowest first: built-in defaults, the system file
(`/etc/gpuwarden/config.toml`, or `$GPUWARDEN_SYSTEM_CONFIG`), the user file
(`$XDG_CONFIG_HOME/gpuwarden/config.toml`), the project file (`gpuwarden.toml`
in the working directory or the nearest parent up to the repository root),
environment variables, then the command line. Every value remembers which
layer set it, so `gpuwarden config` can answer "why is it this?".

Loading runs on every `gpuwarden run`, so it stays cheap: a few `stat` calls,
and `tomllib` is imported only when a file actually exists. Locations are
worked out as `os.path` strings; `pathlib` (with the `urllib.parse` it imports)
is imported only by the functions that hand out a `Path` and when a
file is read.

The keys and their types are `gpuwarden.config.keys` and `gpuwarden.config.values`;
this module loads the layers. Values are normalised on the way in, so a wrong
type is reported once, here, naming the file (or variable), the key and the
expected type. Where state lives is `gpuwarden.files.locations`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence

from gpuwarden.base.errors import UserError
from gpuwarden.config.keys import KEYS, SCHEMA
from gpuwarden.config.values import BadValue
from gpuwarden.files.configfiles import DEFAULT_SOCKET as DEFAULT_SOCKET
from gpuwarden.files.configfiles import PROJECT_FILE as PROJECT_FILE
from gpuwarden.files.configfiles import SYSTEM_CONFIG as SYSTEM_CONFIG
from gpuwarden.files.configfiles import project_config as project_config
from gpuwarden.files.configfiles import system_config as system_config
from gpuwarden.files.configfiles import user_config as user_config

TYPE_CHECKING = False  # typing stays off the start-up path; annotations need it only here
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Optional


# --- loading ---------------------------------------------------------------------------------


class Config:
    """Effective settings; every value knows the layer that set it."""

    def __init__(
        self,
        values: dict[str, tuple[Any, str]],
        files: tuple[tuple[str, str], ...],
        refused: tuple[tuple[str, str, str], ...] = (),
    ):
        self._values = values
        self.files = files  # (layer, path) actually read, lowest precedence first
        self.refused = refused  # (layer, path, why) found but not trusted, so not read

    def get(self, key: str) -> Any:
        return self._values[_known(key)][0]

    def service_socket(self) -> str:
        """The queue service's socket: `service.socket` ($GPUWARDEN_SOCKET sets it), the
        default where it is set empty. Every face asks this of its reading."""
        return str(self.get("service.socket") or DEFAULT_SOCKET)

    def source(self, key: str) -> str:
        """ "default", "system: PATH", "user: PATH", "project: PATH", "env: NAME" or
        "command line"."""
        return self._values[_known(key)][1]

    def items(self) -> Iterator[tuple[str, Any, str]]:
        """(key, value, source) in schema order."""
        for key in KEYS:
            value, source = self._values[key]
            yield key, value, source

    def __repr__(self) -> str:
        changed = {k: v for k, (v, s) in self._values.items() if s != "default"}
        return f"Config({changed!r})"


def _known(key: str) -> str:
    if key not in KEYS:
        raise KeyError(f"unknown setting {key!r}")
    return key


# --- reading ---------------------------------------------------------------------------------

MAX_CONFIG_BYTES = 1 << 20  # a settings file is a few hundred bytes; a bigger one is junk


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's settings, read as every file others might swap is read
    (`safefiles.read_small`: never a FIFO, never without bound), following the symlink
    `trust.refusal` judged; every failure is one UserError naming the file."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    from gpuwarden.files.safefiles import TooLarge, Unreadable, UnsafeFile, read_small

    try:
        data, _ = read_small(path, MAX_CONFIG_BYTES, what="config file", follow=True)
    except TooLarge:
        raise UserError(
            f"{path}: too large for a config file (over {MAX_CONFIG_BYTES} bytes)"
        ) from None
    except Unreadable as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    except UnsafeFile:  # swapped for something else since trust.refusal looked at it
        raise UserError(f"{path}: not a regular file") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} on line {line})"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{path}: invalid TOML: {err}") from None


def _line_of(path: Path, section: str, name: str) -> str:
    """' (line N)' where `name` is set under `[section]`, or '' — only used on errors."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    current = ""
    pattern = re.compile(
        r"^\s*(?:" + re.escape(section) + r"\s*\.\s*)?" + re.escape(name) + r"\s*="
    )
    for number, line in enumerate(lines, 1):
        header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", line)
        if header:
            current = header.group(1)
            continue
        if current in (section, "") and pattern.match(line):
            return f" (line {number})"
    return ""


def _file_values(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise UserError(
                f"{path}: unknown key {section!r}{_line_of(path, '', section)}: settings live in "
                f"sections such as [run] (known keys: see `gpuwarden config`)"
            )
        for name, value in table.items():
            key = f"{section}.{name}"
            spec = KEYS.get(key)
            if spec is None:
                raise UserError(
                    f"{path}: unknown key {key!r}{_line_of(path, section, name)}" + _suggest(key)
                )
            try:
                values[key] = spec.normalise(value)
            except BadValue:
                raise UserError(
                    f"{path}: {key} must be {spec.expected()}, got {_shown(value)}"
                    f"{_line_of(path, section, name)}"
                ) from None
            if spec.kind == "path" and not os.path.isabs(values[key]):
                values[key] = str((path.parent / values[key]).absolute())
    return values


def _shown(value: Any) -> str:
    from gpuwarden.base.units import shown

    return shown(value)


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(KEYS), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def load(
    cli: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    layers: Sequence[tuple[str, Optional[str]]] | None = None,
) -> Config:
    """Effective settings. `cli` maps dotted keys to command-line values; None values
    (options not given) are ignored. Raises UserError for a broken file, unknown key,
    wrong type or bad variable.

    Every call reads the files and variables afresh; nothing keeps a reading for later
    calls. Code below a command takes the command's reading as an argument (a `conf`
    or `reading` parameter) rather than loading its own, so one command sees one
    configuration and reads it once.

    `environ` and `cwd` default to this process's; a relative path from a variable or
    the command line is taken from `cwd`. `layers` names the files to read, (layer,
    path) lowest first, in place of the system, user and project files: the service
    reads a submit's settings for the client this way (service.argvsubmit)."""
    env = os.environ if environ is None else environ
    values: dict[str, tuple[Any, str]] = {k.name: (k.default, "default") for k in SCHEMA}
    files = []
    refused = []
    if layers is None:
        layers = (
            ("system", system_config(env)),
            ("user", user_config(env)),
            ("project", project_config(cwd)),
        )
    here = os.getcwd() if cwd is None else os.fspath(cwd)
    for layer, name in layers:
        if name is None or not os.path.lexists(name):
            continue
        from gpuwarden.config.trust import refusal, warn_refused

        why = refusal(name)
        if why is not None:
            refused.append((layer, name, why))
            warn_refused(name, why)
            continue
        from pathlib import Path

        path = Path(name)
        files.append((layer, str(path)))
        for key, value in _file_values(path, _read_toml(path)).items():
            values[key] = (value, f"{layer}: {path}")
    for spec in SCHEMA:
        for name in spec.env_names:
            text = env.get(name)
            if text is None or (name == "GPU_IDS" and not text.strip()):
                continue
            try:
                value = spec.normalise(text)
            except BadValue:
                raise UserError(
                    f"{name}={_shown(text)}: {spec.name} must be {spec.expected()}"
                ) from None
            if spec.kind == "path":
                value = os.path.normpath(os.path.join(here, value))
            values[spec.name] = (value, f"env: {name}")
            break
    for key, raw in (cli or {}).items():
        if raw is None:
            continue
        spec = KEYS.get(key)
        if spec is None:
            raise KeyError(f"unknown setting {key!r}")  # a programming error, not the user's
        try:
            value = spec.normalise(raw)
        except BadValue:
            raise UserError(
                f"invalid {key.split('.')[-1]} {_shown(raw)}: expected {spec.expected()}"
            ) from None
        if spec.kind == "path":
            value = os.path.normpath(os.path.join(here, value))
        values[key] = (value, "command line")
    return Config(values, tuple(files), tuple(refused))
