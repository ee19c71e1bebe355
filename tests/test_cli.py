"""The dispatcher: global options, unknown commands, and arguments passed through intact."""

from __future__ import annotations

import pytest

from gpuwarden.cli import COMMANDS, _split


def test_everything_after_the_command_is_passed_through_untouched() -> None:
    assert _split(["run", "--", "--foo"]) == ({}, "run", ["--", "--foo"])
    assert _split(["--sim", "mixed", "run", "-g", "1", "--", "ls", "--", "x"]) == (
        {"sim": "mixed"},
        "run",
        ["-g", "1", "--", "ls", "--", "x"],
    )
    assert _split(["--sim=laptop-none", "status", "--json"]) == (
        {"sim": "laptop-none"},
        "status",
        ["--json"],
    )


def test_a_command_whose_name_starts_with_a_dash_reaches_run(sim, cli) -> None:
    sim("server-8xa100")
    out = cli("run", "--cpu", "--", "--no-such-program")
    assert out.returncode == 127
    assert "command not found: --no-such-program" in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bogus",), "unknown command 'bogus'"),
        (("--bad", "status"), "unrecognized option '--bad'"),
    ],
)
def test_bad_top_level_input_is_one_error_line(cli, args: tuple[str, ...], message: str) -> None:
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_help_lists_every_command_without_importing_them(cli) -> None:
    out = cli("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert f"  {name} " in out.stdout


def test_global_sim_option_selects_the_machine(cli) -> None:
    out = cli("--sim", "mixed", "status", "--json")
    assert out.returncode == 0, out.stderr
    assert '"sim:mixed"' in out.stdout


def test_unknown_spec_lists_the_bundled_ones(cli) -> None:
    out = cli("--sim", "nope", "status")
    assert out.returncode == 2
    assert "unknown spec 'nope'" in out.stderr and "server-8xa100" in out.stderr


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("stauts", "status"), ("sttaus", "status"), ("reserv", "reserve"), ("undrian", "undrain")],
)
def test_a_mistyped_command_gets_a_did_you_mean(
    typed: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwarden.cli import main

    with pytest.raises(SystemExit) as stop:
        main([typed])
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == f"gpuwarden: error: unknown command {typed!r}; did you mean {meant!r}?"


def test_a_command_like_nothing_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwarden.cli import main

    with pytest.raises(SystemExit):
        main(["xyzzy"])
    assert "(choose from status, visible, run," in capsys.readouterr().err


def test_the_tours_last_hint_works_in_a_fresh_shell(isolated) -> None:
    """scripts/demo ends with what to type next; typed into a new shell (no virtual
    environment on PATH), it must work, and it must say what installs torch."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("tour", root / "scripts" / "tour.py")
    tour = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tour)  # type: ignore[union-attr]
    text = tour.hint()
    assert "./scripts/test installs torch" in text
    commands = [ln.split("   #")[0].strip() for ln in text.splitlines() if ln.startswith("  ")]
    assert commands[0].startswith("source ") or sys.prefix == sys.base_prefix
    keep = ("HOME", "GPUWARDEN_LEASE_DIR", "GPUWARDEN_STATE_DIR", "GPUWARDEN_SIM_STATE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        PATH="/usr/bin:/bin",  # a fresh login shell: the virtual environment is not on it
        PYTHONPATH=str(root / "src"),
        GPUWARDEN_SYSTEM_CONFIG=os.environ["GPUWARDEN_SYSTEM_CONFIG"],
        XDG_CONFIG_HOME=os.environ["XDG_CONFIG_HOME"],
    )
    shell = subprocess.run(
        ["bash", "-c", "set -e\n" + "\n".join(commands)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell.returncode == 0, shell.stderr
    assert "A100-SXM4-80GB" in shell.stdout and "[sim:server-8xa100]" in shell.stdout
