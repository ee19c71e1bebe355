"""The suite's own shape: what two test modules share lives in a helper module, never in
one of them.

A test module that imports another (`from test_service import Server`) runs that
module's import-time code and couples the two: moving or renaming a test breaks an
unrelated file, and a `test_*` function imported along runs twice. So the rules,
checked by reading tests/*.py with `ast` (nothing is imported; every `import` counts,
at the top of a file or inside a function):

- nothing imports a `test_*` module;
- nothing imports `conftest`: it is pytest's plugin file, loaded by pytest under a
  name of its choosing (under `--import-mode=importlib` `import conftest` fails, or
  finds another directory's); its constants and functions live in helper modules
  (tests/repo.py, tests/components.py) that conftest imports too;
- a fixture a helper module defines is every test's through conftest's
  `pytest_plugins`, and nothing imports it by name (a test takes it as an argument):
  a fixture re-bound in a module (`server = servicetools.server`) hides where it
  comes from, and a module that forgets to re-bind it gets a bare "fixture not found".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(TESTS.glob("*.py"))}


def _imports(tree: ast.Module) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every import: `import a` gives ("a", []), `from a import
    b, c` gives ("a", ["b", "c"])."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module, [a.name for a in node.names]


def _is_fixture(node: ast.expr) -> bool:
    """`@pytest.fixture` or `@pytest.fixture(...)`."""
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def _fixtures(tree: ast.Module) -> set[str]:
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any(map(_is_fixture, node.decorator_list))
    }


def _helpers(modules: dict[str, ast.Module]) -> list[str]:
    return [name for name in modules if not name.startswith("test_") and name != "conftest"]


def coupling(modules: dict[str, ast.Module]) -> list[str]:
    """Every import of a test module or of conftest."""
    return [
        f"tests/{name}.py:{line}: imports {module}"
        for name, tree in modules.items()
        for line, module, _ in _imports(tree)
        if module.split(".")[0].startswith("test_") or module.split(".")[0] == "conftest"
    ]


def fixture_leaks(modules: dict[str, ast.Module]) -> list[str]:
    """Helper modules with fixtures that conftest does not load as plugins, and every
    import or attribute that reaches such a fixture by name."""
    plugins: set[str] = set()
    for node in modules["conftest"].body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
        ):
            plugins.update(ast.literal_eval(node.value))
    offering = {name: _fixtures(modules[name]) for name in _helpers(modules)}
    offering = {name: found for name, found in offering.items() if found}
    bad = [
        f"tests/{name}.py: has fixtures, not in conftest's pytest_plugins"
        for name in sorted(set(offering) - plugins)
    ]
    for name, tree in modules.items():
        for line, module, names in _imports(tree):
            for fixture in sorted(offering.get(module, set()) & set(names)):
                bad.append(f"tests/{name}.py:{line}: imports the fixture {module}.{fixture}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.attr in offering.get(node.value.id, set())
            ):
                bad.append(f"tests/{name}.py:{node.lineno}: {node.value.id}.{node.attr}")
    return bad


def test_no_module_imports_a_test_module_or_conftest() -> None:
    bad = coupling(_modules())
    assert not bad, "what test modules share goes into a helper module:\n" + "\n".join(bad)


def test_helper_fixtures_are_plugins_and_never_imported() -> None:
    bad = fixture_leaks(_modules())
    assert not bad, "a helper's fixture is a test's argument, not an import:\n" + "\n".join(bad)


def test_the_checks_see_what_they_forbid() -> None:
    """The rules above, on code that breaks each: a check that finds nothing because it
    looks in the wrong place would pass for ever."""
    sources = {
        "conftest": "pytest_plugins = ('servicetools',)\n",
        "servicetools": "@pytest.fixture\ndef server(): ...\n",
        "stray": "@pytest.fixture(scope='module')\ndef other(): ...\n",
        "test_a": (
            "import test_b\n"
            "from servicetools import server, submit\n"
            "server = servicetools.server\n"
            "def test_x():\n"
            "    from conftest import SRC\n"
        ),
    }
    modules = {name: ast.parse(text) for name, text in sources.items()}
    assert coupling(modules) == [
        "tests/test_a.py:1: imports test_b",
        "tests/test_a.py:5: imports conftest",
    ]
    assert fixture_leaks(modules) == [
        "tests/stray.py: has fixtures, not in conftest's pytest_plugins",
        "tests/test_a.py:2: imports the fixture servicetools.server",
        "tests/test_a.py:3: servicetools.server",
    ]
