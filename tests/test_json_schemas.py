"""Every `--json` output has a JSON Schema in src/gpuwarden/schemas/, and the
commands' real output on the simulated machines validates against it.

The schemas pin the keys (`additionalProperties: false`): a new field is added to
the schema in the same change, so a consumer can read what each version prints.
A schema's `required` list is what every machine prints; fields only some
machines have (a MIG GPU's instances, a lease) are in `properties` alone.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

jsonschema = pytest.importorskip("jsonschema")

from schemas import SCHEMAS, schema, validate  # noqa: E402 (after the skip)

ROOT = Path(__file__).resolve().parent.parent
CLI_DIR = ROOT / "src" / "gpuwarden" / "cli"

# `--json` commands whose output needs the queue service running (or Slurm); their
# shapes are the service protocol's, checked in tests/test_service*.py.
SERVICE_ONLY = {"jobs", "share", "queue"}


def test_every_json_command_has_a_valid_schema() -> None:
    commands = sorted(
        path.stem
        for path in CLI_DIR.glob("*.py")
        if re.search(r"""["']--json["']""", path.read_text(encoding="utf-8"))
    )
    assert commands, "found no --json option in src/gpuwarden/cli"
    missing = [
        c for c in commands if c not in SERVICE_ONLY and not (SCHEMAS / f"{c}.json").is_file()
    ]
    assert not missing, f"--json without a schema in src/gpuwarden/schemas/: {missing}"
    for path in SCHEMAS.glob("*.json"):
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))


def test_the_schemas_refuse_unknown_and_missing_keys() -> None:
    """The schemas are not vacuous: they catch a renamed or dropped key."""
    ok = {"reason": "fan noise", "by": "root", "at": 1.0, "auto": False}
    full = schema("status")
    gpu_schema = full["properties"]["gpus"]["items"]
    drain_schema = gpu_schema["properties"]["drain"]
    jsonschema.validate(ok, drain_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**ok, "author": "root"}, drain_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in ok.items() if k != "by"}, drain_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema": 2}, full)


Cli = Callable[..., Any]


@pytest.mark.parametrize("spec", ["server-8xa100", "mixed", "workstation-3x3090"])
def test_status_visible_health_doctor_config_validate(cli: Cli, sim: Any, spec: str) -> None:
    sim(spec)
    status = validate("status", cli("status", "--json").stdout)
    assert status["schema"] == 1 and status["gpus"]
    visible = validate(
        "visible", cli("visible", "--json", env={"CUDA_VISIBLE_DEVICES": "1,0"}).stdout
    )
    assert visible["cuda_visible_devices"] == "1,0"
    assert validate("health", cli("health", "--json").stdout)["gpus"]
    assert validate("doctor", cli("doctor", "--json").stdout)["findings"]
    assert "run.count" in validate("config", cli("config", "--json").stdout)


def test_no_driver_validates(cli: Cli, sim: Any) -> None:
    sim("laptop-none")
    status = validate("status", cli("status", "--json").stdout)
    assert status["gpus"] == [] and status["error"]
    validate("visible", cli("visible", "--json").stdout)
    validate("doctor", cli("doctor", "--json").stdout)
    assert validate("drain", cli("drain", "--json").stdout) == []


def test_drains_and_leases_validate(cli: Cli, sim: Any) -> None:
    sim("server-8xa100")
    assert cli("drain", "0", "--reason", "fan noise").returncode == 0
    drains = validate("drain", cli("drain", "--json").stdout)
    assert [d["reason"] for d in drains] == ["fan noise"]
    health = validate("health", cli("health", "--json").stdout)
    assert health["gpus"][0]["drained"]
    # status from inside a job: the job's own lease is in the document.
    inner = cli("run", "-g", "1", "--", sys.executable, "-m", "gpuwarden", "status", "--json")
    assert inner.returncode == 0, inner.stderr
    status = validate("status", inner.stdout)
    assert status["gpus"][0]["drain"]["reason"] == "fan noise"
    assert any(g["leases"] for g in status["gpus"]), "the job's lease is missing"


def test_service_status_validates_when_no_service_runs(cli: Cli, tmp_path: Path) -> None:
    result = cli("service", "status", "--json", env={"GPUWARDEN_SOCKET": str(tmp_path / "no.sock")})
    found = validate("service", result.stdout)
    assert found["running"] is False and found["problem"] and result.returncode != 0
