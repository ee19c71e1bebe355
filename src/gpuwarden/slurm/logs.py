"""A Slurm job's output file, found through `scontrol show job` and read with the care
gpuwarden.joboutput takes with any file a job's user chose."""

from __future__ import annotations

from gpuwarden import joboutput
from gpuwarden.errors import UserError
from gpuwarden.slurm import tools
from gpuwarden.slurm.states import ENDED, state_word
from gpuwarden.units import is_digits


def _uid(user_field: str) -> int:
    """scontrol's `UserId=alice(1001)` -> 1001; -1 when it cannot be read."""
    _head, _, rest = user_field.partition("(")
    digits = rest.rstrip(")")
    return int(digits) if is_digits(digits) else -1


def show(job: str, follow: bool = False) -> int:
    tools.check_id(job)
    info = {"now": tools.show_job(job)}
    path = info["now"].get("StdOut", "")
    if not path or path == "/dev/null":
        raise UserError(f"Slurm job {job} keeps no output file (StdOut={path or 'unset'})")

    def ended() -> bool:
        over = state_word(info["now"].get("JobState", "")) in ENDED
        if not over:
            info["now"] = tools.show_job(job)
        return over

    uid = _uid(info["now"].get("UserId", ""))
    return joboutput.show(path, uid, ended, follow, f"Slurm job {job}")
