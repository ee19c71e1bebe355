"""What a submit may ask of the service, judged before the job is journaled.

Two kinds of refusal, each one line naming its bound: a job larger than the
service keeps for one job (its command line, its environment: every job is held in
memory while it waits and in the journal for ever), and a job that could never
start on this machine whatever ran on it (more GPUs than there are, more memory
than any GPU has, a model no GPU is), which Slurm likewise refuses at submit
("Requested node configuration is not available") rather than let it wait for ever.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from gpuwarden.base.errors import UserError
from gpuwarden.base.units import format_size
from gpuwarden.queueclient import protocol
from gpuwarden.service.settings import Settings

if TYPE_CHECKING:
    from gpuwarden.config import Config
    from gpuwarden.machine.inventory import Snapshot
    from gpuwarden.placement.request import Request


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_sizes(sub: protocol.Submit, settings: Settings) -> None:
    """Refuse a command line or an environment over the service's bounds."""
    command = sum(_bytes(word) + 1 for word in sub.argv)
    if command > settings.max_command_bytes:
        raise UserError(
            f"the command line is {format_size(command)}, over the "
            f"{format_size(settings.max_command_bytes)} a job may have (service.max_command_bytes)"
        )
    env = sum(_bytes(k) + _bytes(v) + 2 for k, v in sub.env.items())
    if env > settings.max_env_bytes:
        raise UserError(
            f"the environment is {format_size(env)}, over the "
            f"{format_size(settings.max_env_bytes)} a job may have (service.max_env_bytes)"
        )


def never_runs(
    snapshot: Snapshot, request: Request, reading: Optional[Config] = None
) -> Optional[str]:
    """Why a job asking `request` could never start on the machine of `snapshot`, in the
    words `run` uses (`selection.choose`'s `never_fits`); None: it could, once its GPUs
    are free. Drains, XIDs and current use do not count: they pass. The GPUs are judged
    by the health rules of `reading`, the service's configuration (None: the one in
    force, read here)."""
    from gpuwarden.health.judgement import judge_all, rules_in_force
    from gpuwarden.placement.selection import choose

    if request.count == 0:
        return None
    try:
        choice = choose(
            snapshot, request, health=judge_all(snapshot.gpus, {}, rules_in_force(reading))
        )
    except UserError as err:  # a named GPU this machine does not have
        return str(err)
    return choice.error if choice.never_fits else None


class Judged:
    """`never_runs`' answers, kept while the machine and the configuration they were
    judged on are the same objects (the snapshot read at start, the reading a pass
    keeps while its files stay as read): a sweep's submits ask alike, and each
    answer cost a choice over every GPU. One per service (`Context.judged`)."""

    MOST = 256  # distinct requests kept; more start the memory afresh

    def __init__(self) -> None:
        self._on: tuple[object, object] = (None, None)
        self._answers: dict[Request, Optional[str]] = {}
        self.judged = 0  # answers worked out, not recalled

    def never_runs(
        self, snapshot: Snapshot, request: Request, reading: Optional[Config]
    ) -> Optional[str]:
        on = self._on
        if on[0] is not snapshot or on[1] is not reading or len(self._answers) >= self.MOST:
            self._on, self._answers = (snapshot, reading), {}
        try:
            return self._answers[request]
        except KeyError:
            pass
        except TypeError:  # a request that cannot be a key: judged each time
            return never_runs(snapshot, request, reading)
        self.judged += 1
        answer = self._answers[request] = never_runs(snapshot, request, reading)
        return answer
