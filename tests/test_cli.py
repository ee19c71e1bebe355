"""The dispatcher: global options, unknown commands, and arguments passed through intact."""

from __future__ import annotations

import pytest

from gpuwarden.cli import COMMANDS, command_word, parse


def job(cmd: list[str]) -> list[str]:
    """The command `run` starts: it drops the `--` in front (argparse keeps it on the
    Pythons tested, 3.9-3.13.0)."""
    return cmd[1:] if cmd[:1] == ["--"] else cmd


def test_everything_after_the_command_is_passed_through_untouched() -> None:
    assert command_word(["--sim", "mixed", "run", "-g", "1", "--", "ls"]) == ("run", None)
    assert command_word(["--sim=x", "--log-level", "debug", "status"]) == ("status", None)
    assert command_word(["--bad", "status"]) == (None, "--bad")
    _, args = parse(["run", "--", "--foo"])
    assert job(args.cmd) == ["--foo"]
    _, args = parse(["--sim", "mixed", "run", "-g", "1", "--", "ls", "--", "x"])
    assert (args.sim, args.count, job(args.cmd)) == ("mixed", "1", ["ls", "--", "x"])
    _, args = parse(["--sim=laptop-none", "status", "--json"])
    assert (args.sim, args.command, args.json) == ("laptop-none", "status", True)


@pytest.mark.parametrize(
    "job",
    [
        ["python", "train.py", "--m", "3"],  # --m once read as an abbreviation of --mem
        ["python", "train.py", "--max", "3", "--time", "4h"],  # run's own option names
        ["python", "-g", "2", "--wait"],
    ],
)
def test_options_after_the_job_are_the_jobs_not_abbreviations(job: list[str]) -> None:
    _, args = parse(["run", "-g", "1", *job])
    assert args.cmd == job
    assert args.count == "1" and args.mem is None and args.time is None and args.wait is None


def test_no_option_may_be_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(["status", "--jso"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "gpuwarden status: error: unrecognized arguments: --jso" in err
    assert err.startswith("usage: gpuwarden status")  # the command's usage, not the top's
    with pytest.raises(SystemExit):
        parse(["--si", "mixed", "status"])


def test_a_job_after_options_runs_with_its_own_options(sim, cli) -> None:
    sim("server-8xa100")
    code = "import sys; print(sys.argv[1:])"
    out = cli("run", "--cpu", "python3", "-c", code, "--m", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--m', '3']"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_registers_its_parser(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse([name, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and f"gpuwarden {name}" in out.splitlines()[0]
    assert COMMANDS[name][1].split(" (")[0].split(":")[0] in " ".join(out.split())


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(cli, flag: str) -> None:
    from gpuwarden import __version__

    out = cli(flag)
    assert out.returncode == 0
    assert out.stdout == f"gpuwarden {__version__}\n"


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


def test_the_tours_queue_section_shows_backfill_logs_and_share(isolated, capfd) -> None:
    """scripts/demo's last part starts the queue service (as root) and shows a job
    backfilled ahead of a larger one, its log, the history and fair share."""
    import importlib.util
    import os
    from pathlib import Path

    from components import require

    require(os.geteuid() == 0, "the queue service needs root")
    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("tour", root / "scripts" / "tour.py")
    tour = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tour)  # type: ignore[union-attr]
    tour.shared_queue(isolated)
    out = capfd.readouterr().out
    assert "Resources (start in" in out  # job 2 waits for job 1's GPU
    queue = out[out.index("$ gpuwarden queue") : out.index("$ gpuwarden status")]
    running = [ln.split()[0] for ln in queue.splitlines() if " RUNNING " in ln]
    assert running == ["1", "3"], queue  # job 3 backfilled on the idle GPU
    assert "two GPUs: 0,2" in out  # job 2 ran once GPU 0 was free again (logs 2)
    assert out.count(" COMPLETED  exit 0 ") == 3
    assert "dave" in out[out.index("$ gpuwarden share") :]


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


def test_completion_comes_from_the_same_grammar(cli) -> None:
    pytest.importorskip("shtab")
    out = cli("completion", "bash")
    assert out.returncode == 0, out.stderr
    for name in COMMANDS:
        assert name in out.stdout
    shell = (
        out.stdout
        + '\nCOMP_WORDS=(gpuwarden st); COMP_CWORD=1; _shtab_gpuwarden; echo "${COMPREPLY[@]}"'
        + "\nCOMP_WORDS=(gpuwarden run --max-u); COMP_CWORD=2; _shtab_gpuwarden;"
        + ' echo "${COMPREPLY[@]}"'
    )
    import subprocess

    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["status", "--max-util"], done.stderr
    zsh = cli("completion", "zsh")
    assert zsh.returncode == 0 and "#compdef gpuwarden" in zsh.stdout


def test_completion_without_shtab_is_one_line_and_an_empty_script(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from gpuwarden.cli import main

    monkeypatch.setitem(sys.modules, "shtab", None)  # `import shtab` raises ImportError
    assert main(["completion", "bash"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "gpuwarden completion: shtab is not installed (pip install shtab); no completion script\n"
    )


def test_completion_needs_a_known_shell(cli) -> None:
    out = cli("completion", "fish")
    assert out.returncode == 2
    assert "invalid choice: 'fish'" in out.stderr


def test_long_running_commands_log_at_the_level_asked(sim, cli, tmp_path) -> None:
    sim("server-8xa100")
    csv = str(tmp_path / "samples.csv")
    args = ("record", csv, "--count", "1", "--interval", "0.01")
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert " INFO gpuwarden.record: recording to " in out.stderr
    assert " INFO gpuwarden.record: wrote 1 samples to " in out.stderr
    quiet = cli("--log-level", "warning", *args)
    assert quiet.returncode == 0 and quiet.stderr == ""
    from_env = cli(*args, env={"GPUWARDEN_LOG_LEVEL": "WARNING"})
    assert from_env.returncode == 0 and from_env.stderr == ""


def test_a_bad_log_level_is_one_line(sim, cli) -> None:
    sim("server-8xa100")
    out = cli("health", env={"GPUWARDEN_LOG_LEVEL": "loud"})
    assert out.returncode == 2
    assert out.stderr == (
        "gpuwarden health: GPUWARDEN_LOG_LEVEL='loud': expected one of debug, info, warning, "
        "error\n"
    )
    flag = cli("--log-level", "loud", "health")
    assert flag.returncode == 2 and "invalid choice: 'loud'" in flag.stderr
    # A one-shot command that never logs does not read the variable at all.
    assert cli("status", env={"GPUWARDEN_LOG_LEVEL": "loud"}).returncode == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["sim", "inject", "ecc", "--gpu", "0", "--uncorr", "3"],  # nested in sim
        ["service", "uninstall", "--pur"],  # nested in service
        ["run", "--max-u", "5", "--", "true"],
    ],
)
def test_nested_commands_refuse_abbreviations_too(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_health_watch_logs_its_start(sim) -> None:
    import os
    import signal
    import subprocess
    import sys

    from repo import SRC

    sim("server-8xa100")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "health", "--watch"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()  # blocks until the watch says it started
        assert " INFO gpuwarden.health: watching GPU health (policy " in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
