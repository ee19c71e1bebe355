"""The weekly digest: built from known jobs (pure), and sent by the service to a user's
own webhook (as them) and to the admins' `service.webhook`, every `digest_every`."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.usage import digest
from gpuwarden.usage.report import Row, Waste
from hermetic import hermetic
from repo import SRC
from schemas import validate
from servicetools import USER_PY, Server, become, cli_as, serving, submit
from users import make_user
from waiting import wait_for
from webhooks import Hook


def test_a_users_digest_names_the_jobs_that_left_their_gpus_idle() -> None:
    used = Row("all", "alice", 12.0, 3, 4, 300.0, 600.0)
    jobs = [
        Waste("812", 4.0, 3.0, 1, 1),  # 75% idle, one GPU never used
        Waste("813", 6.0, 0.5, 0, 1),  # busy: not named
        Waste("814", 2.0, 1.0, 0, 1),  # half idle: named
    ]
    d = digest.for_user("alice", used, jobs, 0.0, 7 * 86400.0)
    assert d["gpu_hours"] == 12.0 and d["jobs"] == 3 and d["idle_hours"] == 4.5
    assert d["busy_share"] == pytest.approx(1 - 4.5 / 12.0)
    assert [j["job"] for j in d["idle_jobs"]] == ["812", "814"]
    assert "job 812: 3.0 of 4.0 GPU-hours idle, 1 GPU(s) never used" in d["text"]
    assert "`gpuwarden eff 812`" in d["text"]
    quiet = digest.for_user("bob", None, [], 0.0, 86400.0)
    assert quiet["gpu_hours"] == 0 and "nothing to report" in quiet["text"]
    admins = digest.for_admins(
        [used, Row("all", "bob", 20.0, 1, 1, None, None)], [Waste("alice", 12, 4.5, 1, 2)], 0, 1
    )
    assert [u["user"] for u in admins["users"]] == ["bob", "alice"]
    assert admins["gpu_hours"] == 32.0 and admins["idle_hours"] == 4.5


@pytest.fixture
def hook() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hook.got.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/gw"
    server.shutdown()


@pytest.fixture
def digesting(
    tmp_path: Path, open_dir: Path, monkeypatch: pytest.MonkeyPatch, hook: str
) -> Iterator[Server]:
    """The service sampling every second, sending digests every 3 s, the admins' too."""
    conf = open_dir / "config.toml"
    conf.write_text(
        f'[service]\ndigest_every = "3s"\nadmin_digest = true\nwebhook = "{hook}?admin"\n'
    )
    monkeypatch.setenv("GPUWARDEN_SYSTEM_CONFIG", str(conf))
    monkeypatch.setenv("GPUWARDEN_SERVICE_SAMPLE_SECONDS", "1")
    sendmail = tmp_path / "sendmail"  # mail lands in tmp_path/mail
    sendmail.write_text(f"#!/bin/sh\ncat >> {tmp_path / 'mail'}\n")
    sendmail.chmod(0o755)
    monkeypatch.setenv("GPUWARDEN_SERVICE_SENDMAIL", str(sendmail))
    yield from serving(tmp_path, open_dir, monkeypatch)


def test_a_subscribers_digest_reaches_their_webhook_as_them_and_the_admins_theirs(
    digesting: Server, hook: str
) -> None:
    srv = digesting
    alice, bob = make_user("alice", ("lab",)), make_user("bob")
    env = {
        "PYTHONPATH": str(SRC),
        **hermetic(),
        "PATH": "/usr/bin:/bin",
        "GPUWARDEN_SOCKET": srv.socket,
        "GPUWARDEN_SUBMIT_WEBHOOK": hook + "?alice",
    }

    def digest_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [USER_PY, "-m", "gpuwarden", "digest", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=become(alice),
            cwd=str(srv.work),
        )

    done = digest_cli("--subscribe")
    assert done.returncode == 0 and "by webhook" in done.stdout, done
    idle = submit(srv, alice, ["sleep", "3"], request={"count": 1})
    srv.wait_state(idle, ("COMPLETED",), timeout=60)

    # Now, as alice asks for it: her idle job named, with the command that shows why.
    shown = validate("digest", digest_cli("--json").stdout)
    assert shown["user"] == "gw-alice" and shown["gpu_hours"] > 0, shown
    assert [j["job"] for j in shown["idle_jobs"]] == [str(idle)], shown
    assert f"gpuwarden eff {idle}" in shown["text"]

    # Sent: the digest whose period holds the job's end reaches alice's webhook, as her.
    def mine() -> list[dict[str, Any]]:
        return [g for g in Hook.got if g.get("kind") == "user" and g["idle_jobs"]]

    (got,) = wait_for(mine, 30, lambda: f"alice's digest naming job {idle}: {Hook.got}")
    assert got["user"] == "gw-alice" and got["_uid"] == alice.uid, got
    assert got["idle_jobs"][0]["job"] == str(idle) and got["idle_jobs"][0]["gpus_idle"] == 1

    # The admins' digest to service.webhook (the service's own post): everyone's use,
    # the idle hours of the runs that ended in its period.
    def admins() -> list[dict[str, Any]]:
        sent = [g for g in Hook.got if g.get("kind") == "admin"]
        return [g for g in sent if any(u["idle_hours"] > 0 for u in g["users"])]

    first = wait_for(admins, 30, lambda: f"the admins' digest: {Hook.got}")[0]
    assert [u["user"] for u in first["users"]] == ["gw-alice"], first
    assert first["_uid"] == 0 and first["idle_hours"] > 0, first

    refused = cli_as(srv, bob, "digest", "--admin")
    assert refused.returncode == 2 and "for admins" in refused.stderr, refused
    carol = make_user("carol")  # the service's admin (servicetools.serving)
    assert "gw-alice" in cli_as(srv, carol, "digest", "--admin").stdout
    validate("digest", cli_as(srv, carol, "digest", "--admin", "--json").stdout)
    # bob by mail: his digest mailed to him alone (not to the admins' webhook), and the
    # admins' mailed to the admin (gw-carol).
    by_mail = cli_as(srv, bob, "digest", "--subscribe", "--mail")
    assert by_mail.returncode == 0 and "by mail" in by_mail.stdout, by_mail
    mail = srv.root / "mail"

    def mailed() -> bool:
        text = mail.read_text() if mail.exists() else ""
        return "To: gw-bob\nSubject: gpuwarden: your GPU use" in text and "To: gw-carol" in text

    wait_for(mailed, 30, lambda: f"bob's and the admin's mail: {mail.read_text()[-2000:]}")
    assert "Subject: gpuwarden: this machine's GPU use" in mail.read_text()
    assert not [g for g in Hook.got if g.get("user") == "gw-bob"], Hook.got
    done = digest_cli("--unsubscribe")
    assert done.returncode == 0 and done.stdout.strip() == "unsubscribed", done
    assert validate("digest", digest_cli("--unsubscribe", "--json").stdout)["was"] is False


def test_archived_runs_count_in_the_digest_and_the_report_by_account(tmp_path: Path) -> None:
    """A short `service.keep_history` moves last week's jobs to archives: the digest
    and `report --by account` still count them (service.archive)."""
    import time

    from gpuwarden.service import accounting, archive, digests
    from gpuwarden.service import store as st
    from gpuwarden.usage.efficiency import GpuUse

    now = time.time()
    state = tmp_path / "state"
    state.mkdir()
    journal = st.Store(str(state / "jobs.db"))
    with journal.transaction():
        for n, (user, account, ended) in enumerate(
            (("alice", "vision", now - 5 * 86400), ("bob", None, now - 3600))
        ):
            job = journal.add(
                st.new_job(
                    uid=5000 + n,
                    gid=100,
                    user=user,
                    argv=("x",),
                    cwd="/",
                    env={},
                    umask=18,
                    request={"count": 2},
                    account=account,
                    state=st.COMPLETED,
                    submitted=ended - 7200,
                    started=ended - 3600,
                    ended=ended,
                )
            )
            ran = st.Job(**{**job.__dict__, "gpus": ("GPU-0", "GPU-1")})
            run = accounting.record_run(journal.db, ran, ended, st.COMPLETED, 2 * 3600.0)
            # sampled throughout: GPU-0 busy half the time, GPU-1 never
            accounting.save_use(
                journal.db,
                job.id,
                run,
                [
                    GpuUse("GPU-0", 3600.0, 0.0, 1800.0, 1 << 30, 80 << 30, 0.0, "gpu"),
                    GpuUse("GPU-1", 3600.0, 0.0, 0.0, 0, 80 << 30, 0.0, "gpu"),
                ],
            )

    def figures() -> tuple[Any, ...]:
        old = archive.runs(str(state), now - 7 * 86400, now)
        rows = accounting.report(journal.db, now - 7 * 86400, now, "account", "all", now, old)
        mine = digests.for_user(journal.db, str(state), "alice", now - 7 * 86400, now)
        admins = digests.for_admins(journal.db, str(state), now - 7 * 86400, now)
        idle = (mine["idle_hours"], [j["idle_hours"] for j in mine["idle_jobs"]])
        return {r.name: r.gpu_hours for r in rows}, mine["gpu_hours"], mine["jobs"], idle, admins

    before = figures()
    assert before[:4] == ({"vision": 2.0, "-": 2.0}, 2.0, 1, (1.5, [1.5]))
    assert before[4]["idle_hours"] == 3.0  # bob's too
    archive.move(journal, str(state), archive.movable(journal.db, now - 86400))
    assert journal.db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    assert figures() == before
    journal.close()
