"""Settings from TOML files, `GPUWARDEN_*` variables and the command line, with provenance.

Precedence, lowest first: built-in defaults, the system file
(`/etc/gpuwarden/config.toml`, or `$GPUWARDEN_SYSTEM_CONFIG`), the user file
(`$XDG_CONFIG_HOME/gpuwarden/config.toml`), the project file (`gpuwarden.toml`
in the working directory or the nearest parent up to the repository root),
environment variables, then the command line. Every value remembers which
layer set it, so `gpuwarden config` can answer "why is it this?".

Loading runs on every `gpuwarden run`, so it stays cheap: a few `stat` calls,
and `tomllib` is imported only when a file actually exists. Locations are
worked out as `os.path` strings; `pathlib` (with the `urllib.parse` it imports,
~3 ms) is imported only by the functions that hand out a `Path` and when a
file is read.

Values are normalised on the way in (sizes to bytes, durations to seconds,
ID lists to tuples of strings), so a wrong type is reported once, here, naming
the file (or variable), the key and the expected type, never deep inside the
code that uses it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

from gpuwarden.errors import UserError
from gpuwarden.records import record

TYPE_CHECKING = False  # typing costs ~2.5 ms to import; annotations need it only here
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Callable, Optional

SYSTEM_CONFIG = "/etc/gpuwarden/config.toml"
PROJECT_FILE = "gpuwarden.toml"
# Shared by every local user when an admin (or a packaged service) created them.
SYSTEM_LEASE_DIR = "/var/lib/gpuwarden/leases"
SYSTEM_STATE_DIR = "/var/lib/gpuwarden/state"

# --- value types -----------------------------------------------------------------------------


class _BadValue(Exception):
    """Raised by a normaliser; the loader adds where the value came from."""


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise _BadValue
    return value


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    raise _BadValue


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise _BadValue
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise _BadValue from None
    raise _BadValue


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise _BadValue
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise _BadValue from None
    else:
        raise _BadValue
    if number != number or number in (float("inf"), float("-inf")):  # NaN, infinities
        raise _BadValue
    return number


def _as_seconds(value: Any) -> float:
    """A number of seconds up to ten years: `time.sleep(1e300)` raises OverflowError."""
    from gpuwarden.units import MAX_DURATION

    number = _as_float(value)
    if number > MAX_DURATION:
        raise _BadValue
    return number


def _as_percent(value: Any) -> float:
    if isinstance(value, str):
        value = value.strip().rstrip("%")
    number = _as_float(value)
    if not 0 <= number <= 100:
        raise _BadValue
    return number


def _as_size(value: Any) -> int:
    from gpuwarden.units import parse_size

    if isinstance(value, bool):
        raise _BadValue
    if isinstance(value, int):
        if value < 0:
            raise _BadValue
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except UserError:
            raise _BadValue from None
    raise _BadValue


def parse_duration(text: str | float) -> float:
    """Seconds in `text` (`90`, `30s`, `5m`, `4h`, `1d`); raises UserError naming the value.
    Kept here for callers that import it from config; the parsing is `units.parse_duration`."""
    from gpuwarden.units import parse_duration as parse

    return parse(text)


def _as_duration(value: Any) -> float:
    try:
        return parse_duration(value)
    except UserError:
        raise _BadValue from None


def _as_ids(value: Any) -> tuple[str, ...]:
    """GPU IDs as typed: `"0,2"`, `[0, 2]`, `["GPU-3f2a"]`; kept as strings for select."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if any(not p for p in parts) and value.strip():
            raise _BadValue
        return tuple(p for p in parts if p)
    if isinstance(value, int) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            if (
                isinstance(item, bool)
                or not isinstance(item, (int, str))
                or str(item).strip() == ""
            ):
                raise _BadValue
            out.append(str(item).strip())
        return tuple(out)
    raise _BadValue


def _as_ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        value = [p for p in value.replace(" ", "").split(",") if p]
    if not isinstance(value, (list, tuple)):
        raise _BadValue
    return tuple(_as_int(v) for v in value)


def _as_names(value: Any) -> tuple[str, ...]:
    """User or group names (`@group`): a list, or one comma-separated string."""
    if isinstance(value, str):
        value = [p.strip() for p in value.split(",")] if value.strip() else []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise _BadValue
    return tuple(value)


def _as_shares(value: Any) -> dict[str, float]:
    """Fair-share weights per user: a table `{alice = 2, bob = 1}` or `"alice=2,bob=1"`."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise _BadValue
        value = {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(value, dict):
        raise _BadValue
    shares = {}
    for user, share in value.items():
        number = _as_float(share)
        if not user or not number > 0:
            raise _BadValue
        shares[str(user)] = number
    return shares


def parse_capability(text: Any) -> tuple[int, int]:
    """`8.0`, `"8.6"`, `[8, 6]` -> (8, 6); raises UserError naming the value."""
    if isinstance(text, (list, tuple)) and len(text) == 2:
        try:
            return (_as_int(text[0]), _as_int(text[1]))
        except _BadValue:
            pass
    elif isinstance(text, (str, int, float)) and not isinstance(text, bool):
        match = re.match(r"^\s*(\d+)(?:\.(\d+))?\s*$", str(text))
        if match:
            return (int(match.group(1)), int(match.group(2) or 0))
    raise UserError(f"invalid compute capability {text!r}: expected MAJOR.MINOR, e.g. 8.0")


def _as_capability(value: Any) -> tuple[int, int]:
    try:
        return parse_capability(value)
    except UserError:
        raise _BadValue from None


def _as_path(value: Any) -> str:
    return os.path.expanduser(_as_str(value))


def _as_listen(value: Any) -> str:
    from gpuwarden.units import parse_listen

    text = _as_str(value)
    try:
        parse_listen(text)  # the servers read it the same way when they start
    except UserError:
        raise _BadValue from None
    return text


# kind -> (normaliser, how to name the expected type in an error)
_KINDS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "str": (_as_str, "a string"),
    "bool": (_as_bool, "true or false"),
    "int": (_as_int, "an integer"),
    "float": (_as_float, "a number"),
    "seconds": (_as_seconds, "a number of seconds (ten years at most)"),
    "percent": (_as_percent, "a percentage 0-100"),
    "size": (_as_size, "a size such as 20GiB or 500M (1EiB at most)"),
    "duration": (_as_duration, "a duration such as 90, 30s, 5m or 4h (ten years at most)"),
    "ids": (_as_ids, 'GPU IDs such as "0,2" or ["GPU-3f2a"]'),
    "ints": (_as_ints, "a list of integers"),
    "capability": (_as_capability, "a compute capability such as 8.0"),
    "path": (_as_path, "a path (string)"),
    "listen": (_as_listen, "HOST:PORT, :PORT or PORT"),
    "choice": (_as_str, "one of"),
    "names": (_as_names, 'names such as ["alice", "@gpuadmins"]'),
    "shares": (_as_shares, "a table of positive numbers such as {alice = 2, bob = 1}"),
}


@record
class Key:
    """One setting: the single place its type, default, variable and meaning are written."""

    name: str  # dotted: "run.min_free"
    kind: str  # a key of _KINDS
    default: Any
    doc: str
    env: tuple[str, ...] = ()  # variables, strongest first; derived when empty
    choices: tuple[str, ...] = ()
    low: Optional[float] = None  # numbers (each one, for lists) must be >= low ...
    above: bool = False  # ... or > low when set: an interval of 0 s would spin

    @property
    def env_names(self) -> tuple[str, ...]:
        return self.env or ("GPUWARDEN_" + self.name.upper().replace(".", "_"),)

    def expected(self) -> str:
        if self.kind == "choice":
            return "one of " + "|".join(self.choices)
        what = _KINDS[self.kind][1]
        if self.low is None:
            return what
        bound = format_value(self.low, self.name)
        return f"{what} {'>' if self.above else '>='} {bound}"

    def normalise(self, value: Any) -> Any:
        result = _KINDS[self.kind][0](value)
        if self.kind == "choice" and result not in self.choices:
            raise _BadValue
        if self.low is not None:
            for number in result if isinstance(result, tuple) else (result,):
                if number < self.low or (self.above and number == self.low):
                    raise _BadValue
        return result


SCHEMA: tuple[Key, ...] = (
    Key(
        "run.gpus",
        "ids",
        None,
        "GPUs to use (indices or UUID prefixes); the candidates for -g",
        env=("GPUWARDEN_RUN_GPUS", "GPU_IDS"),
    ),
    Key("run.count", "int", None, "how many GPUs to pick (default 1, or all of run.gpus)", low=0),
    Key("run.min_free", "size", None, "skip GPUs with less free memory than this"),
    Key("run.max_util", "percent", None, "skip GPUs busier than this (percent)"),
    Key("run.min_capability", "capability", None, "skip GPUs below this compute capability"),
    Key("run.model", "str", None, "only GPUs whose name matches (glob or substring, any case)"),
    Key("run.exclude", "ids", (), "never pick these GPUs (indices or UUID prefixes)"),
    Key("run.keep_first_last", "bool", True, "pick GPU 0 last (it often drives a display)"),
    Key(
        "run.id_format",
        "choice",
        "index",
        "CUDA_VISIBLE_DEVICES as nvidia-smi indices or UUIDs",
        choices=("index", "uuid"),
    ),
    Key("run.wait", "bool", False, "wait in line when not enough GPUs are free"),
    Key("run.timeout", "duration", None, "give up waiting after this long"),
    Key(
        "lease.dir",
        "path",
        None,
        f"lease lock files (default {SYSTEM_LEASE_DIR} if it exists, else per user)",
    ),
    Key(
        "state.dir",
        "path",
        None,
        f"drains, wait queue, XID log (default {SYSTEM_STATE_DIR} if it exists, else per user)",
    ),
    Key(
        "torch.device",
        "choice",
        "auto",
        "device for gpuwarden.torch helpers",
        env=("GPUWARDEN_DEVICE", "GPUWARDEN_TORCH_DEVICE"),
        choices=("auto", "cpu", "cuda", "mps"),
    ),
    Key("exporter.listen", "listen", "127.0.0.1:9400", "address the Prometheus exporter serves"),
    Key(
        "exporter.cache_seconds",
        "seconds",
        1.0,
        "reuse one NVML reading for this long (0: read on every scrape)",
        low=0,
    ),
    Key("exporter.idle_util", "percent", 5.0, "a GPU at or below this utilization is idle"),
    Key(
        "exporter.idle_seconds",
        "seconds",
        600.0,
        "idle this long with memory held => flagged",
        low=0,
        above=True,
    ),
    Key("exporter.dcgm_compat", "bool", False, "also export DCGM_FI_* metric names"),
    Key("web.listen", "listen", "127.0.0.1:9500", "address the web page serves (loopback default)"),
    Key("web.interval", "float", 1.0, "seconds between the web page's updates"),
    Key("web.show_commands", "bool", False, "show processes' command lines on the web page"),
    Key("web.max_clients", "int", 64, "most connections the web page serves at once"),
    Key(
        "health.policy",
        "choice",
        "drain",
        "on a fatal finding: drain the GPU, or only alert",
        choices=("drain", "alert"),
    ),
    Key(
        "health.fatal_xids",
        "ints",
        None,
        "XID codes that make a GPU unusable (default: NVIDIA's reset/reboot XIDs)",
        low=1,
    ),
    Key("health.hook", "str", None, "command run on each new health finding"),
    Key("health.webhook", "str", None, "URL that gets a JSON POST on each new health finding"),
    Key(
        "health.webhook_timeout",
        "seconds",
        5.0,
        "seconds to wait for the webhook",
        low=0,
        above=True,
    ),
    Key(
        "health.hook_timeout",
        "seconds",
        30.0,
        "seconds a hook command may run",
        low=0,
        above=True,
    ),
    Key(
        "health.ecc_corrected_warn",
        "int",
        None,
        "warn above this many corrected ECC errors",
        low=0,
    ),
    Key(
        "health.ecc_corrected_rate_warn",
        "float",
        None,
        "warn above this many corrected ECC errors per hour",
        low=0,
    ),
    Key("health.pcie_replay_warn", "int", None, "warn above this many PCIe replays", low=0),
    Key(
        "health.poll_seconds",
        "seconds",
        5.0,
        "how often the health watch reads the GPUs",
        low=0,
        above=True,
    ),
    Key(
        "service.socket",
        "path",
        "/run/gpuwarden/gpuwarden.sock",
        "the queue service's Unix socket",
        env=("GPUWARDEN_SOCKET",),
    ),
    Key("service.dir", "path", "/var/lib/gpuwarden/service", "the service's journal and records"),
    Key("service.admins", "names", (), "users and @groups who may act on every job and GPU"),
    Key("service.max_gpus_per_user", "int", None, "GPUs one user may use at once", low=1),
    Key(
        "service.max_jobs_per_user", "int", None, "jobs one user may have queued or running", low=1
    ),
    Key("service.max_time", "duration", None, "longest --time a job may ask for (then required)"),
    Key("service.grace", "seconds", 30.0, "from SIGTERM to SIGKILL past a time limit", low=0),
    Key(
        "service.half_life",
        "seconds",
        7 * 86400.0,
        "fair-share usage halves in this time",
        low=0,
        above=True,
    ),
    Key("service.shares", "shares", {}, "fair-share weight per user (others get 1)"),
    Key("service.weight_fairshare", "float", 10000.0, "priority weight of fair share", low=0),
    Key("service.weight_age", "float", 1000.0, "priority weight of time waited", low=0),
    Key("service.weight_qos", "float", 10000.0, "priority weight of the admin-set QOS", low=0),
    Key("service.weight_nice", "float", 1000.0, "priority weight of a job's nice value", low=0),
    Key(
        "service.age_max",
        "seconds",
        7 * 86400.0,
        "waiting this long gives the full age factor",
        low=0,
        above=True,
    ),
    Key(
        "service.starve_after",
        "seconds",
        3600.0,
        "then GPUs are kept for a job that cannot start",
        low=0,
    ),
    Key("service.show_commands", "bool", False, "show everyone's command lines in `queue`"),
    Key("service.webhook", "str", None, "URL that gets a JSON POST when a job ends"),
    Key("service.sendmail", "path", None, "sendmail program that mails owners when their job ends"),
    Key(
        "enforce.devices",
        "choice",
        "auto",
        "device cgroup per job run as root: auto (where possible), off, require",
        choices=("auto", "off", "require"),
    ),
    Key(
        "enforce.memory_tolerance",
        "percent",
        10.0,
        "a --mem job may use this much more than it declared (percent) before it is over",
    ),
    Key("enforce.memory_grace", "duration", 60.0, "over its --mem this long => memory_action"),
    Key(
        "enforce.memory_action",
        "choice",
        "notify",
        "a job over its --mem after the grace: notify, or kill (SIGTERM, then SIGKILL)",
        choices=("notify", "kill"),
    ),
    Key("enforce.unleased_grace", "duration", 300.0, "unleased GPU use this long => action"),
    Key(
        "enforce.unleased_action",
        "choice",
        "notify",
        "a process using a GPU without a lease: notify, or kill it after the grace when the "
        "GPU is leased to someone else",
        choices=("notify", "kill"),
    ),
    Key(
        "enforce.idle_after",
        "duration",
        86400.0,
        "a lease idle (0% and memory still) this long",
        low=0,
        above=True,
    ),
    Key(
        "enforce.idle_action",
        "choice",
        "report",
        "an idle lease: report it, or release it (SIGTERM to its holder)",
        choices=("report", "release"),
    ),
    Key(
        "enforce.poll_seconds",
        "duration",
        5.0,
        "how often `gpuwarden enforce --watch` looks",
        low=0,
        above=True,
    ),
    Key("record.interval", "seconds", 1.0, "seconds between recorded samples", low=0, above=True),
    Key(
        "record.max_bytes",
        "size",
        100 * 2**20,
        "start a new CSV file beyond this size",
        low=0,
        above=True,
    ),
    # Slurm (docs/slurm.md)
    Key("slurm.drain_node", "bool", False, "drain this Slurm node on a fatal GPU fault"),
    Key("slurm.node", "str", None, "this machine's Slurm node name (default: short hostname)"),
    Key("slurm.gpu_types", "names", (), "Slurm GPU gres types that --model may name (typed gres)"),
    Key(
        "slurm.prolog_timeout",
        "seconds",
        30.0,
        "`slurm prolog`: wait this long for GPUs still leased locally",
        low=0,
    ),
)

KEYS: dict[str, Key] = {k.name: k for k in SCHEMA}


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


def system_config_path(environ: Mapping[str, str] | None = None) -> Path:
    from pathlib import Path

    return Path(_system_config(os.environ if environ is None else environ))


def _system_config(env: Mapping[str, str]) -> str:
    return env.get("GPUWARDEN_SYSTEM_CONFIG") or SYSTEM_CONFIG


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    from pathlib import Path

    return Path(_user_config(os.environ if environ is None else environ))


def _user_config(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpuwarden", "config.toml")


def project_config_path(cwd: str | os.PathLike[str] | None = None) -> Optional[Path]:
    """The nearest `gpuwarden.toml` from `cwd` upwards, stopping at the repository root
    (a directory holding `.git`), the home directory or `/`; None if there is none.

    Walking up lets a job started from `experiments/` in a repository use the
    repository's settings; stopping at the repository root keeps one project's
    file from leaking into another."""
    found = _project_config(cwd)
    if found is None:
        return None
    from pathlib import Path

    return Path(found)


def _absolute(path: str | os.PathLike[str]) -> str:
    """`Path(path).absolute()` as a string: joined to the working directory, `.` and
    doubled slashes dropped, `..` kept (it may cross a symlink)."""
    joined = os.path.join(os.getcwd(), path)
    return "/" + "/".join(p for p in joined.split("/") if p and p != ".")


def _project_config(cwd: str | os.PathLike[str] | None = None) -> Optional[str]:
    directory = _absolute(os.getcwd() if cwd is None else cwd)
    home = _absolute(os.path.expanduser("~"))
    while True:
        candidate = os.path.join(directory, PROJECT_FILE)
        if os.path.lexists(candidate):  # whatever it is: a planted FIFO is refused, not skipped
            return candidate
        if directory == home or os.path.exists(os.path.join(directory, ".git")):
            return None
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


# --- reading ---------------------------------------------------------------------------------

MAX_CONFIG_BYTES = 1 << 20  # a settings file is a few hundred bytes; a bigger one is junk


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's settings, read without following it into a FIFO or reading without
    bound; every failure is one UserError naming the file."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            import stat

            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since it was checked
                raise UserError(f"{path}: not a regular file")
            data = os.read(fd, MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"{path}: too large for a config file (over {MAX_CONFIG_BYTES} bytes)")
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
            except _BadValue:
                raise UserError(
                    f"{path}: {key} must be {spec.expected()}, got {_shown(value)}"
                    f"{_line_of(path, section, name)}"
                ) from None
            if spec.kind == "path" and not os.path.isabs(values[key]):
                values[key] = str((path.parent / values[key]).absolute())
    return values


def _shown(value: Any) -> str:
    from gpuwarden.units import shown

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
) -> Config:
    """Effective settings. `cli` maps dotted keys to command-line values; None values
    (options not given) are ignored. Raises UserError for a broken file, unknown key,
    wrong type or bad variable."""
    env = os.environ if environ is None else environ
    values: dict[str, tuple[Any, str]] = {k.name: (k.default, "default") for k in SCHEMA}
    files = []
    refused = []
    layers = (
        ("system", _system_config(env)),
        ("user", _user_config(env)),
        ("project", _project_config(cwd)),
    )
    for layer, name in layers:
        if name is None or not os.path.lexists(name):
            continue
        from gpuwarden.config_trust import refusal, warn_refused

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
            except _BadValue:
                raise UserError(
                    f"{name}={_shown(text)}: {spec.name} must be {spec.expected()}"
                ) from None
            if spec.kind == "path":
                value = os.path.abspath(value)
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
        except _BadValue:
            raise UserError(
                f"invalid {key.split('.')[-1]} {_shown(raw)}: expected {spec.expected()}"
            ) from None
        if spec.kind == "path":
            value = os.path.abspath(value)
        values[key] = (value, "command line")
    return Config(values, tuple(files), tuple(refused))


def format_value(value: Any, key: str | None = None) -> str:
    """A value as a person would type it back (sizes in binary units, lists with commas)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    spec = KEYS.get(key or "")
    if spec is not None and spec.kind == "size":
        from gpuwarden.units import format_size

        return format_size(value)
    if spec is not None and spec.kind == "capability":
        return f"{value[0]}.{value[1]}"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# --- locations -------------------------------------------------------------------------------


def _user_state_base(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpuwarden")


def state_dir(config: Config | None = None) -> Path:
    """Where drains, the wait queue and the XID log live: `state.dir` if set, else the
    system directory when an admin created it (shared by every local user), else a
    per-user one under $XDG_STATE_HOME (~/.local/state). Not created here."""
    from pathlib import Path

    return Path(state_location(config))


def state_location(config: Config | None = None) -> str:
    """`state_dir()` as a string, for the status and run paths (no pathlib import)."""
    explicit = os.environ.get("GPUWARDEN_STATE_DIR")
    if explicit and config is None:
        return os.path.abspath(explicit)
    config = config or load()
    if config.get("state.dir"):
        return config.get("state.dir")
    if os.path.isdir(SYSTEM_STATE_DIR):
        return SYSTEM_STATE_DIR
    return _user_state_base(os.environ)


def lease_dir(config: Config | None = None) -> Path:
    """Where lease lock files live: `lease.dir` if set, else the system directory when an
    admin created it (so every local user's jobs see each other's leases), else a
    per-user one under $XDG_STATE_HOME. Not $XDG_RUNTIME_DIR: logind removes that at
    logout while a `nohup` job may still hold its lock, and a fresh lock file there
    would let a second job take the same GPU. Not created here."""
    from pathlib import Path

    return Path(lease_location(config))


def lease_location(config: Config | None = None) -> str:
    """`lease_dir()` as a string, for the status and run paths (no pathlib import)."""
    explicit = os.environ.get("GPUWARDEN_LEASE_DIR")
    if explicit and config is None:
        return os.path.abspath(explicit)
    config = config or load()
    if config.get("lease.dir"):
        return config.get("lease.dir")
    if os.path.isdir(SYSTEM_LEASE_DIR):
        return SYSTEM_LEASE_DIR
    return os.path.join(_user_state_base(os.environ), "leases")
