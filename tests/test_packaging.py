"""What gpuwarden declares about itself matches what it is and what CI runs.

The nvidia-ml-py bound has a watch: `test_no_nvidia_ml_py_release_past_the_bound`
asks the package index (`pip index versions`) whether a release past the upper
bound exists. Offline, or when the index does not answer, it skips with the
reason. When a newer release exists it fails under CI (GPUWARDEN_REQUIRE_COMPONENTS=1)
with a message that says which release and what to do, and skips with the same
message elsewhere: a red CI for an upstream release is the point (the simulator
replaces nvidia-ml-py's private loader, so the new release must be tried before
users get it), and the message says it is not a fault in the change under test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import gpuwarden

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the versions before 3.11 use the tomli backport
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT: dict[str, Any] = PYPROJECT["project"]


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _requirement(name: str) -> str:
    found = [d for d in PROJECT["dependencies"] if re.match(rf"{re.escape(name)}\b", d)]
    assert len(found) == 1, f"{name} is declared {len(found)} times"
    return found[0]


def nvidia_ml_py_bound() -> tuple[int, ...]:
    match = re.search(r"<\s*([\d.]+)", _requirement("nvidia-ml-py"))
    assert match, "nvidia-ml-py needs an upper bound (see the comment in pyproject.toml)"
    return _version_tuple(match.group(1))


def declared_pythons() -> list[str]:
    prefix = "Programming Language :: Python :: 3."
    return [c.rsplit(" ", 1)[1] for c in PROJECT["classifiers"] if c.startswith(prefix)]


def test_license_is_the_apache_text_the_metadata_declares() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a stub
    assert PROJECT["license"] == "Apache-2.0"  # an SPDX expression (PEP 639)
    assert PROJECT["license-files"] == ["LICENSE"]


def test_the_version_is_written_once() -> None:
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "gpuwarden.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", gpuwarden.__version__)


def test_the_command_prints_the_one_version(cli: Any) -> None:
    result = cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"gpuwarden {gpuwarden.__version__}"


def test_py_typed_ships_with_the_package() -> None:
    assert (ROOT / "src" / "gpuwarden" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["gpuwarden"]
    assert "Typing :: Typed" in PROJECT["classifiers"]


def test_project_urls_point_at_the_project() -> None:
    urls = PROJECT["urls"]
    assert {"Homepage", "Source", "Bug Tracker", "Documentation"} <= set(urls)
    assert all(u.startswith("https://github.com/gpuwarden/gpuwarden") for u in urls.values())


def test_declared_pythons_are_contiguous_from_requires_python() -> None:
    """requires-python and the classifiers say the same thing, and
    scripts/test-pythons runs the subset on exactly the classifiers' versions."""
    minors = sorted(int(v.split(".")[1]) for v in declared_pythons())
    assert minors == list(range(minors[0], minors[-1] + 1)), declared_pythons()
    assert PROJECT["requires-python"] == f">=3.{minors[0]}"
    assert f"3.{sys.version_info[1]}" in declared_pythons(), "tests run on an undeclared Python"
    script = (ROOT / "scripts" / "test-pythons").read_text(encoding="utf-8")
    assert "Programming Language :: Python ::" in script  # reads the classifiers


def test_every_python_subset_lists_existing_test_files() -> None:
    lines = (ROOT / "tests" / "every-python.txt").read_text(encoding="utf-8").splitlines()
    files = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert files, "the subset is empty"
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert not missing, f"tests/every-python.txt names missing files: {missing}"
    assert "tests/test_torch_ddp.py" not in files  # the subset needs no torch


def test_test_tools_are_a_dependency_group_not_an_extra() -> None:
    assert "test" not in PROJECT.get("optional-dependencies", {})
    groups = PYPROJECT["dependency-groups"]
    names = [g for g in groups["test"] if isinstance(g, str)]
    for tool in ("pytest", "hypothesis", "mypy", "jsonschema", "ruff"):
        assert any(re.match(rf"{tool}\b", n) for n in names + groups["core-test"]), tool


def test_nvidia_ml_py_installed_is_within_the_bound() -> None:
    from importlib.metadata import version

    lower = _version_tuple(re.search(r">=\s*([\d.]+)", _requirement("nvidia-ml-py")).group(1))  # type: ignore[union-attr]
    installed = _version_tuple(version("nvidia-ml-py"))
    assert lower <= installed < nvidia_ml_py_bound(), installed


def _index_versions(package: str) -> list[tuple[int, ...]] | str:
    """The releases the package index lists, or why it could not be asked."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", package,
             "--disable-pip-version-check", "--retries", "0", "--timeout", "15"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"pip index did not answer: {err}"
    match = re.search(r"Available versions:\s*(.+)", result.stdout)
    if result.returncode != 0 or not match:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return f"the package index did not answer (offline?): {last}"
    return [_version_tuple(v) for v in match.group(1).split(",")]


def test_no_nvidia_ml_py_release_past_the_bound() -> None:
    found = _index_versions("nvidia-ml-py")
    if isinstance(found, str):
        pytest.skip(found)
    bound = nvidia_ml_py_bound()
    newer = sorted(v for v in found if v >= bound)
    if not newer:
        return
    message = (
        f"nvidia-ml-py {'.'.join(map(str, newer[-1]))} is out, past the bound "
        f"<{'.'.join(map(str, bound))} in pyproject.toml. Not a fault of this change: "
        "install it, run the suite (the simulator replaces its private library loader, "
        "sim/fake.py), then raise the bound"
    )
    if os.environ.get("GPUWARDEN_REQUIRE_COMPONENTS") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def test_version_comparison_of_releases() -> None:
    assert _version_tuple("13.615.71") < (14,) <= _version_tuple("14.0.1")
    assert _version_tuple("12.535.161") < _version_tuple("13.580.65")


@pytest.mark.slow
def test_the_wheel_carries_version_types_and_data(tmp_path: Path) -> None:
    """Built the way pip installs it: the metadata's version is `__version__`, and
    `py.typed`, the JSON schemas and the simulator's specs are inside."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # pip builds in an isolated environment with the build-system's setuptools,
    # fetched from the package index: offline, say so rather than fail.
    if result.returncode != 0 and re.search(
        r"No matching distribution|Could not find a version", result.stderr
    ):
        pytest.skip(
            f"cannot fetch the build requirements: {result.stderr.strip().splitlines()[-1]}"
        )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("gpuwarden-*.whl")
    assert wheel.name.startswith(f"gpuwarden-{gpuwarden.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "gpuwarden/py.typed" in names
    assert any(n.startswith("gpuwarden/schemas/") and n.endswith(".json") for n in names)
    assert "gpuwarden/sim/specs/server-8xa100.toml" in names
    metadata = (
        zipfile.ZipFile(wheel)
        .read(f"gpuwarden-{gpuwarden.__version__}.dist-info/METADATA")
        .decode()
    )
    assert "Requires-Dist: nvidia-ml-py<14,>=12.535" in metadata
    assert "Classifier: Programming Language :: Python :: 3.13" in metadata
    assert "License-Expression: Apache-2.0" in metadata
    assert f"gpuwarden-{gpuwarden.__version__}.dist-info/licenses/LICENSE" in names


@pytest.mark.slow
def test_build_makes_a_publishable_sdist_and_wheel(tmp_path: Path) -> None:
    """`python -m build` (the sdist, then the wheel built from it, as a publisher does):
    both carry metadata that `packaging` validates as a package index would, the
    wheel the entry points a student's venv needs (the kernel provisioner and
    submitit's plugin), the sdist the files the wheel is built from."""
    import tarfile

    from packaging.metadata import Metadata

    try:
        import build  # noqa: F401 - only whether it is there
    except ImportError:
        pytest.skip("needs `build` (the test dependency group)")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    version = gpuwarden.__version__
    (sdist,) = tmp_path.glob("gpuwarden-*.tar.gz")
    (wheel,) = tmp_path.glob("gpuwarden-*.whl")
    assert sdist.name == f"gpuwarden-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as zf:
        raw = zf.read(f"gpuwarden-{version}.dist-info/METADATA")
        points = zf.read(f"gpuwarden-{version}.dist-info/entry_points.txt").decode()
    meta = Metadata.from_email(raw, validate=True)  # raises on an invalid field
    assert (meta.name, str(meta.version)) == ("gpuwarden", version)
    assert meta.license_expression == "Apache-2.0" and meta.description
    extras = {str(e) for e in meta.provides_extra or ()}
    assert {"jupyter", "exporter"} <= extras
    assert "torch" not in extras  # its default build may need a newer driver than the machine's
    assert "gpuwarden = gpuwarden.jupyter.provisioner:GpuwardenProvisioner" in points
    assert "executor = gpuwarden.submitit:GpuwardenExecutor" in points
    with tarfile.open(sdist) as tf:
        names = set(tf.getnames())
        pkg_info = tf.extractfile(f"gpuwarden-{version}/PKG-INFO")
        assert pkg_info is not None
        Metadata.from_email(pkg_info.read(), validate=True)
    top = f"gpuwarden-{version}/"
    for path in ("LICENSE", "README.md", "pyproject.toml", "src/gpuwarden/py.typed"):
        assert top + path in names, path
    assert any(n.startswith(top + "src/gpuwarden/service/units/") for n in names)


def test_ci_runs_the_checks_this_file_documents() -> None:
    """The type check runs in scripts/test, and CI runs the other Pythons' subset."""
    test = (ROOT / "scripts" / "test").read_text(encoding="utf-8")
    assert "scripts/typecheck" in test and "--group test" in test
    assert "./scripts/test-pythons" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
