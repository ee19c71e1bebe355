"""The schema of settings: every key's type, default, variable and meaning, written once.

`gpuwarden config` lists it, docs/config.md mirrors it (a test compares them),
and the loader (`gpuwarden.config`) checks every value against it.
"""

from __future__ import annotations

from gpuwarden.config.values import KINDS, BadValue

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

# Shared by every local user when an admin (or a packaged service) created them
# (`gpuwarden.files.locations` picks them when they exist).
SYSTEM_LEASE_DIR = "/var/lib/gpuwarden/leases"
SYSTEM_STATE_DIR = "/var/lib/gpuwarden/state"


class Key:
    """One setting: the single place its type, default, variable and meaning are written.

    A plain class, not a record: the schema's sixty-odd rows are made by every
    command, `gpuwarden run` included, and a record's shared `__init__` and its
    dataclass bookkeeping would cost that start time for nothing a schema row needs
    (`bench/run_overhead.py --instructions` measures it)."""

    __slots__ = ("above", "choices", "default", "doc", "env", "kind", "low", "name")

    def __init__(
        self,
        name: str,  # dotted: "run.min_free"
        kind: str,  # a key of config.values.KINDS
        default: Any,
        doc: str,
        env: tuple[str, ...] = (),  # variables, strongest first; derived when empty
        choices: tuple[str, ...] = (),
        low: Optional[float] = None,  # numbers (each one, for lists) must be >= low ...
        above: bool = False,  # ... or > low when set: an interval of 0 s would spin
    ) -> None:
        self.name, self.kind, self.default, self.doc = name, kind, default, doc
        self.env, self.choices, self.low, self.above = env, choices, low, above

    def __repr__(self) -> str:
        return f"Key({self.name!r}, {self.kind!r}, default={self.default!r})"

    @property
    def env_names(self) -> tuple[str, ...]:
        return self.env or ("GPUWARDEN_" + self.name.upper().replace(".", "_"),)

    def expected(self) -> str:
        if self.kind == "choice":
            return "one of " + "|".join(self.choices)
        what = KINDS[self.kind][1]
        if self.low is None:
            return what
        if self.kind == "duration" and self.low > 0:  # seconds say little at this size
            return f"{what}, {'over' if self.above else 'at least'} {_span(self.low)}"
        bound = format_value(self.low, self.name)
        return f"{what} {'>' if self.above else '>='} {bound}"

    def normalise(self, value: Any) -> Any:
        result = KINDS[self.kind][0](value)
        if self.kind == "choice" and result not in self.choices:
            raise BadValue
        if self.low is not None:
            for number in result if isinstance(result, tuple) else (result,):
                if number < self.low or (self.above and number == self.low):
                    raise BadValue
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
    Key("run.mig", "profile", None, "only MIG slices of this profile, e.g. 1g.10gb (docs/mig.md)"),
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
    Key(
        "exporter.show_commands",
        "bool",
        False,
        "put processes' command lines in the `command` label (anyone reaching the port reads them)",
    ),
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
        "service.max_jobs_per_user", "int", 1000, "jobs one user may have queued or running", low=1
    ),
    Key(
        "service.max_connections_per_user",
        "int",
        64,
        "connections one user may hold open to the service (all users: 512)",
        low=1,
    ),
    Key(
        "service.idle_timeout",
        "seconds",
        30.0,
        "a connection that sends no whole request for this long is closed",
        low=0,
        above=True,
    ),
    Key("service.max_command_bytes", "size", 64 << 10, "longest command line of a job", low=1),
    Key("service.max_env_bytes", "size", 256 << 10, "largest environment of a job", low=1),
    Key(
        "service.keep_history",
        "duration",
        None,
        "ended jobs stay in the journal this long (8d at least), then go to archives",
        low=8 * 86400,  # what gpu_hours_per_week and the digest count from the journal
    ),
    Key(
        "service.max_journal_bytes_per_user",
        "size",
        64 << 20,
        "journal one user's queued and running jobs may hold",
        low=1,
    ),
    Key("service.max_time", "duration", None, "longest --time a job may ask for (then required)"),
    Key(
        "service.interactive_time",
        "duration",
        None,
        "the time of a kernel, gpuwarden.lease() or attached run given none",
    ),
    Key(
        "service.max_interactive_time",
        "duration",
        None,
        "longest time a kernel, gpuwarden.lease() or attached run may hold GPUs (else max_time)",
    ),
    Key(
        "service.book_max_gpus",
        "int",
        None,
        "GPUs a user may book ahead (unset: only admins)",
        low=1,
    ),
    Key("service.book_max_time", "duration", None, "longest booking a user may make"),
    Key(
        "service.sample_seconds",
        "duration",
        10.0,
        "how often running jobs' GPUs are sampled for `gpuwarden eff` (0: never)",
        low=0,
    ),
    Key("service.grace", "seconds", 30.0, "from SIGTERM to SIGKILL past a time limit", low=0),
    Key(
        "service.preempt_grace",
        "seconds",
        30.0,
        "from a preempted job's signal to SIGKILL (Slurm's GraceTime)",
        low=0,
    ),
    Key(
        "service.preempt_charge",
        "float",
        1.0,
        "the factor a preemptible job's GPU-seconds count at in fair share",
        low=0,
    ),
    Key(
        "service.retry_backoff",
        "seconds",
        10.0,
        "before a --max-retries job's first retry; doubled for each next one",
        low=0,
    ),
    Key(
        "service.half_life",
        "seconds",
        7 * 86400.0,
        "fair-share usage halves in this time",
        low=0,
        above=True,
    ),
    Key("service.shares", "shares", {}, "fair-share weight per user (others get 1)"),
    Key("service.limits", "limits", {}, "limits per user and @group (max_gpus, max_jobs, ...)"),
    Key(
        "service.accounts", "accounts", {}, "accounts jobs are charged to: members, shares, limits"
    ),
    Key("service.require_account", "bool", False, "refuse a job that names no account"),
    Key(
        "service.digest_every",
        "duration",
        7 * 86400.0,
        "how often a user who subscribed gets their digest (`gpuwarden digest`; 0: never)",
        low=0,
    ),
    Key("service.admin_digest", "bool", False, "send the admins a digest as often"),
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
    Key(
        "service.show_commands",
        "bool",
        False,
        "show everyone's command lines and start errors (`queue`, `jobs`, `status`)",
    ),
    Key("service.webhook", "str", None, "URL that gets a JSON POST when a job ends"),
    Key("submit.webhook", "str", None, "your URL that gets a JSON POST for each --notify event"),
    Key("submit.account", "str", None, "the account your jobs are charged to (as sbatch's)"),
    Key("service.sendmail", "path", None, "sendmail program that mails owners when their job ends"),
    Key(
        "service.reconnect",
        "seconds",
        300.0,
        "how long an attached `run` waits for a restarted service",
        low=0,
        above=True,
    ),
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
    # Several hosts over ssh (docs/hosts.md)
    Key("hosts.command", "str", "gpuwarden", "`--hosts`: the command running gpuwarden on a host"),
    Key("hosts.ssh_options", "str", None, "`--hosts`: more ssh options, e.g. `-p 2222`"),
    Key(
        "hosts.timeout",
        "seconds",
        15.0,
        "`--hosts`: seconds a host has to answer",
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


def _span(seconds: float) -> str:
    """A bound of a duration in the largest unit that says it whole: 8 days, 90 seconds."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


def format_value(value: Any, key: str | None = None) -> str:
    """A value as a person would type it back (sizes in binary units, lists with commas)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    spec = KEYS.get(key or "")
    if spec is not None and spec.kind == "size":
        from gpuwarden.base.units import format_size

        return format_size(value)
    if spec is not None and spec.kind == "capability":
        return f"{value[0]}.{value[1]}"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
