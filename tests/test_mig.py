"""MIG slices as GPUs of their own: chosen by profile, leased, and seen in every view.

The simulated `mixed` machine has an A100 split into 3g.40gb (grace computes in it),
2g.20gb, 1g.10gb (heidi's notebook) and 1g.10gb; docs/mig.md is the user's account.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuwarden.leases import LeaseInfo
from gpuwarden.machine.inventory import Gpu, GpuProcess, MigInstance, Snapshot
from gpuwarden.monitoring.enforcer import Enforcer
from gpuwarden.placement.request import Request
from gpuwarden.placement.selection import choose
from gpuwarden.usage.enforcement import EnforceSettings
from gpuwarden.web.model import build

Cli = Callable[..., Any]
GIB = 2**30
FREE_1G = "MIG-a519e028-12b6-5f0e-b6eb-f2727e12e20a"  # the 1g.10gb nobody uses
SLICE_2G = "MIG-44d5e7c7-29e5-5224-b9a1-2b9b2e5ed9e6"
PACKAGE = Path(__file__).resolve().parent.parent / "src" / "gpuwarden"


def valid(schema: str, document: Any) -> Any:
    """`document` (parsed from text), after checking it against the published schema."""
    if isinstance(document, str):
        document = json.loads(document)
    rules = json.loads((PACKAGE / schema).read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(json.dumps(document)), rules)
    return document


def me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def a100(*procs: GpuProcess) -> Snapshot:
    """GPU 0 plain, GPU 1 an A100 in MIG mode with a 3g.40gb and two 1g.10gb slices."""
    slices = (
        MigInstance("MIG-a", 0, 1, 0, "3g.40gb", 40 * GIB, 0),
        MigInstance("MIG-b", 1, 2, 0, "1g.10gb", 10 * GIB, 2 * GIB),
        MigInstance("MIG-c", 2, 3, 0, "1g.10gb", 10 * GIB, 0),
    )
    return Snapshot(
        100.0,
        "lab1",
        gpus=(
            Gpu(0, "GPU-0", "NVIDIA A100-SXM4-80GB", minor=0, memory_total=80 * GIB),
            Gpu(
                1,
                "GPU-1",
                "NVIDIA A100-SXM4-80GB",
                minor=1,
                memory_total=80 * GIB,
                memory_used=2 * GIB,
                mig_mode=True,
                mig_instances=slices,
                processes=procs,
            ),
        ),
    )


def test_mig_profile_chooses_only_slices_of_it_and_names_what_the_others_are() -> None:
    busy = GpuProcess(7, 2 * GIB, "ann", "python", mig_uuid="MIG-b")
    choice = choose(a100(busy), Request(count=1, mig="1g.10gb"), health={})
    assert [g.uuid for g in choice.gpus] == ["MIG-c"]
    assert choice.passed_over["GPU-0"] == "not a MIG slice, not 1g.10gb"
    assert choice.passed_over["MIG-a"] == "a MIG 3g.40gb slice, not 1g.10gb"
    assert choice.passed_over["MIG-b"].startswith("busy")
    missing = choose(a100(), Request(count=1, mig="7g.80gb"), health={})
    assert missing.never_fits and "this machine has 1g.10gb, 3g.40gb" in (missing.error or "")


def test_select_and_run_take_a_profile_and_refuse_a_bad_one(cli: Cli, sim: Any) -> None:
    sim("mixed")
    out = cli("select", "--mig", "1g.10gb")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [FREE_1G]  # the other 1g.10gb runs heidi's notebook
    dry = cli("run", "--dry-run", "--mig", "2G.20GB", "--", "true")
    assert dry.returncode == 0 and f"CUDA_VISIBLE_DEVICES={SLICE_2G}" in dry.stdout
    for bad, words in (("bogus", "a MIG profile such as 1g.10gb"), ("7g.80gb", "has 1g.10gb")):
        out = cli("select", "--mig", bad)
        assert out.returncode != 0 and out.stderr.count("\n") == 1 and words in out.stderr
    assert cli("select", "--mig", "1g.10gb", env={"GPUWARDEN_SIM": "server-8xa100"}).returncode
    via_env = cli("select", env={"GPUWARDEN_RUN_MIG": "2g.20gb"})
    assert via_env.stdout.split() == [SLICE_2G]


def test_the_python_api_takes_a_profile(sim: Any) -> None:
    import gpuwarden

    sim("mixed")
    assert [g.uuid for g in gpuwarden.select(mig="1g.10gb")] == [FREE_1G]
    with gpuwarden.lease(mig="1g.10gb") as got:
        assert [g.uuid for g in got.gpus] == [FREE_1G]
        assert got.env["CUDA_VISIBLE_DEVICES"] == FREE_1G


def test_a_lease_on_a_slice_shows_in_status_json_under_its_parent_and_for_its_user(
    cli: Cli, sim: Any
) -> None:
    sim("mixed")
    inner = [sys.executable, "-m", "gpuwarden", "status", "--json"]
    out = cli("run", "--mig", "2g.20gb", "--", *inner)
    assert out.returncode == 0, out.stderr
    doc = valid("schemas/status.json", out.stdout)
    parent = doc["gpus"][3]
    assert parent["leases"] == []  # the slice is leased, not the whole GPU
    held = {m["name"]: [x["user"] for x in m["leases"]] for m in parent["mig_instances"]}
    assert held == {"3g.40gb": [], "2g.20gb": [me()], "1g.10gb": []}
    assert [m["cuda_index"] for m in parent["mig_instances"]] == [None, 0, None, None]
    # heidi's notebook on a 1g.10gb is under no lease: unreserved use, on its slice.
    assert [m["unleased_pids"] for m in parent["mig_instances"]][2] == [4200003]
    mine = cli("run", "--mig", "2g.20gb", "--", *inner, "--user", me())
    doc = valid("schemas/status.json", mine.stdout)
    assert [g["index"] for g in doc["gpus"]] == [3]
    assert [m["name"] for m in doc["gpus"][0]["mig_instances"]] == ["2g.20gb"]
    text = cli("run", "--mig", "2g.20gb", "--", *inner[:-1], "--user", me())
    assert "holds no GPU" not in text.stdout and "GPU 3:1" in text.stdout


def test_the_web_page_shows_each_slice_with_its_lease_and_processes() -> None:
    inside = GpuProcess(7, 2 * GIB, "ann", "python train.py", mig_uuid="MIG-b")
    stray = GpuProcess(8, GIB, "bob", "python x.py", mig_uuid="MIG-c")
    leases = [LeaseInfo("MIG-b", "ann", 7, "python train.py", 90.0, job="17")]
    doc = build(a100(inside, stray), leases=leases, now=100.0)
    valid("web/schema/state-v1.json", doc)
    card = doc["gpus"][1]
    assert [(s["index"], s["profile"]) for s in card["slices"]] == [
        (0, "3g.40gb"),
        (1, "1g.10gb"),
        (2, "1g.10gb"),
    ]
    assert [[x["user"] for x in s["leases"]] for s in card["slices"]] == [[], ["ann"], []]
    assert [(p["pid"], p["slice"], p["reserved"]) for p in card["processes"]] == [
        (7, 1, True),
        (8, 2, False),
    ]
    ann = next(u for u in doc["users"] if u["user"] == "ann")
    assert ann["leased_gpus"] == [1]


def test_enforcement_judges_each_slice_by_its_own_lease() -> None:
    inside = GpuProcess(7, 2 * GIB, "ann", "python train.py", mig_uuid="MIG-b")
    stray = GpuProcess(8, GIB, "bob", "python x.py", mig_uuid="MIG-b")
    leases = [LeaseInfo("MIG-b", "ann", 7, "python train.py", 0.0, job="17")]
    e = Enforcer(EnforceSettings(), lineage_of=lambda p: (p,))
    acts = e.step(a100(inside, stray), leases, 0.0)
    assert [(a.policy, a.pid, a.gpu) for a in acts] == [("unleased", 8, "MIG-b")]
    assert "uses GPU 1 MIG-b without a lease; the GPU is leased to ann" in acts[0].message
    # A lease on an empty slice shows as idle (no process: 0%), reported after the wait.
    idle = Enforcer(EnforceSettings(idle_after=60), lineage_of=lambda p: (p,))
    held = [LeaseInfo("MIG-c", "ann", 9, "sleep", 0.0, job="18")]
    kinds = [[a.kind for a in idle.step(a100(), held, t)] for t in (0.0, 30.0, 61.0)]
    assert kinds == [[], [], ["report"]]


@pytest.mark.parametrize("profile", ["1g.10gb", "1g.10gb+me", "1c.3g.40gb", "7g.80gb"])
def test_profile_names_nvidia_uses_are_accepted(profile: str) -> None:
    from gpuwarden.config.values import KINDS

    assert KINDS["profile"][0](profile.upper()) == profile
