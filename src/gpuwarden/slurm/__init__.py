"""Handing jobs to Slurm, and sharing a machine with it (see docs/slurm.md).

gpuwarden does not schedule across machines; Slurm does. This package turns the
request a user would give `gpuwarden run` into a Slurm job (`batch`, pure),
talks to Slurm's own commands in fixed text formats (`tools`), maps Slurm's
states and pending reasons to the words of the local queue (`states`, pure),
writes `gres.conf` for a machine (`gres`, pure over a Snapshot), and keeps
gpuwarden leases for the GPUs Slurm gives a job (`prolog`), so local users and
Slurm jobs never share a GPU.

Nothing here is imported by `gpuwarden run` unless `--slurm` is given.
"""
