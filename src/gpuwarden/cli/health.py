"""`gpuwarden health`: judge each GPU; `--watch` keeps listening, drains and notifies.

Exit status of a one-shot check, for scripts and monitoring agents: 0 all
GPUs ok, 1 a warning somewhere, 3 a fatal finding somewhere (2 stays the
"bad request" code every gpuwarden command uses).
"""

from __future__ import annotations

import json
import sys
from typing import Any

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands

EXIT = {"ok": 0, "warning": 1, "fatal": 3}


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="keep running: listen for XIDs, poll, drain on fatal findings, call hooks",
    )
    parser.add_argument(
        "--policy",
        choices=("drain", "alert"),
        help="with --watch: drain GPUs with fatal findings, or only alert (health.policy)",
    )
    parser.add_argument(
        "--clear",
        nargs="*",
        metavar="GPU",
        help="forget the XIDs recorded so far (on these GPUs: index or UUID; all if none given)",
    )


def _resolve(snapshot: Any, ids: list[str]) -> list[str]:
    from gpuwarden.base.errors import UserError

    uuids = []
    for ident in ids:
        hit = [
            g
            for g in snapshot.gpus
            if ident == str(g.index) or (len(ident) >= 5 and g.uuid.startswith(ident))
        ]
        if len(hit) != 1:
            known = ", ".join(str(g.index) for g in snapshot.gpus) or "none"
            raise UserError(f"unknown GPU {ident!r} (GPUs here: {known})")
        uuids.append(hit[0].uuid)
    return uuids


def run(args: argparse.Namespace) -> int:
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from gpuwarden.health import judgement, xidlog
    from gpuwarden.health.drain import list_drains
    from gpuwarden.machine.inventory import read_snapshot

    snapshot = read_snapshot(processes=False)
    if args.clear is not None:
        uuids = _resolve(snapshot, args.clear)
        xidlog.clear_xids(uuids)
        what = ", ".join(args.clear) if args.clear else "all GPUs"
        print(f"forgot recorded XIDs on {what}")
        left = xidlog.xids_seen()
        kept = sorted({u for u in left if not uuids or u in uuids})
        if kept:
            # The shared log (root's watch) still has them: only its writer clears it.
            print(
                f"XIDs recorded by the shared health watch remain on {len(kept)} GPU(s); "
                "only its user (root) can clear them (sudo gpuwarden health --clear)",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.watch:
        return _watch(args)
    if snapshot.error and not snapshot.gpus:
        from gpuwarden.base.errors import UserError

        raise UserError(f"no GPUs to judge: {snapshot.error}")
    rules = judgement.rules_from_config()
    xids = xidlog.xids_seen()
    drains = list_drains()
    rows = []
    worst = judgement.OK
    for gpu in snapshot.gpus:
        findings = judgement.judge(gpu, xids.get(gpu.uuid, ()), rules=rules)
        state = judgement.level(findings)
        worst = judgement.level((judgement.Symptom(worst, ""), judgement.Symptom(state, "")))
        drain = drains.get(gpu.uuid)
        rows.append((gpu, state, findings, drain))
    if args.json:
        print(json.dumps(_as_json(snapshot, rows), indent=2))
    else:
        _print_table(rows)
    return EXIT[worst]


def _as_json(snapshot: Any, rows: list) -> dict:
    return {
        "hostname": snapshot.hostname,
        "taken_at": snapshot.taken_at,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "state": state,
                "drained": None if drain is None else drain.reason,
                "drained_by": None if drain is None else drain.who,
                "findings": [
                    {"level": f.level, "reason": f.reason, "action": f.action, "code": f.code}
                    for f in findings
                ],
            }
            for gpu, state, findings, drain in rows
        ],
    }


def _print_table(rows: list) -> None:
    print(f"{'GPU':<4} {'STATE':<8} {'DRAINED':<8} REASON / ACTION")
    for gpu, state, findings, drain in rows:
        mark = "yes" if drain is not None else "-"
        name = gpu.name or gpu.uuid
        if not findings:
            print(f"{gpu.index:<4} {state:<8} {mark:<8} {name}")
        for n, f in enumerate(findings):
            head = f"{gpu.index:<4} {f.level:<8} {mark:<8}" if n == 0 else " " * 22
            print(f"{head} {f.reason}")
            if f.action:
                print(f"{'':<22}   -> {f.action}")
        if drain is not None:  # by and reason are escaped when the record is read
            print(f"{'':<22}   drained by {drain.who}: {drain.reason}")


def _watch(args: argparse.Namespace) -> int:
    import signal
    import threading

    from gpuwarden.health.watch import HealthWatch, settings_from_config

    settings = settings_from_config(policy=args.policy)
    stop = threading.Event()

    def said(gpu: Any, finding: Any, event: dict) -> None:
        if args.json:
            print(json.dumps(event), flush=True)
        else:
            done = " (drained)" if event.get("drained") else ""
            print(
                f"GPU {gpu.index} {finding.level}: {finding.reason}{done}; {finding.action}",
                flush=True,
            )

    watch = HealthWatch(settings, on_finding=said)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    hooks = [x for x in (settings.hook and "hook", settings.webhook and "webhook") if x]
    import logging

    logging.getLogger("gpuwarden.health").info(
        "watching GPU health (policy %s, poll every %gs%s); Ctrl-C to stop",
        settings.policy,
        settings.poll_seconds,
        f", {' and '.join(hooks)}" if hooks else "",
    )
    watch.start()
    while not stop.wait(0.5):
        pass
    watch.stop()
    return 0
