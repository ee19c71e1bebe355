"""The stdio MCP server: `gpuwarden mcp`'s tools on the official `mcp` SDK.

Each tool is a thin call of `answers.Answers`; a `UserError` (no service, an unknown
job, a refused token) becomes the tool's error result in one line, as the command
line would print it. The read-only tools say so in their annotations, so a client
may run them without asking; `submit` is the only one that changes anything, and it
sends nothing without the preview's token (`previews`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from gpuwarden.assistant.answers import Answers, Wish
from gpuwarden.base.errors import UserError

INSTRUCTIONS = (
    "gpuwarden manages the GPUs and the job queue of this machine. Use gpus to see what "
    "is free, queue and why_pending to explain waits, my_jobs and job_log for the user's "
    "jobs, where_would_it_run before suggesting a request. submit shows a preview and a "
    "token first: show the preview to the user and call submit again with the token only "
    "if they agree. Everything runs as the user; the queue service decides."
)


def make_server(answers: Answers) -> Any:
    """The MCPServer with every tool registered."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    from gpuwarden import __version__

    server = MCPServer("gpuwarden", version=__version__, instructions=INSTRUCTIONS)
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def tool(read_only: bool = True) -> Callable[[Callable[..., Any]], Any]:
        annotations = (
            reading
            if read_only
            else ToolAnnotations(
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=False,
                open_world_hint=False,
            )
        )

        def register(fn: Callable[..., Any]) -> Any:
            import functools

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                try:
                    return fn(*args, **kwargs)
                except UserError as err:
                    raise ToolError(str(err)) from None

            return server.tool(annotations=annotations)(call)

        return register

    @tool()
    def gpus() -> dict[str, Any]:
        """Every GPU (and MIG slice) of this machine now: load, memory, temperature,
        health, drains, who leases it (user, job) and the processes on it with their users."""
        return answers.gpus()

    @tool()
    def queue(user: Optional[str] = None, limit: int = 50) -> dict[str, Any]:
        """The queue service's running jobs, then the waiting ones in the order they start,
        each with why it waits and its estimated start; `user` narrows to one user."""
        return answers.queue(user, limit)

    @tool()
    def why_pending(job: str) -> dict[str, Any]:
        """Why job `job` (an id such as 12, or an array task 12_7) waits: the service's
        reason and what it means, what it waits for, how many jobs are ahead of it and
        its estimated start."""
        return answers.why(job)

    @tool()
    def my_jobs(log_lines: int = 10) -> dict[str, Any]:
        """The user's jobs: waiting ones with why, running and recently ended ones with
        the last `log_lines` lines of their output."""
        return answers.my_jobs(max(0, min(log_lines, 100)))

    @tool()
    def job_log(job: int, lines: int = 50) -> dict[str, Any]:
        """The last `lines` lines of one of the user's jobs' output (`gpuwarden logs`)."""
        return answers.log(job, lines)

    @tool()
    def where_would_it_run(
        gpus: Optional[int] = None,
        gpu_ids: Optional[str] = None,
        min_free: Optional[str] = None,
        max_util: Optional[float] = None,
        model: Optional[str] = None,
        mig: Optional[str] = None,
        mem: Optional[str] = None,
        exclude: Optional[str] = None,
    ) -> dict[str, Any]:
        """Which GPUs a request would get now and why others are passed over, or why it
        cannot start now (`gpuwarden run --dry-run`). gpus: how many; gpu_ids: '0,1';
        min_free: '20GiB'; model: 'A100'; mig: '1g.10gb'; mem: a share such as '10GiB'."""
        wish = Wish(gpus, gpu_ids, min_free, max_util, model, mig, mem, exclude)
        return answers.would_run(wish)

    @tool()
    def usage(days: float = 30.0, by: str = "user") -> dict[str, Any]:
        """GPU usage as `gpuwarden report` gives it: GPU-hours, jobs and waits over the
        last `days`, by user, group or account (what the service shows this user); and
        the user's decayed GPU-hours, fair-share factor and last jobs' GPU-hours."""
        return answers.usage(days, by)

    @tool(read_only=False)
    def submit(
        command: list[str],
        gpus: Optional[int] = None,
        time: Optional[str] = None,
        min_free: Optional[str] = None,
        model: Optional[str] = None,
        mig: Optional[str] = None,
        mem: Optional[str] = None,
        after: Optional[list[int]] = None,
        cwd: Optional[str] = None,
        token: Optional[str] = None,
    ) -> dict[str, Any]:
        """Queue a batch job as the user (`gpuwarden submit`). First call it without
        `token`: it returns a preview (the exact command line, the request, where it
        would run now) and a token, and queues nothing. Show the preview to the user;
        only if they agree, call it again with the same arguments and that token.
        command: the words, e.g. ["python", "train.py"]; time: a limit such as '2h';
        cwd: the job's folder (its output goes to gpuwarden-ID.out there)."""
        wish = Wish(gpus, None, min_free, None, model, mig, mem, None, time)
        return answers.submit(command, wish, cwd, after or (), token)

    return server


def serve(socket: str) -> None:
    """Serve on stdin/stdout until the client closes them (the queue service at `socket`)."""
    make_server(Answers(socket)).run("stdio")
