"""The layering, written once and checked: no module imports a layer above its own.

`LAYERS` is the contract. Each layer names its modules; a module may import
modules of its own layer and of the layers before it, never after. Every
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

# (layer, what it is for, modules). A name ending in ".*" is that package and
# everything under it. Order matters: lowest first.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "base",
        "vocabulary every layer shares: errors, values, units, safe files, settings",
        (
            "errors",
            "lazyimport",
            "records",
            "units",
            "table",
            "paths",
            "safefiles",
            "config",
            # where the settings files are, for what must not load the rest (`submit`)
            "configfiles",
            "config.trust",
            "config.keys",
            "config.values",
            "locations",
        ),
    ),
    (
        "machine",
        "the seams to the hardware and the kernel: snapshots from NVML or the simulator, cgroups",
        (
            "inventory",
            "gpuprocesses",
            "topology",
            "nvmlload",
            "sim.*",
            # a job's cgroups: its devices, MIG slices' nodes, what it uses; the package
            # imports nothing
            "cgroups",
            "cgroups.hierarchy",
            "cgroups.devices",
            "cgroups.bpf",
            "cgroups.migcaps",
            "cgroups.accounting",
            "ancestry",
            # the exporter's package imports nothing, so it sits as low as its lowest
            # module: the NVML counters only the exporter reads
            "exporter",
            "exporter.counters",
        ),
    ),
    (
        "policy",
        "pure functions over snapshots and requests: no files, no clock, no NVML",
        (
            # the health package imports nothing; the judgement and the Xid catalogue
            # are pure, the log and the watch sit higher
            "health",
            "health.judgement",
            "health.xids",
            "request",
            "selection",
            "refusals",
            "visible",
            "fairshare",
            "scheduling",
            "foresight",
            # the exporter's metric families, from a view or the queue's `stats`
            "exporter.metrics",
            "exporter.dcgm",
            "exporter.queue",
            "mig",
            "enforcement",
            "arrayspec",
            "begintime",
            "booking",
            "preemption",
            # GPU usage summed by who and when (`report`), and a job's efficiency (`eff`)
            "usage",
            "efficiency",
            "digest",
            # a queue job's states and their legal moves (the journal's rule)
            "service.states",
        ),
    ),
    (
        "state",
        "what outlives a command, keyed by GPU UUID: leases, the line of waiters, drains, XIDs",
        (
            "leases",
            "leases.dir",
            "leases.record",
            "holders",
            "waitline",
            "drain",
            "health.xidlog",
            "attribution",
        ),
    ),
    (
        "orchestration",
        "doing one thing with GPUs: launch a job, watch health, enforce, record, diagnose, "
        "hand jobs to Slurm, talk to the queue service; the Python API",
        (
            "gpuwarden",
            "api",
            "machineview",
            # the path from a request to a running job: its decisions, allocation,
            # launch, a detached holder, the job's output file
            "jobs.*",
            # the command line a container runtime is handed, and its client; the
            # package imports nothing
            "containers",
            "containers.command",
            "containers.runtime",
            # Jupyter's kernelspec and the provisioner that leases each kernel's GPUs
            "jupyter.*",
            "health.watch",
            "alerts",
            "enforcer",
            "sampling",
            "plot",
            "doctor.*",
            "torch.*",
            "slurm.*",
            "submitit",
            "hosts.*",
            # the queue service's client side and the wire format both sides speak
            "queueclient.*",
            # the pieces of a service job's start and end the daemon calls
            "service.spawn",
            "service.jobterminal",
            "service.exitrecord",
            "service.tree",
            "service.jobcgroup",
            "service.jobprocess",
            "service.identity",
            "service.jobnotify",
        ),
    ),
    (
        "services",
        "long-running servers: Prometheus exporter, queue service, web page",
        (
            "exporter.server",
            "httpserver",
            "httpwire",
            "web.*",
            # the machine and its queue read once, and why a job waits: for `top` and `mcp`
            "lab.*",
            # `gpuwarden mcp`: the assistants' answers and the MCP server
            "assistant.*",
            # `gpuwarden top`: its state and keys, the screen drawn as text, its actions,
            # the curses loop
            "top.*",
            # the queue service itself
            "service",
            "service.admission",
            # a `submit` command line, read with the client's grammar (queueclient.thin)
            "service.argvsubmit",
            "service.arrays",
            "service.bookings",
            "service.digests",
            "service.attaching",
            "service.attachment",
            "service.connection",
            "service.core",
            "service.queuestate",
            "service.install",
            "service.runnable",
            "service.healthwatch",
            "service.uninstall",
            "service.limiting",
            "service.limits",
            "service.journalguard",
            "service.lifecycle",
            "service.listing",
            "service.machine",
            "service.notify",
            "service.outbox",
            "service.pacing",
            "service.placing",
            "service.preempting",
            "service.reloading",
            "service.requests",
            "service.reports",
            "service.requeue",
            "service.unwritten",
            "service.litter",
            "service.journalbytes",
            "service.archive",
            "service.joining",
            "service.server",
            "service.settings",
            "service.store",
            "service.job",
            "service.tally",
            "service.ready",
            "service.fairshare",
            "service.arrayrows",
            "service.timelimits",
            "service.transaction",
            "service.unitfiles",
            "service.watching",
            "service.accounting",
            "service.accounts",
            "service.sampler",
        ),
    ),
    (
        "cli",
        "one module per command: parse, call the layers below, print",
        ("__main__", "cli.*"),
    ),
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
    "pynvml": ("inventory", "sim.*"),
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


def layer_of(module: str) -> int:
    hits = [i for i, (_, _, pats) in enumerate(LAYERS) for p in pats if _matches(module, p)]
    if len(hits) != 1:
        raise LookupError(module)
    return hits[0]


MODULES = _module_files()
GRAPH = {m: imports_of(path, m, package, set(MODULES)) for m, (path, package) in MODULES.items()}


def _edges() -> list[tuple[str, str, int]]:
    return [(m, dep, line) for m, deps in GRAPH.items() for dep, line in deps.items()]


def test_every_module_is_in_exactly_one_layer() -> None:
    problems = []
    for module in MODULES:
        try:
            layer_of(module)
        except LookupError:
            problems.append(module)
    assert not problems, (
        "modules in no layer or in several (add each to one layer of LAYERS in "
        f"tests/test_layers.py and to docs/architecture.md): {problems}"
    )


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
    monkeypatch.setitem(GRAPH, "units", {**GRAPH["units"], "cli.run": 7})
    with pytest.raises(AssertionError) as failed:
        test_no_module_imports_a_higher_layer()
    assert (
        "src/gpuwarden/units.py:7: units imports cli.run: layer base must not import layer cli"
        in (str(failed.value))
    )


# --- the same table in docs/architecture.md ---------------------------------------

BEGIN, END = "<!-- layers:begin (tests/test_layers.py writes this) -->", "<!-- layers:end -->"


def layers_markdown() -> str:
    rows = [
        "| layer | may import | modules | for |",
        "| --- | --- | --- | --- |",
    ]
    for i, (name, purpose, patterns) in enumerate(LAYERS):
        below = ", ".join(n for n, _, _ in LAYERS[:i]) or "nothing of gpuwarden"
        mods = ", ".join(f"`{p.replace('.', '/')}`" for p in patterns)
        rows.append(f"| {i + 1}. **{name}** | itself, {below} | {mods} | {purpose} |")
    rows.append("")
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
