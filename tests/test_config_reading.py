"""Who reads the configuration: the faces, once; everything below takes their reading.

`config.load()` reads files and variables afresh on every call, so a module below
a command that loads its own can see another configuration than the command (a
file edited in between) and pays the reading again. The faces that read it are
the command line, the Python faces a user calls (`gpuwarden.lease()`, submitit's
executor, `gpuwarden.torch.device()`, the doctor's facts) and the queue service,
reading its own; every other module takes a `conf`/`reading` argument or the one
value it needs (`Config.service_socket()` for the service's socket). The test
reads the sources with `ast` and fails on a new reader; `KNOWN` lists the
defaults still to be handed down, and fails when one is gone, so it only shrinks.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "gpuwarden"

FACES = (
    "cli/",
    # the commands' GPU options over the configured defaults: the command's reading
    "jobs/options.py",
    "jobs/api.py",
    "submitit.py",
    "torch/devices.py",
    "doctor/facts.py",
    # the service: its own reading (at start and per pass of the plan, again when its
    # files change; on reload), and a short submit's settings read as its submitter's
    # client would read them
    "service/liveconfig.py",
    "service/reloading.py",
    "service/argvsubmit.py",
)

# Defaults that read the configuration in force where the caller gave none -> why.
KNOWN = {
    "files/locations.py": "lease and state directories where no reading is given",
    "health/judgement.py": "the health rules in force where no rules are given",
    "hosts/remote.py": "the ssh settings of `--hosts`, read where the command runs",
}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


@cache
def readers(package: Path = PACKAGE) -> dict[str, list[int]]:
    """Module path -> lines that call `config.load` (however imported)."""
    found: dict[str, list[int]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "gpuwarden.config":
                names |= {a.asname or a.name for a in node.names if a.name == "load"}
            elif isinstance(node, ast.ImportFrom) and node.module == "gpuwarden":
                names |= {f"{a.asname or a.name}.load" for a in node.names if a.name == "config"}
            elif isinstance(node, ast.Import):
                names |= {
                    f"{a.asname or a.name}.load" for a in node.names if a.name == "gpuwarden.config"
                }
        lines = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _dotted(node.func) in names
        ]
        if lines:
            found[path.relative_to(package).as_posix()] = sorted(lines)
    return found


def test_only_the_faces_read_the_configuration() -> None:
    stray = {
        where: lines
        for where, lines in readers().items()
        if not where.startswith(FACES) and where not in KNOWN and where != "config/__init__.py"
    }
    assert not stray, (
        "these modules read the configuration themselves; take the caller's reading "
        f"(a `conf` argument) or the one value instead: {stray}"
    )


def test_the_faces_named_exist() -> None:
    gone = [face for face in FACES if not (PACKAGE / face).exists()]
    assert not gone, f"FACES names what no longer exists: {gone}"


def test_known_readers_still_read() -> None:
    stale = [where for where in KNOWN if where not in readers()]
    assert not stale, f"remove from KNOWN, they no longer read the configuration: {stale}"


def test_the_checker_sees_each_way_of_importing_load(tmp_path: Path) -> None:
    pkg = tmp_path / "gpuwarden" / "jobs"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from gpuwarden import config\nconfig.load()\n")
    (pkg / "b.py").write_text("def f():\n    from gpuwarden.config import load\n    load({})\n")
    (pkg / "c.py").write_text("import gpuwarden.config as c\nc.load()\nc.get()\n")
    assert readers(tmp_path / "gpuwarden") == {"jobs/a.py": [2], "jobs/b.py": [3], "jobs/c.py": [2]}
