"""The text of each file `gpuwarden slurm cluster` writes (pure): every setting under
a comment that says why it is there, so an admin can read the file as its own manual.
Slurm reads `#` to the end of a line as a comment; the comments stand on their own lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Node = Any  # gpuwarden.slurm.cluster.Node (that module imports this one)
ClusterSettings = Any


def _block(why: str, *lines: str) -> list[str]:
    return ["", *(f"# {w}" for w in why.split("\n")), *lines]


def _paths(s: ClusterSettings) -> dict[str, str]:
    """Where the daemons keep state, spool, logs and pid files: the Debian/upstream
    places, or all under --state-dir (then per node, `%n`, so nodes may share it)."""
    if s.state_dir is None:
        return {
            "StateSaveLocation": "/var/spool/slurmctld",
            "SlurmdSpoolDir": "/var/spool/slurmd",
            "SlurmctldPidFile": "/run/slurmctld.pid",
            "SlurmdPidFile": "/run/slurmd.pid",
            "SlurmctldLogFile": "/var/log/slurm/slurmctld.log",
            "SlurmdLogFile": "/var/log/slurm/slurmd.log",
        }
    d = s.state_dir
    return {
        "StateSaveLocation": f"{d}/slurmctld",
        "SlurmdSpoolDir": f"{d}/slurmd-%n",
        "SlurmctldPidFile": f"{d}/slurmctld.pid",
        "SlurmdPidFile": f"{d}/slurmd-%n.pid",
        "SlurmctldLogFile": f"{d}/slurmctld.log",
        "SlurmdLogFile": f"{d}/slurmd-%n.log",
    }


def slurm_conf(nodes: Sequence[Node], s: ClusterSettings, head: str) -> str:
    """slurm.conf: who the daemons are, the resources a job gets, the order jobs start
    in and what is counted, gpuwarden's hooks, then the nodes and their partition."""
    out = [
        head,
        "# The same file goes to every node and the controller (README says where).",
        *_daemons(s),
        *_resources(nodes),
        *_ordering(s),
        *_hooks(s),
        *_nodes(nodes, s),
    ]
    return "\n".join(out) + "\n"


def _daemons(s: ClusterSettings) -> list[str]:
    """The cluster's name, its controller, ports, user, authentication and paths."""
    host = s.controller + (f"({s.controller_address})" if s.controller_address else "")
    return [
        *_block(
            "The name accounting (slurmdbd, sacct) knows this cluster by.",
            f"ClusterName={s.name}",
        ),
        *_block(
            "The machine running slurmctld, the scheduler; every slurmd reports to it.",
            f"SlurmctldHost={host}",
        ),
        *_block(
            "slurmctld listens here; each slurmd on the next port (open both between nodes).",
            f"SlurmctldPort={s.port}",
            f"SlurmdPort={s.port + 1}",
        ),
        *_block(
            "slurmctld runs as this unprivileged user (it owns StateSaveLocation); slurmd\n"
            "runs as root, as it must to start jobs as their users.",
            f"SlurmUser={s.slurm_user}",
        ),
        *_block(
            "Every message between daemons and commands is signed with the cluster's one\n"
            "munge key, which proves who sent it (README: the munge key).",
            "AuthType=auth/munge",
            "CredType=cred/munge",
        ),
        *_block(
            "Where the daemons keep their state, spool, pid files and logs.",
            *(f"{k}={v}" for k, v in _paths(s).items()),
        ),
    ]


def _resources(nodes: Sequence[Node]) -> list[str]:
    """What a job is given: cgroups that confine it, cores, memory and GPUs apart."""
    per_cpu = [n.memory_mib // n.cpus for n in nodes if n.memory_mib]
    out = [
        *_block(
            "Jobs run in cgroups: Slurm finds all of a job's processes, and cgroup.conf's\n"
            "ConstrainDevices=yes lets a job open only the GPUs it was given (not a\n"
            "convention like CUDA_VISIBLE_DEVICES, which a program may ignore).",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/cgroup,task/affinity",
            "JobAcctGatherType=jobacct_gather/cgroup",
        ),
        *_block(
            "Cores, memory and GPUs are allocated separately (cons_tres), so several jobs\n"
            "share a node, each with its own GPUs: what a lab server does today.",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
        ),
    ]
    if per_cpu:
        out += _block(
            "A job that names no memory gets this much per CPU (the smallest node's\n"
            "memory per CPU), not the whole node, so a second job still fits beside it.",
            f"DefMemPerCPU={min(per_cpu)}",
        )
    return out


def _ordering(s: ClusterSettings) -> list[str]:
    """The order waiting jobs start in, and the accounting fair share reads."""
    out: list[str] = []
    if s.slurmdbd:
        out += _block(
            "The order of waiting jobs: fair share (who used little over the last weeks goes\n"
            "first; usage halves every 7 days), then time waited, as `gpuwarden share` and\n"
            "the queue service order one machine. Both factors need slurmdbd's records.",
            "PriorityType=priority/multifactor",
            "PriorityDecayHalfLife=7-0",
            "PriorityWeightFairshare=10000",
            "PriorityWeightAge=1000",
            "PriorityMaxAge=7-0",
        )
    else:
        out += _block(
            "Without slurmdbd Slurm keeps no usage, so there is no fair share (nor age\n"
            "factor): jobs start in the order they came (written with --no-slurmdbd;\n"
            "without it this file orders them by fair share through slurmdbd).",
            "PriorityType=priority/basic",
        )
    out += _block(
        "Smaller jobs start early in the gaps a waiting large job leaves (backfill).",
        "SchedulerType=sched/backfill",
    )
    if s.slurmdbd:
        out += _block(
            "Accounting through slurmdbd (slurmdbd.conf): usage per user for fair share,\n"
            "sacct's history, and limits per user and account (sacctmgr; README).",
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={s.slurmdbd}",
            f"AccountingStoragePort={s.port + 2}",
            "AccountingStorageEnforce=associations,limits",
            "JobCompType=jobcomp/none",
        )
        out += _block(
            "GPUs are counted as well as CPUs and memory: sacct and sreport show each job's\n"
            "GPUs and GPU hours, and fair share charges a job for them (the partition's\n"
            "TRESBillingWeights below).",
            "AccountingStorageTRES=gres/gpu",
        )
    else:
        out += _block(
            "No accounting daemon: nothing to run beyond slurmctld and slurmd. Fair share\n"
            "and per-user limits need slurmdbd and a database: write this again without\n"
            "--no-slurmdbd, which also writes slurmdbd.conf.",
            "AccountingStorageType=accounting_storage/none",
        )
    return out


def _hooks(s: ClusterSettings) -> list[str]:
    """gpuwarden's prolog and epilog, the MIG task prolog, and nodes coming back."""
    out = _block(
        "gpuwarden's hooks: the prolog leases the job's GPUs on the node (PrologFlags=Alloc:\n"
        "when the job is allocated, before it starts), the epilog frees them, so local\n"
        "`gpuwarden run` users and Slurm jobs never share a GPU (docs/slurm.md).",
        f"Prolog={s.conf_dir}/prolog.sh",
        f"Epilog={s.conf_dir}/epilog.sh",
        "PrologFlags=Alloc",
    )
    out += _block(
        "Each task of a job starts with CUDA_VISIBLE_DEVICES naming its MIG slices by UUID,\n"
        "the only way CUDA opens a slice (Slurm itself writes their gres.conf positions).",
        f"TaskProlog={s.conf_dir}/task-prolog.sh",
    )
    out += _block(
        "A node that went down by not responding comes back by itself once its slurmd\n"
        "registers again with a valid configuration; one drained by an admin (or by\n"
        "gpuwarden's health watch, slurm.drain_node) stays drained.",
        "ReturnToService=1",
    )
    return out


def _nodes(nodes: Sequence[Node], s: ClusterSettings) -> list[str]:
    """One line per node, as each node described itself, and the one partition."""
    out: list[str] = []
    for n in nodes:
        where = f" ({n.source})" if n.source != "nvml" else ""
        words = [f"NodeName={n.name}", f"NodeAddr={n.address}", f"CPUs={n.cpus}"]
        words += [f"RealMemory={n.memory_mib}"] if n.memory_mib else []
        words += [f"Gres={n.gres}", "State=UNKNOWN"]
        out += _block(
            f"{n.name}{where}: its CPUs, memory (MemTotal, as slurmd counts it) and GPUs, as\n"
            "its own `gpuwarden slurm conf --json` said; NodeAddr is where this machine\n"
            "reached it. `slurmd -C` there prints sockets, cores and threads to add.",
            " ".join(words),
        )
    partition = "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    why = "One partition of every node, the default: jobs go wherever their GPUs are free."
    if s.slurmdbd:
        partition += " TRESBillingWeights=CPU=0.1,GRES/gpu=1.0"
        why += (
            "\nFair share charges a GPU hour as 1 and a CPU hour as 0.1 (a job without GPUs\n"
            "still counts): usage is GPU time, as on one machine with `gpuwarden share`."
        )
    out += _block(why, partition)
    return out


def gres_conf(nodes: Sequence[Node], head: str) -> str:
    out = [
        head,
        "# Each node's GPUs, in its NVML index order: Slurm numbers a job's GPUs\n"
        "# (SLURM_JOB_GPUS) by their place here, which gpuwarden's prolog reads as NVML\n"
        "# indices. One file for all nodes: each line names its node.",
    ]
    for n in nodes:
        out += _block(
            f"{n.name}: {len(n.gres_lines)} line(s) from its own `gpuwarden slurm conf --json`"
            + "".join(f"\n{note}" for note in n.notes),
            *(f"NodeName={n.name} {line}" for line in n.gres_lines),
        )
    return "\n".join(out) + "\n"


def cgroup_conf(s: ClusterSettings, head: str) -> str:
    plugin = "autodetect" if s.cgroup == "autodetect" else f"cgroup/{s.cgroup}"
    why = (
        "The cgroup version the nodes run (v1 or v2), found by slurmd itself."
        if plugin == "autodetect"
        else f"The nodes run cgroup {s.cgroup} (--cgroup: slurmd could not tell by itself)."
    )
    out = [
        head,
        *_block(why, f"CgroupPlugin={plugin}"),
        *_block(
            "A job may open only the GPU device files it was given: another job's GPUs\n"
            "are not there for it, whatever CUDA_VISIBLE_DEVICES says.",
            "ConstrainDevices=yes",
        ),
        *_block(
            "A job's processes run on its allocated cores and within its memory, so one\n"
            "job's data loader cannot starve its neighbours.",
            "ConstrainCores=yes",
            "ConstrainRAMSpace=yes",
        ),
    ]
    return "\n".join(out) + "\n"


def slurmdbd_conf(s: ClusterSettings, head: str) -> str:
    where = s.state_dir
    log = f"{where}/slurmdbd.log" if where else "/var/log/slurm/slurmdbd.log"
    pid = f"{where}/slurmdbd.pid" if where else "/run/slurmdbd.pid"
    out = [
        head,
        "# On the accounting host only; readable by SlurmUser alone (it holds a password).",
        *_block(
            "slurmdbd's own host, its port (slurm.conf's AccountingStoragePort: two past\n"
            "slurmctld's) and its user.",
            f"DbdHost={s.slurmdbd}",
            f"DbdPort={s.port + 2}",
            f"SlurmUser={s.slurm_user}",
        ),
        *_block(
            "Signed with the same munge key as the rest of the cluster.", "AuthType=auth/munge"
        ),
        *_block(
            "Usage is kept in MariaDB/MySQL on this host: make the database user first\n"
            "(README), then put its password here.",
            "StorageType=accounting_storage/mysql",
            "StorageHost=localhost",
            "StorageUser=slurm",
            "StoragePass=CHANGE-ME",
        ),
        *_block(
            "Its log and pid file.",
            f"LogFile={log}",
            f"PidFile={pid}",
        ),
    ]
    return "\n".join(out) + "\n"


def readme(nodes: Sequence[Node], s: ClusterSettings, head: str) -> str:
    names = " ".join(n.name for n in nodes)
    paths = _paths(s)
    dirs = " ".join(
        sorted({paths["StateSaveLocation"], paths["SlurmctldLogFile"].rsplit("/", 1)[0]})
    )
    db = ""
    if s.slurmdbd:
        db = f"""
4b. Accounting (fair share across nodes, limits, sacct and sreport): on {s.slurmdbd},
   apt install slurmdbd mariadb-server; start MariaDB (systemctl enable --now mariadb), then
       mariadb -e "CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'a password';
                   GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
   put that password into slurmdbd.conf (StoragePass), copy it to {s.conf_dir}/ there (owner
   {s.slurm_user}, mode 600; slurmdbd refuses it otherwise) and start slurmdbd (systemctl
   enable --now slurmdbd) before slurmctld. Then, once:
       sacctmgr -i add cluster {s.name}
       sacctmgr -i add account lab
       sacctmgr -i add user NAME account=lab       (every user; root too, to submit)
   slurm.conf enforces associations: a user not added cannot submit ("Invalid account").
   Check: sacct -a -X lists finished jobs; sreport cluster utilization.
"""
    return f"""{head}
Nothing was installed or restarted. What to do, in this order:

0. Check that the machines agree (users' ids, munge key, data paths, clocks, versions):
       gpuwarden slurm cluster {names} --check --path /data
   (every directory jobs use as --path); fix each line it prints first.

1. Packages: on the controller ({s.controller}) slurmctld; on each node ({names})
   slurmd; everywhere munge and slurm-client (Debian: apt install slurmd slurm-client munge).

2. The munge key: one secret shared by every machine, which signs all of Slurm's messages.
   The munge package makes a different key on each machine at install; the cluster needs
   one. Keep the controller's /etc/munge/munge.key (or make a new one there with
   `mungekey --create --force`; owner munge, mode 400) and copy it to every node over a
   channel you trust (scp as root), same owner and mode; restart munge everywhere, then
   check from the controller: munge -n | ssh NODE unmunge

3. These files: slurm.conf, gres.conf and cgroup.conf into {s.conf_dir}/ on every machine
   (the same files everywhere); prolog.sh, epilog.sh and task-prolog.sh into {s.conf_dir}/
   on every node, owned by root, mode 755. Site settings for gpuwarden on a node go into
   {s.hook_env} (read by the hooks; `%n` is the node's name).

4. Directories: on the controller {dirs} (owner {s.slurm_user});
   on the nodes {paths["SlurmdSpoolDir"]} (owner root).
{db}
5. Start: slurmctld on the controller, then slurmd on each node (systemctl enable --now).
   Check: sinfo -N (each node idle), then
       srun -N1 --gres=gpu:1 nvidia-smi -L
   gpuwarden keeps working on each node: status, health --watch (slurm.drain_node drains
   the node in Slurm on a fatal fault), exporter, web, doctor (docs/hosts.md).
"""
