"""`gpuwarden mcp` driven by the `mcp` SDK's own client over stdio, as an assistant
drives it: started as a real non-root user against the real queue service on the
simulated server. It lists its tools, says why a job waits in the service's words,
shows the GPUs, and queues a job only with its preview's token."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from typing import Any

from components import require
from hermetic import hermetic
from pythons import python_for
from servicetools import SPEC, Server, submit
from users import make_user

try:
    import mcp
except ImportError:  # pragma: no cover - the test group installs it
    mcp = None  # type: ignore[assignment]

READ_ONLY = {"gpus", "queue", "why_pending", "my_jobs", "job_log", "where_would_it_run", "usage"}


def session_as(srv: Server, user: str, body: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run `body(session)` against `gpuwarden mcp` started as `user` (runuser), in the
    service's shared work folder; its result."""
    require(mcp is not None, "the mcp SDK is not installed (pip install 'gpuwarden[mcp]')")
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    python, path = python_for(user)
    params = StdioServerParameters(
        command=shutil.which("runuser") or "runuser",
        args=["-u", user, "--", *python, "-m", "gpuwarden", "mcp", "--socket", srv.socket],
        env={
            **hermetic(),  # the test's config, leases and state, never the machine's
            "PYTHONPATH": path,
            "PATH": "/usr/bin:/bin",
            "GPUWARDEN_SIM": SPEC,
            "GPUWARDEN_LEASE_DIR": os.environ["GPUWARDEN_LEASE_DIR"],
        },
        cwd=str(srv.work),
    )

    async def main() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)

    return asyncio.run(asyncio.wait_for(main(), 120))


def content(result: Any) -> Any:
    """A tool's answer: its structured content, else its text parsed as JSON."""
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def test_an_assistant_lists_the_tools_and_learns_why_a_job_waits(server: Server) -> None:
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    blocker = submit(server, bob, ["sleep", "120"], request={"count": 4}, time_limit=300.0)
    server.wait_state(blocker, ("RUNNING",))
    waiting = submit(server, alice, ["true"], request={"count": 2}, time_limit=60.0)
    held = submit(server, alice, ["true"], request={"count": 1}, hold=True)

    async def ask(session: Any) -> dict[str, Any]:
        tools = await session.list_tools()
        answers = {"tools": {t.name: t for t in tools.tools}}
        for name, args in (
            ("why", {"job": str(waiting)}),
            ("held", {"job": str(held)}),
        ):
            answers[name] = content(await session.call_tool("why_pending", args))
        answers["gpus"] = content(await session.call_tool("gpus", {}))
        answers["queue"] = content(await session.call_tool("queue", {}))
        answers["mine"] = content(await session.call_tool("my_jobs", {"log_lines": 5}))
        answers["where"] = content(await session.call_tool("where_would_it_run", {"gpus": 2}))
        answers["unknown"] = await session.call_tool("why_pending", {"job": "999999"})
        return answers

    got = session_as(server, "gw-alice", ask)
    try:
        assert set(got["tools"]) == READ_ONLY | {"submit"}
        for name in READ_ONLY:
            assert got["tools"][name].annotations.read_only_hint is True, name
        assert got["tools"]["submit"].annotations.read_only_hint is False

        row = server.job(waiting)
        why = got["why"]
        assert why["reason"] == row["reason"] == "Resources", (why, row)
        assert why["state"] == "PENDING" and "2 GPUs" in why["waits_for"]
        assert "not enough free GPUs" in why["summary"]
        assert got["held"]["reason"] == "Held" and "releases" in got["held"]["meaning"]

        gpus = got["gpus"]["gpus"]
        assert [g["index"] for g in gpus] == [0, 1, 2, 3]
        assert all(x["user"] == "gw-bob" for g in gpus for x in g["leases"]), gpus
        assert any(j["job"] == str(blocker) for j in got["queue"]["running"])
        assert {j["job"] for j in got["queue"]["waiting"]} == {str(waiting), str(held)}
        assert got["queue"]["you"] == "gw-alice"
        assert {j["job"] for j in got["mine"]["jobs"]} >= {str(waiting), str(held)}
        assert str(blocker) not in {j["job"] for j in got["mine"]["jobs"]}
        assert got["where"]["fits_now"] is False, got["where"]
        assert got["unknown"].is_error and "not queued or running" in got["unknown"].content[0].text
    finally:
        server.call(None, "cancel", jobs=[blocker, waiting, held])


def test_a_submit_is_sent_only_with_its_previews_token(server: Server) -> None:
    make_user("alice", ("lab",))
    before = {j["id"] for j in server.call(None, "queue")["jobs"]}
    command = {"command": ["sh", "-c", "echo hello from mcp"], "gpus": 1, "time": "5m"}

    async def submitting(session: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["forged"] = await session.call_tool("submit", {**command, "token": "0" * 32})
        out["preview"] = content(await session.call_tool("submit", command))
        token = out["preview"]["token"]
        other = {**command, "gpus": 2, "token": token}
        out["other"] = await session.call_tool("submit", other)
        out["sent"] = content(await session.call_tool("submit", {**command, "token": token}))
        out["again"] = await session.call_tool("submit", {**command, "token": token})
        return out

    got = session_as(server, "gw-alice", submitting)
    assert got["forged"].is_error and "refused" in got["forged"].content[0].text
    preview = got["preview"]
    assert preview["submitted"] is False and len(preview["token"]) == 32
    assert preview["preview"]["command_line"].startswith("gpuwarden submit --count=1 --time=5m")
    assert (
        got["other"].is_error and "not the preview of this request" in got["other"].content[0].text
    )
    assert got["again"].is_error and "used already" in got["again"].content[0].text
    sent = got["sent"]
    assert sent["submitted"] is True, sent
    jobs = [j for j in server.call(None, "queue")["jobs"] if j["id"] not in before]
    ended = [j for j in server.call(None, "jobs", limit=50)["jobs"] if j["id"] not in before]
    mine = [j for j in jobs + ended if str(j["id"]) == sent["job"]]
    assert len(jobs + ended) == 1 and len(mine) == 1, (jobs, ended, sent)
    assert mine[0]["user"] == "gw-alice"  # the kernel's word: the server runs as her
    row = server.wait_state(int(sent["job"]), ("COMPLETED",))
    assert row["exit_code"] == 0

    async def usage(session: Any) -> Any:
        return content(await session.call_tool("usage", {"days": 1}))

    used = session_as(server, "gw-alice", usage)
    assert used["you"] == "gw-alice" and used["report"]["by"] == "user"
    mine = [r for r in used["report"]["rows"] if r["name"] == "gw-alice"]
    assert len(mine) == 1 and mine[0]["jobs"] >= 1, used  # as `gpuwarden report` counts


def test_without_the_sdk_mcp_says_how_to_get_it() -> None:
    """The command is there without the extra: one line naming it."""
    import subprocess
    import sys

    from repo import SRC

    probe = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def fake(name, *a, **k):\n"
        "    if name == 'mcp' or name.startswith('mcp.'):\n"
        "        raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = fake\n"
        "from gpuwarden.cli import main\n"
        "sys.exit(main(['mcp']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "pip install 'gpuwarden[mcp]'" in done.stderr, done.stderr
