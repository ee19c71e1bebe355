"""The texts `gpuwarden service install` writes: the unit, the tmpfiles.d entry, the
exporter's drop-in and the commented [service] table (deploy/ ships the first two).

Each setting of the unit says why it is there, or why a sandboxing option that
systemd offers is left off: jobs of every user run in this unit's cgroup and inherit
its restrictions, so each one is weighed against what a training job needs.
"""

from __future__ import annotations

import os

UNIT_TEMPLATE = """\
# systemd unit for the gpuwarden queue service of a shared machine (docs/service.md).
# Installed by `gpuwarden service install`; settings come from the [service] table
# of /etc/gpuwarden/config.toml. The tmpfiles.d entry gpuwarden.conf makes its
# directories (/run/gpuwarden for the socket, /var/lib/gpuwarden for the journal).
[Unit]
Description=gpuwarden queue service (GPU jobs of every user, as their owners)
Documentation=https://github.com/gpuwarden/gpuwarden/blob/main/docs/service.md
After=network-online.target nvidia-persistenced.service systemd-tmpfiles-setup.service
Wants=network-online.target

[Service]
Type=simple
ExecStart={exec_start} serve
# `systemctl reload gpuwarden`: the service reads its policy again (SIGHUP), no restart.
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=2
Environment=PYTHONUNBUFFERED=1
# Root, deliberately: the service starts each job as the user who submitted it
# (initgroups, setgid, setuid), and only root may do that.
User=root
# Jobs outlive the service: a restart or upgrade of the service must not kill
# running training jobs. Only the service's own process is stopped; it finds its
# jobs again from the journal when it starts (docs/service.md, "Crash safety").
KillMode=process
# Jobs run in this unit's cgroup: the default task limit would cap every user's
# DataLoader workers and threads together.
TasksMax=infinity
# Jobs inherit these limits: NCCL over InfiniBand and CUDA pinned memory lock
# memory, which the default 8 MiB would refuse.
LimitMEMLOCK=infinity
# Sandboxing, as far as a service that runs arbitrary user jobs allows:
# - /usr, /boot and /etc read-only (users could not write there anyway).
ProtectSystem=full
# - no kernel log reading, host name changes, realtime scheduling or personality
#   changes from the service or its jobs.
ProtectKernelLogs=yes
ProtectHostname=yes
RestrictRealtime=yes
LockPersonality=yes
# Kept, and why:
# - home directories writable (ProtectHome off): jobs read and write the user's files.
# - the shared /tmp (PrivateTmp off): jobs meet their users' other processes there.
# - every device (PrivateDevices off, no DevicePolicy or DeviceAllow, and no
#   ProtectClock, which adds a DeviceAllow rule and so closes the others): jobs open
#   /dev/nvidia*, /dev/nvidia-uvm and /dev/infiniband/*.
# - setuid programs and module loading (NoNewPrivileges and ProtectKernelModules
#   off): CUDA's first use may run the setuid nvidia-modprobe to load nvidia-uvm
#   and create its device nodes.
# - /sys writable (ProtectKernelTunables and ProtectControlGroups off): jobs are
#   placed in cgroups under /sys/fs/cgroup, which a read-only /sys would cover.
# - setgid files and directories (RestrictSUIDSGID off): labs share group
#   directories with the setgid bit, and jobs copy them.
# - writable W+X memory (MemoryDenyWriteExecute off): PyTorch, Triton and CUDA JIT.
# - namespaces, address families and system calls unrestricted: jobs are the users'
#   own programs (containers, NCCL sockets, any library).

[Install]
WantedBy=multi-user.target
"""

TMPFILES = """\
# tmpfiles.d entry for the gpuwarden queue service (docs/operations.md).
# Installed as /etc/tmpfiles.d/gpuwarden-service.conf by `gpuwarden service install`.
# Where the shared-directory snippet gpuwarden.conf (1777) is installed too, this
# file's lines win for the same paths: its name sorts first.
# /run is emptied at boot: the socket's directory is made again before the service.
d /run/gpuwarden 0755 root root -
d /var/lib/gpuwarden 0755 root root -
# The journal: job commands and environments, root only.
d /var/lib/gpuwarden/service 0700 root root -
# Leases and drains belong to the service: readable by all (status), writable by root
# only, so that no user can hold a GPU's lock or drain it behind the service's back.
d /var/lib/gpuwarden/leases 0755 root root -
d /var/lib/gpuwarden/state 0755 root root -
"""

EXPORTER_DROPIN_TEXT = """\
# Installed by `gpuwarden service install` (docs/operations.md).
# With the queue service the lease and state directories belong to root, mode 0755,
# so that no user can create or hold lock files or drains there. The exporter's unit
# makes them sticky and world-writable (StateDirectoryMode=1777) for machines without
# a service, and systemd applies that mode each time the exporter starts: this keeps
# them closed. The exporter runs as root and owns them, so it still writes drains.
[Service]
StateDirectoryMode=0755
"""

CONFIG_SECTION = """\

# --- added by `gpuwarden service install` (docs/service.md, `gpuwarden config`) ---
[service]
# socket = "/run/gpuwarden/gpuwarden.sock"   # where clients reach the service
# dir = "/var/lib/gpuwarden/service"          # the journal and job records
# admins = ["alice", "@gpu-admins"]            # may act on every job; root always may
# max_gpus_per_user = 4                        # GPUs one user may use at once
# max_jobs_per_user = 100                      # jobs one user may have queued or running
# max_time = "3d"                              # longest --time (then --time is required)
# interactive_time = "8h"                      # a kernel's, lease()'s or run's time if none given
# max_interactive_time = "1d"                  # longest of those (else max_time)
# grace = 30                                   # seconds from SIGTERM to SIGKILL past --time
# half_life = 604800                           # fair-share usage halves in 7 days
# shares = { alice = 2, bob = 1 }              # fair-share weights (others get 1)
# show_commands = false                        # show everyone's command lines in `queue`
# webhook = "https://chat.example/hook"        # a JSON POST when a job ends
# sendmail = "/usr/sbin/sendmail"              # mail owners when their job ends

# Limits per user and per @group (a user's own entry first, then their most generous
# group, then the keys above); `gpuwarden limits` shows each user theirs.
# [service.limits]
# "@students" = { max_gpus = 2, max_jobs = 20, max_time = "1d", gpu_hours_per_week = 100 }
# "@postdocs" = { max_gpus = 4, max_interactive_time = "12h" }
# alice = { max_gpus = 8 }
"""


def unit_text(exec_start: str) -> str:
    """The unit, starting `exec_start serve` (a path to the `gpuwarden` program, or
    `python -m gpuwarden`)."""
    return UNIT_TEMPLATE.format(exec_start=exec_start)


def default_exec_start() -> str:
    """The `gpuwarden` installed beside this Python (a venv's bin/), else this Python
    running the package: the unit must start the gpuwarden that installed it."""
    import sys

    beside = os.path.join(os.path.dirname(sys.executable), "gpuwarden")
    if os.access(beside, os.X_OK):
        return beside
    return f"{sys.executable} -m gpuwarden"


#: The exporter's and the web page's units (deploy/ ships the same files), which
#: `service install --exporter/--web` installs beside the service's.
COMPANIONS = {"exporter": "gpuwarden-exporter.service", "web": "gpuwarden-web.service"}


def companion_unit(name: str, exec_start: str) -> str:
    """The unit `name` (a value of COMPANIONS), starting `exec_start` (the installing
    gpuwarden, as the service's unit does) instead of /usr/local/bin/gpuwarden."""
    from importlib.resources import files

    text = (files("gpuwarden.service") / "units" / name).read_text(encoding="utf-8")
    text = text.replace("ExecStart=/usr/local/bin/gpuwarden ", f"ExecStart={exec_start} ")
    if name == COMPANIONS["exporter"]:
        # The queue service runs the health watch itself (service.healthwatch): beside
        # it, the exporter's would drain and post every finding a second time.
        text = text.replace(
            f"ExecStart={exec_start} exporter\n", f"{WATCHED}{exec_start} exporter --no-watch\n"
        )
    return text


#: What the exporter's unit says beside a queue service, which watches health itself.
WATCHED = "# The queue service watches GPU health itself: --no-watch.\nExecStart="
