"""The layering, written once and checked: no module imports a layer above its own.

`LAYERS` is the contract and `FOLDERS` places each package in one layer: a
module's layer follows from its folder. A module may import modules of its own
layer and of the layers before it, never after. Every
`import` counts, at the top of a file or inside a function (an import inside a
function hides a dependency from a reader, not from this test). The test reads
the sources with `ast` and imports nothing, so it runs on every Python.

docs/architecture.md shows the same table between its `layers:begin` and
`layers:end` markers; `test_architecture_doc_shows_the_table` fails when the two
differ, and `GPUWARDEN_REGEN_DOCS=1` rewrites the doc from the table.

Where today's code breaks a rule, the import is listed in `KNOWN_UPWARD` or
`KNOWN_CIRCLES` with the reason; an entry that no longer applies fails too, so
the lists only shrink.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"

# The layers, lowest first: (layer, what it is for).
LAYERS: list[tuple[str, str]] = [
    ("base", "vocabulary every layer shares: errors, values, units, safe files, settings"),
    (
        "machine",
        "the seams to the hardware and the kernel: snapshots from NVML or the simulator, cgroups",
    ),
    ("policy", "pure functions over snapshots and requests: no files, no clock, no NVML"),
    (
        "state",
        "what outlives a command, keyed by GPU UUID: leases, the line of waiters, drains, XIDs",
    ),
    (
        "orchestration",
        "doing one thing with GPUs: launch a job, watch health, enforce, record, diagnose, "
        "hand jobs to Slurm, talk to the queue service; the Python API",
    ),
    ("services", "long-running servers: Prometheus exporter, queue service, web page"),
    ("cli", "one module per command: parse, call the layers below, print"),
]

# Folder -> layer, in the layers' order: a module's layer follows from its folder.
# An entry is a package (module names without the `gpuwarden.` prefix; the package
# root is `gpuwarden`) and everything under it; where an older package spans layers,
# its modules of another layer are named too, and the longest entry wins.
FOLDERS: list[tuple[str, str]] = [
    ("base", "base"),
    ("files", "base"),
    ("config", "base"),
    ("machine", "machine"),
    ("sim", "machine"),
    # a job's cgroups: its devices, MIG slices' nodes, what it uses
    ("cgroups", "machine"),
    # the NVML counters only the exporter reads
    ("exporter.counters", "machine"),
    ("placement", "policy"),
    ("planning", "policy"),
    ("usage", "policy"),
    # the health package imports nothing; the judgement and the Xid catalogue are pure
    ("health", "policy"),
    # the exporter's package imports nothing; its metric families, from a view or the
    # queue's `stats`
    ("exporter", "policy"),
    # a queue job's states and their legal moves (the journal's rule)
    ("service.states", "policy"),
    ("leases", "state"),
    ("health.xidlog", "state"),
    ("health.drain", "state"),
    ("health.files", "state"),
    # the package root: the Python API, resolved lazily
    ("gpuwarden", "orchestration"),
    ("submitit", "orchestration"),
    # the path from a request to a running job and the Python API over it
    ("jobs", "orchestration"),
    ("monitoring", "orchestration"),
    ("containers", "orchestration"),
    ("jupyter", "orchestration"),
    ("health.watch", "orchestration"),
    ("doctor", "orchestration"),
    ("torch", "orchestration"),
    ("slurm", "orchestration"),
    ("hosts", "orchestration"),
    # the queue service's client side and the wire format both sides speak
    ("queueclient", "orchestration"),
    # the pieces of a service job's start and end the daemon calls
    *(
        (f"service.{m}", "orchestration")
        for m in (
            *("spawn", "becoming", "marker", "staging", "jobterminal", "exitrecord", "tree"),
            *("jobcgroup", "jobprocess", "identity", "jobnotify", "forker", "forkerprocess"),
        )
    ),
    ("exporter.server", "services"),
    ("web", "services"),
    # the machine and its queue read once, and why a job waits: for `top` and `mcp`
    ("lab", "services"),
    ("assistant", "services"),
    ("top", "services"),
    # the queue service itself
    ("service", "services"),
    ("__main__", "cli"),
    ("cli", "cli"),
]

# Shared pieces of the command line; every other cli module is a command and no
# command imports another command (what two commands share moves down a layer).
CLI_SHARED = {
    *("cli", "cli.jobtables", "cli.waiting", "cli.slurmjobs"),
    "cli.serving",
    "cli.parsers",
    "cli.statustable",
}

# Outside packages only some modules may import (principle 1 and the torch rule in
# docs/architecture.md): module prefix -> modules allowed.
GUARDED_IMPORTS: dict[str, tuple[str, ...]] = {
    "torch": ("torch.*", "doctor.probe"),
    "pynvml": ("machine.inventory", "sim.*"),
}

# Known breaks of the layering, (importer, imported) -> why it is still here.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

# Known import circles (as sorted module tuples) -> why they are still here.
KNOWN_CIRCLES: dict[tuple[str, ...], str] = {}


def _module_files() -> dict[str, tuple[Path, bool]]:
    """Module name (without the `gpuwarden.` prefix; the package root is
    `gpuwarden`) -> (file, is a package)."""
    found = {}
    for path in sorted((SRC / "gpuwarden").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        found[_short(".".join(parts))] = (path, package)
    return found


def _short(name: str) -> str:
    return name[len("gpuwarden.") :] if name.startswith("gpuwarden.") else name


def imports_of(path: Path, module: str, package: bool, known: set[str]) -> dict[str, int]:
    """Every gpuwarden module and guarded outside package `path` imports, at any
    depth, -> the first line that does. `from gpuwarden.x import y` counts as
    importing `x.y` when that is a module, else `x`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = ("gpuwarden." + module if module != "gpuwarden" else module).split(".")
    if not package:
        here = here[:-1]
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        found.setdefault(_short(name), line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = _short(f"{target}.{alias.name}")
                add(sub if sub in known else target, node.lineno)
    return {
        name: line
        for name, line in found.items()
        if name in known or name.split(".")[0] in GUARDED_IMPORTS
    }


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        stem = pattern[:-2]
        return module == stem or module.startswith(stem + ".")
    return module == pattern


LAYER_INDEX = {name: i for i, (name, _) in enumerate(LAYERS)}


def _entry_of(module: str) -> str:
    """The longest entry of FOLDERS naming `module` or a package above it."""
    hits = [folder for folder, _ in FOLDERS if _matches(module, folder + ".*")]
    if not hits:
        raise LookupError(module)
    return max(hits, key=len)


def layer_of(module: str) -> int:
    return LAYER_INDEX[dict(FOLDERS)[_entry_of(module)]]


MODULES = _module_files()
GRAPH = {m: imports_of(path, m, package, set(MODULES)) for m, (path, package) in MODULES.items()}


def _edges() -> list[tuple[str, str, int]]:
    return [(m, dep, line) for m, deps in GRAPH.items() for dep, line in deps.items()]


def test_every_module_is_in_a_layer_by_its_folder() -> None:
    problems = []
    for module in MODULES:
        try:
            layer_of(module)
        except LookupError:
            problems.append(module)
    assert not problems, (
        "modules in no folder of FOLDERS (put each in the package of its layer, or add "
        f"its new package to FOLDERS in tests/test_layers.py): {problems}"
    )


def test_the_folder_table_is_in_layer_order_and_names_what_exists() -> None:
    order = [LAYER_INDEX[layer] for _, layer in FOLDERS]
    assert order == sorted(order), "FOLDERS lists the layers lowest first"
    folders = [folder for folder, _ in FOLDERS]
    assert len(folders) == len(set(folders)), "a folder is listed once"
    stale = [f for f in folders if not any(_matches(m, f + ".*") for m in MODULES)]
    assert not stale, f"FOLDERS names what no longer exists: {stale}"


def test_a_new_package_takes_one_layer() -> None:
    """A package added since the folders (not one of the older ones that span layers)
    sits wholly in one layer: its modules are not named one by one."""
    spanning = {"exporter", "health", "service"}
    named = [f for f, _ in FOLDERS if "." in f and f.split(".")[0] not in spanning]
    assert not named, f"name the package, not its modules: {named}"


def test_no_module_imports_a_higher_layer() -> None:
    broken = []
    for module, dep, line in _edges():
        if dep not in MODULES or (module, dep) in KNOWN_UPWARD:
            continue
        mine, theirs = layer_of(module), layer_of(dep)
        if theirs > mine:
            broken.append(
                f"{MODULES[module][0].relative_to(ROOT)}:{line}: {module} imports {dep}: "
                f"layer {LAYERS[mine][0]} must not import layer {LAYERS[theirs][0]}"
            )
    assert not broken, "\n".join(broken)


def test_no_command_imports_another_command() -> None:
    broken = [
        f"{MODULES[module][0].relative_to(ROOT)}:{line}: command {module} imports command {dep}:"
        " what two commands share belongs in a layer below cli"
        for module, dep, line in _edges()
        if module.startswith("cli.")
        and dep.startswith("cli.")
        and module not in CLI_SHARED
        and dep not in CLI_SHARED
        and (module, dep) not in KNOWN_UPWARD
    ]
    assert not broken, "\n".join(broken)


def test_guarded_outside_packages_stay_in_their_modules() -> None:
    broken = []
    for module, dep, line in _edges():
        top = dep.split(".")[0]
        if dep in MODULES or top not in GUARDED_IMPORTS:
            continue
        allowed = GUARDED_IMPORTS[top]
        if not any(_matches(module, p) for p in allowed):
            broken.append(
                f"{MODULES[module][0].relative_to(ROOT)}:{line}: {module} imports {top}: "
                f"only {', '.join(allowed)} may"
            )
    assert not broken, "\n".join(broken)


def circles() -> list[tuple[str, ...]]:
    """The import graph's strongly connected components of more than one module
    (Tarjan's algorithm), each as a sorted tuple."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in MODULES or w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(tuple(sorted(group)))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return sorted(found)


def _is_package_link(a: str, b: str) -> bool:
    # A package importing its own submodules while they import the package (for a
    # shared name in `__init__`) is how Python packages work, not a design circle.
    return a.startswith(b + ".") or b.startswith(a + ".")


def test_no_new_import_circles() -> None:
    new = [
        group
        for group in circles()
        if group not in KNOWN_CIRCLES and not (len(group) == 2 and _is_package_link(*group))
    ]
    assert not new, "import circles (move the shared piece down a layer): " + "; ".join(
        " <-> ".join(g) for g in new
    )


def test_known_exceptions_still_apply() -> None:
    """An exception whose import is gone is deleted from the list, so it cannot
    hide the next one."""
    edges = {(m, d) for m, d, _ in _edges()}
    stale = [f"{a} -> {b}" for a, b in KNOWN_UPWARD if (a, b) not in edges]
    stale += [" <-> ".join(g) for g in KNOWN_CIRCLES if g not in circles()]
    assert not stale, "remove these from tests/test_layers.py, they no longer apply: " + (
        "; ".join(stale)
    )


def test_the_checker_sees_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "import os\nfrom gpuwarden import errors\n"
        "def f():\n    from gpuwarden.cli import run\n    import torch\n",
        encoding="utf-8",
    )
    found = imports_of(source, "leases", False, {"errors", "cli", "cli.run"})
    assert found == {"errors": 2, "cli.run": 4, "torch": 5}


def test_relative_imports_resolve_against_the_package(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("from . import common\nfrom ..facts import Facts\n", encoding="utf-8")
    known = {"doctor.checks.common", "doctor.facts"}
    assert imports_of(source, "doctor.checks.driver", False, known) == {
        "doctor.checks.common": 1,
        "doctor.facts": 2,
    }


def test_an_upward_import_is_reported_with_module_import_and_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(GRAPH, "base.units", {**GRAPH["base.units"], "cli.run": 7})
    with pytest.raises(AssertionError) as failed:
        test_no_module_imports_a_higher_layer()
    assert (
        "src/gpuwarden/base/units.py:7: base.units imports cli.run: "
        "layer base must not import layer cli" in (str(failed.value))
    )


def test_a_module_takes_the_layer_of_its_longest_folder() -> None:
    assert LAYERS[layer_of("planning.scheduling")][0] == "policy"
    assert LAYERS[layer_of("service.states")][0] == "policy"
    assert LAYERS[layer_of("service.core")][0] == "services"
    assert LAYERS[layer_of("health.drain")][0] == "state"
    assert LAYERS[layer_of("gpuwarden")][0] == "orchestration"
    with pytest.raises(LookupError):
        layer_of("somewhere.new")


# --- the same table in docs/architecture.md ---------------------------------------

BEGIN, END = "<!-- layers:begin (tests/test_layers.py writes this) -->", "<!-- layers:end -->"


def layers_markdown() -> str:
    rows = [
        "| layer | may import | folders | for |",
        "| --- | --- | --- | --- |",
    ]
    for i, (name, purpose) in enumerate(LAYERS):
        below = ", ".join(n for n, _ in LAYERS[:i]) or "nothing of gpuwarden"
        folders = [
            f"`{f.replace('.', '/')}{'' if f in MODULES and not MODULES[f][1] else '/'}`"
            if f != "gpuwarden"
            else "`__init__` (the package root)"
            for f, layer in FOLDERS
            if layer == name
        ]
        rows.append(f"| {i + 1}. **{name}** | itself, {below} | {', '.join(folders)} | {purpose} |")
    rows += [
        "",
        "A folder's modules sit in its layer; a module named in another row (`service/states`) "
        "sits in that row's layer instead.",
        "",
    ]
    exceptions = [f"- `{a}` imports `{b}`: {why}" for (a, b), why in KNOWN_UPWARD.items()]
    exceptions += [f"- circle {' ⇄ '.join(g)}: {why}" for g, why in KNOWN_CIRCLES.items()]
    if exceptions:
        rows += ["Known exceptions, each being removed:", "", *exceptions]
    else:
        rows.append(
            "No module imports upward, and there is no import circle (the test fails on one)."
        )
    return "\n".join(rows)


def test_architecture_doc_shows_the_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOC} lost its {BEGIN} / {END} markers"
    head, rest = text.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    wanted = "\n" + layers_markdown() + "\n"
    if os.environ.get("GPUWARDEN_REGEN_DOCS") == "1":
        DOC.write_text(head + BEGIN + wanted + END + tail, encoding="utf-8")
        return
    assert current == wanted, (
        "docs/architecture.md's layer table differs from tests/test_layers.py: "
        "GPUWARDEN_REGEN_DOCS=1 pytest tests/test_layers.py rewrites it"
    )
