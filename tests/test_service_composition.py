"""The queue service is composed, not inherited: no class of `gpuwarden.service`
derives from another class of it.

Each object owns its state and is handed its collaborators (docs/architecture.md):
the server drives the clients (service.clients) and the jobs' life
(service.joblife), requests are a table of functions (service.requests). A chain of
classes sharing one `self` would let every concern read and write every other's
state again. A protocol that names what a function needs may extend another
protocol: it is a type, and carries no state. The test reads the sources with `ast`.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parent.parent / "src" / "gpuwarden" / "service"


def _classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class of service/, by name -> (module, its definition)."""
    found: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for path in sorted(SERVICE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((path.stem, node))
    return found


def _name(base: ast.expr) -> str:
    """`Base`, `module.Base` -> "Base"; anything else (a subscript, a call) -> ""."""
    if isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def inherited(classes: dict[str, list[tuple[str, ast.ClassDef]]]) -> list[str]:
    """The classes that derive from a class of service/, as "module.Class(Base)";
    protocols (a base named Protocol) excepted."""
    wrong = []
    for name, defined in classes.items():
        for module, node in defined:
            bases = [_name(b) for b in node.bases]
            if "Protocol" in bases:
                continue
            wrong += [f"{module}.{name}({b})" for b in bases if b in classes]
    return wrong


def test_no_class_of_the_service_inherits_from_another() -> None:
    classes = _classes()
    assert {"Service", "JobLife", "Clients", "Attachments"} <= set(classes)
    assert inherited(classes) == []


def test_the_scan_finds_an_inheriting_class() -> None:
    source = "class Core:\n    pass\n\nclass Lifecycle(Core):\n    pass\n"
    tree = ast.parse(source)
    classes = {n.name: [("m", n)] for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert inherited(classes) == ["m.Lifecycle(Core)"]
