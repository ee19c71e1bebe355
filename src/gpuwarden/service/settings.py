"""What `gpuwarden serve` is told: the [service] table, the scheduling policy, the admins.

A plain record that every part of the service reads and none changes. It is read at
start and again on `gpuwarden service reload` or SIGHUP (`from_config`): the service
then swaps the whole record, or keeps the old one when the new reading is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.files.locations import lease_location
from gpuwarden.planning import scheduling
from gpuwarden.service.accounts import Accounts
from gpuwarden.service.identity import Admins
from gpuwarden.service.limits import Limits
from gpuwarden.usage.enforcement import EnforceSettings


@dataclass(frozen=True)
class Settings:
    """What `gpuwarden serve` is told by its configuration ([service] table)."""

    socket: str
    state_dir: str
    lease_dir: Optional[str] = None  # from_config finds it; None: the configured one
    policy: scheduling.Policy = field(default_factory=scheduling.Policy)
    admins: Admins = field(default_factory=Admins)
    max_jobs_per_user: Optional[int] = None
    max_time: Optional[float] = None
    # Interactive holds (kernels, gpuwarden.lease(), attached `run`): the time given to
    # one that asks for none, and the longest one may hold (else max_time).
    interactive_time: Optional[float] = None
    max_interactive_time: Optional[float] = None
    show_commands: bool = False
    grace: float = 30.0  # SIGTERM to SIGKILL past a time limit
    preempt_grace: float = 30.0  # a preempted job's signal to SIGKILL (Slurm's GraceTime)
    preempt_charge: float = 1.0  # the factor a preemptible job's GPU-seconds count at
    retry_backoff: float = 10.0  # before a --max-retries job's first retry, doubled each time
    webhook: Optional[str] = None  # POSTed a JSON event when a job ends
    sendmail: Optional[str] = None  # mails the owner when a job ends
    devices: str = "auto"  # enforce.devices: a device cgroup per job (auto, off, require)
    # the [enforce] policies it applies
    enforce: EnforceSettings = field(default_factory=EnforceSettings)
    enforce_every: float = 5.0  # enforce.poll_seconds
    tick: float = 1.0
    max_clients: int = 512  # connections of everyone at once
    max_clients_per_user: int = 64  # service.max_connections_per_user: below max_clients
    idle_timeout: float = 30.0  # a client that sends no whole request for this long is dropped
    max_command_bytes: int = 64 << 10  # service.max_command_bytes: a job's command line
    max_env_bytes: int = 256 << 10  # service.max_env_bytes: a job's environment
    max_journal_bytes: int = 64 << 20  # service.max_journal_bytes_per_user (journalbytes)
    keep_history: Optional[float] = None  # service.keep_history: then archived (archive)
    limits: Limits = field(default_factory=Limits)  # [service.limits]: per user and @group
    book_max_gpus: Optional[int] = None  # GPUs a user may book (None: only admins book)
    book_max_time: Optional[float] = None  # how long a user's booking may be
    sample_seconds: float = 10.0  # service.sample_seconds: running jobs' GPUs for `eff`
    accounts: Accounts = field(default_factory=Accounts)  # [service.accounts], require_account
    digest_every: float = 7 * 86400.0  # service.digest_every: subscribers' digests (0: none)
    admin_digest: bool = False  # service.admin_digest: the admins' one as well


#: What a reload cannot change in a running service: its socket and journal, and the
#: helper process forked at start that sends webhooks and mail.
RESTART_ONLY = ("socket", "state_dir", "lease_dir", "webhook", "sendmail")

#: `gpuwarden serve` options -> the configuration keys they set (over the files).
OPTION_KEYS = {
    "max_gpus_per_user": "service.max_gpus_per_user",
    "max_jobs_per_user": "service.max_jobs_per_user",
    "max_time": "service.max_time",
    "grace": "service.grace",
    "show_commands": "service.show_commands",
}


def _webhook(url: Optional[str]) -> Optional[str]:
    """`service.webhook`, posted as root: an http(s) URL only (not `file:///etc/...`)."""
    if url and (not url.startswith(("http://", "https://")) or "\n" in url or len(url) > 2048):
        raise UserError(f"service.webhook {url[:60]!r} is not an http:// or https:// URL")
    return url


def from_config(cfg: Any, fixed: Mapping[str, Any], admins: tuple[str, ...] = ()) -> Settings:
    """The settings of a configuration reading (`config.load(cli=...)`, which carries the
    command line's values over the files); `fixed` the socket and state directory the
    command line chose, `admins` the admins it added. Raises UserError naming the key
    of a bad value (an unknown group)."""
    policy = scheduling.Policy(
        weight_fairshare=cfg.get("service.weight_fairshare"),
        weight_age=cfg.get("service.weight_age"),
        weight_qos=cfg.get("service.weight_qos"),
        weight_nice=cfg.get("service.weight_nice"),
        age_max=cfg.get("service.age_max"),
        half_life=cfg.get("service.half_life"),
        shares=dict(cfg.get("service.shares") or {}),
        max_gpus_per_user=cfg.get("service.max_gpus_per_user"),
        starve_after=cfg.get("service.starve_after"),
    )
    accounts = cfg.get("service.accounts") or {}
    policy = dataclasses.replace(
        policy,
        account_shares={a: e["share"] for a, e in accounts.items() if "share" in e},
        account_caps={a: int(e["max_gpus"]) for a, e in accounts.items() if "max_gpus" in e},
    )
    return Settings(
        socket=fixed.get("socket") or cfg.get("service.socket"),
        state_dir=fixed.get("state_dir") or cfg.get("service.dir"),
        # Found once, at start: a running service keeps its lease directory (RESTART_ONLY).
        lease_dir=lease_location(cfg),
        policy=policy,
        admins=Admins.parse([*cfg.get("service.admins"), *admins]),
        max_jobs_per_user=cfg.get("service.max_jobs_per_user"),
        max_time=cfg.get("service.max_time"),
        interactive_time=cfg.get("service.interactive_time"),
        max_interactive_time=cfg.get("service.max_interactive_time"),
        show_commands=cfg.get("service.show_commands"),
        grace=cfg.get("service.grace"),
        preempt_grace=cfg.get("service.preempt_grace"),
        preempt_charge=cfg.get("service.preempt_charge"),
        retry_backoff=cfg.get("service.retry_backoff"),
        webhook=_webhook(cfg.get("service.webhook")),
        sendmail=cfg.get("service.sendmail"),
        devices=cfg.get("enforce.devices"),
        enforce=EnforceSettings.from_config(cfg),
        enforce_every=cfg.get("enforce.poll_seconds"),
        max_clients_per_user=cfg.get("service.max_connections_per_user"),
        idle_timeout=cfg.get("service.idle_timeout"),
        max_command_bytes=cfg.get("service.max_command_bytes"),
        max_env_bytes=cfg.get("service.max_env_bytes"),
        max_journal_bytes=cfg.get("service.max_journal_bytes_per_user"),
        keep_history=cfg.get("service.keep_history"),
        limits=Limits.parse(cfg.get("service.limits") or {}),
        book_max_gpus=cfg.get("service.book_max_gpus"),
        book_max_time=cfg.get("service.book_max_time"),
        sample_seconds=cfg.get("service.sample_seconds"),
        accounts=Accounts.parse(accounts, bool(cfg.get("service.require_account"))),
        digest_every=cfg.get("service.digest_every"),
        admin_digest=bool(cfg.get("service.admin_digest")),
    )


def changes(old: Settings, new: Settings) -> list[str]:
    """What differs, one `name: old -> new` each (the policy's fields by their own
    names), for the log of a reload."""
    out = []
    for name in (f.name for f in dataclasses.fields(Settings)):
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if isinstance(a, scheduling.Policy) and isinstance(b, scheduling.Policy):
            for inner in (f.name for f in dataclasses.fields(a)):
                x, y = getattr(a, inner), getattr(b, inner)
                if x != y:
                    out.append(f"{inner}: {_shown(x)} -> {_shown(y)}")
        elif name in SPANS:
            out.append(f"{name}: {_span(a)} -> {_span(b)}")
        else:
            out.append(f"{name}: {_shown(a)} -> {_shown(b)}")
    return out


#: The settings that are durations: a reload says `1d`, as the file may, not `86400.0`.
SPANS = (
    *("max_time", "interactive_time", "max_interactive_time", "book_max_time", "grace"),
    "digest_every",
)


def _span(value: Any) -> str:
    from gpuwarden.base.units import format_span

    return "-" if value is None else format_span(value)


def _shown(value: Any) -> str:
    if isinstance(value, (Limits, Accounts)):
        return value.describe()
    if isinstance(value, Admins):
        return ", ".join([*sorted(value.users), *(f"gid {g}" for g in sorted(value.groups))]) or "-"
    return "-" if value is None else str(value)
