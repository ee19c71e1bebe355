"""`gpuwarden slurm conf|prolog|epilog`: an admin's help to run Slurm on this machine.

gpuwarden slurm conf [--json]     gres.conf lines and the NodeName= line, from NVML
gpuwarden slurm cluster HOST... --out DIR
                                  a whole small-lab configuration from each host's
                                  `slurm conf --json` over ssh (writes files only)
gpuwarden slurm cluster HOST... --check [--path DIR]...
                                  users, munge, paths, clocks, versions, GPUs agree?
gpuwarden slurm facts             (for --check, over ssh) this host's facts as JSON
gpuwarden slurm prolog            (slurmd's Prolog=) lease the job's GPUs
gpuwarden slurm epilog            (slurmd's Epilog=) free them
gpuwarden slurm task-prolog       (slurmd's TaskProlog=) a MIG job's CUDA_VISIBLE_DEVICES
"""

from __future__ import annotations

import os
import sys

from gpuwarden.base.errors import UserError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from argparse import SUPPRESS  # argparse is loaded: the parser is being built

    from gpuwarden.cli import subcommand

    # `slurm cluster --out DIR gpu1 gpu2` as well as `slurm cluster gpu1 gpu2 --out DIR`
    parser = subcommand(commands, name, intermixed=True)
    parser.add_argument(
        "action",
        choices=("conf", "cluster", "prolog", "epilog", "task-prolog", "facts"),
        help="what to do",
    )
    parser.add_argument(
        "hosts", nargs="*", metavar="HOST", help="cluster: the nodes, as ssh names them"
    )
    parser.add_argument("--json", action="store_true", help="conf: one JSON document")
    parser.add_argument(
        "--section",
        choices=("all", "gres", "node"),
        default="all",
        help="conf: only gres.conf's lines, or only slurm.conf's NodeName= line",
    )
    parser.add_argument(
        "--dev-dir", metavar="DIR", default="/dev", help="conf: where nvidiaN are (/dev)"
    )
    parser.add_argument("--type", metavar="NAME", help="conf: a gres type for these GPUs")
    cluster = parser.add_argument_group("cluster (docs/hosts.md)")
    cluster.add_argument("--out", metavar="DIR", help="the new directory the files go into")
    cluster.add_argument("--name", default="lab", help="ClusterName (lab)")
    cluster.add_argument(
        "--controller",
        metavar="NAME[=ADDRESS]",
        help="slurmctld's host (default: this one, by its short hostname)",
    )
    cluster.add_argument(
        "--state-dir", metavar="DIR", help="state, spool, logs and pid files under DIR"
    )
    cluster.add_argument("--conf-dir", metavar="DIR", default="/etc/slurm", help="/etc/slurm")
    cluster.add_argument("--slurm-user", metavar="USER", default="slurm", help="slurm")
    cluster.add_argument(
        "--port", type=int, default=6817, help="slurmctld's port (6817); slurmd, slurmdbd the next"
    )
    cluster.add_argument(
        "--hook-env",
        metavar="FILE",
        default="/etc/default/gpuwarden",
        help="the hooks read GPUWARDEN_* settings from FILE if present (%%n: the node)",
    )
    cluster.add_argument(
        "--slurmdbd",
        metavar="HOST",
        help="where slurmdbd keeps usage for fair share and limits (default: the controller)",
    )
    cluster.add_argument(
        "--no-slurmdbd",
        action="store_true",
        help="no accounting daemon: first come, first served (no fair share)",
    )
    cluster.add_argument(
        "--check",
        action="store_true",
        help="only check that the hosts agree (users, munge, --path, clocks, versions, GPUs)",
    )
    cluster.add_argument(
        "--path",
        metavar="DIR",
        action="append",
        default=[],
        help="--check: a directory every host must have (data, shared homes); repeatable",
    )
    cluster.add_argument(
        "--munge-key",
        metavar="FILE",
        default="/etc/munge/munge.key",
        help="--check: munge's key, compared by hash where readable",
    )
    # `slurm facts`: a munge credential made on the checking machine, to decode here
    cluster.add_argument("--credential", help=SUPPRESS)
    cluster.add_argument(
        "--cgroup",
        choices=("autodetect", "v1", "v2"),
        default="autodetect",
        help="the nodes' cgroup version, where slurmd cannot tell (autodetect)",
    )


def run(args: argparse.Namespace) -> int:
    if args.hosts and args.action != "cluster":
        raise UserError(f"slurm {args.action} takes no host names (`slurm cluster` does)")
    if args.action == "conf":
        return conf(args)
    if args.action == "cluster":
        return cluster(args)
    if args.action == "facts":
        return facts(args)
    if args.action == "task-prolog":
        from gpuwarden.slurm import taskenv

        return taskenv.main(os.environ)
    from gpuwarden import config as cfg
    from gpuwarden.slurm import prolog

    if args.action == "prolog":
        timeout = float(cfg.load({}).get("slurm.prolog_timeout"))
        print(prolog.prolog(os.environ, timeout), file=sys.stderr)
    else:
        print(prolog.epilog(os.environ), file=sys.stderr)
    return 0


def conf(args: argparse.Namespace) -> int:
    from gpuwarden.slurm import facts

    if args.type is not None:
        from gpuwarden.slurm.batch import check_word

        check_word("--type", args.type)
    found = facts.read(args.dev_dir, args.type)
    if args.json:
        import json

        print(json.dumps(found, indent=2))
    else:
        print(facts.text(found, args.section))
    return 0


def cluster(args: argparse.Namespace) -> int:
    """Each host's `slurm conf --json` over ssh, made into files under --out."""
    from gpuwarden.hosts import remote
    from gpuwarden.slurm import cluster as made

    if not args.hosts:
        raise UserError(
            "slurm cluster needs the nodes' host names: slurm cluster HOST... --out DIR"
        )
    if not args.out and not args.check:
        raise UserError("slurm cluster needs --out DIR (a new directory for the files)")
    for name in args.hosts:
        remote.check_host(name)
    settings = made.ClusterSettings.parse(args)
    if args.check:
        from gpuwarden.slurm.precheck import check

        return check(args)
    argv = ["slurm", "conf", "--json", f"--dev-dir={args.dev_dir}"]
    if args.type:
        argv.append(f"--type={args.type}")
    nodes, problems = made.nodes_of(remote.ask_json(list(dict.fromkeys(args.hosts)), argv))
    if problems:
        raise UserError("cannot describe every node: " + "; ".join(problems))
    files = made.files(nodes, settings)
    made.write(args.out, files)
    for name in files:
        print(f"{args.out.rstrip('/')}/{name}")
    print(f"next: {args.out.rstrip('/')}/README (munge key, where each file goes, start order)")
    return 0


def facts(args: argparse.Namespace) -> int:
    """This host's facts for `slurm cluster --check` (one JSON document)."""
    import json

    from gpuwarden.slurm import hostfacts

    for path in args.path:
        if not path.startswith("/"):
            raise UserError(f"--path needs an absolute path, got {path!r}")
    found = hostfacts.read(args.path, args.munge_key, args.credential, args.conf_dir, args.dev_dir)
    print(json.dumps(found))
    return 0
