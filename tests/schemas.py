"""The JSON Schemas the tests check outputs against: the commands' `--json` and the web API's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

SRC = Path(__file__).resolve().parent.parent / "src" / "gpuwarden"
SCHEMAS = SRC / "schemas"

# The web page's `/api/v1/state` document.
WEB_STATE: dict[str, Any] = json.loads((SRC / "web/schema/state-v1.json").read_text())


def schema(name: str) -> dict[str, Any]:
    """The schema of `gpuwarden NAME --json`'s output."""
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


def validate(name: str, stdout: str) -> Any:
    """`stdout` parsed, after checking it against the schema of `name`."""
    document = json.loads(stdout)
    jsonschema.validate(document, schema(name), cls=jsonschema.Draft202012Validator)
    return document
