"""Whether the submitter can write a job's output file, asked of the kernel as the
submitter, and judged in one place.

The service opens the output as the submitter when the job starts, and a job that
cannot write it fails with an empty log: `submit` refuses such a file at once, in
one line. The kernel's answer to the submitting process is the job's, so the facts
come from that process (`probe`); the judgement (`judge`) is pure, so the service
can judge the facts the short client (`queueclient.thin`) sends with its command
line. Imports nothing beyond `os` (and `UserError` once it refuses), and no
`__future__`: the short client's start pays for each module it loads.
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Optional


def where(output: "Optional[str]", cwd: str) -> str:
    """The output's absolute path, or the working directory where the default goes."""
    return cwd if output is None else os.path.normpath(os.path.join(cwd, output))


def probe(path: str) -> list[bool]:
    """What `judge` needs of `path`, as this process may use it: is a directory, exists,
    writable, writable and searchable, its directory writable and searchable."""
    wx = os.W_OK | os.X_OK
    return [
        os.path.isdir(path),
        os.path.exists(path),
        os.access(path, os.W_OK),
        os.access(path, wx),
        os.access(os.path.dirname(path), wx),
    ]


def judge(output: "Optional[str]", path: str, facts: "Sequence[bool]") -> None:
    """Refuse, in one line, an output (`path`, from `where`) its submitter could not
    write, given `probe(path)` as the submitter saw it."""
    from gpuwarden.base.errors import UserError

    isdir, exists, writable, usable, parent = facts
    if output is not None and isdir:
        raise UserError(f"--output {output} is a directory: name a file in it")
    if output is not None and exists:
        ok, what = writable, path
    else:
        what = os.path.dirname(path) if output is not None else path
        ok = parent if output is not None else usable
    if not ok:
        default = (
            "" if output is not None else " (the default output, gpuwarden-ID.out, goes there)"
        )
        raise UserError(
            f"you cannot write {what}{default}: the job's output would be lost; "
            "choose --output in a directory of yours"
        )


def check(output: "Optional[str]") -> None:
    """`judge` of this process's own view: the full client's check."""
    path = where(output, os.getcwd())
    judge(output, path, probe(path))
