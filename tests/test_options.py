"""The fast option reader (gpuwarden.cli.options) against argparse itself.

Every command's declarations are read both ways: wherever the fast reader
answers, argparse must accept the same line with the same values; wherever it
declines, argparse decides. Plain command lines must take the fast way, or the
start-up saving is gone without any test noticing.
"""

from __future__ import annotations

import contextlib
import io
import sys
from importlib import import_module

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.cli import COMMANDS, _declare, main
from gpuwarden.cli.options import REMAINDER, NeedsArgparse, Options


def declared(command: str) -> Options:
    module = import_module(f"gpuwarden.cli.{COMMANDS[command][0]}")
    options = Options(f"gpuwarden {command}", COMMANDS[command][1])
    _declare(module, options, command)
    return options


def by_argparse(options: Options, argv: list[str]) -> dict[str, object] | None:
    """argparse's values for `argv`, or None when it exits (help or an error)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return vars(options.argparser().parse_args(argv))
        except SystemExit:
            return None


def agree(options: Options, argv: list[str]) -> dict[str, object] | None:
    fast = options.read(argv)
    slow = by_argparse(options, argv)
    if fast is not None:
        assert slow is not None, f"{argv}: argparse refuses what the fast reader accepted"
        assert vars(fast) == slow, argv
    return slow


# The commands paid again and again: `run` before every job, `status` in loops and
# prompts, `select` and `reserve` in scripts.
HOT = ["run", "status", "select", "reserve", "release", "visible", "config"]


@pytest.mark.parametrize("command", HOT)
def test_hot_commands_declare_within_what_the_fast_reader_reads(command: str) -> None:
    options = declared(command)
    assert options._fast, f"{command} declares something the fast reader does not read"
    assert options.read([]) is not None
    agree(options, [])


def test_other_declarations_go_to_argparse_whole() -> None:
    options = declared("plot")  # nargs="+"
    assert not options._fast
    assert options.read(["a.csv"]) is None
    parsed = agree(options, ["a.csv"])
    assert parsed is not None and parsed["files"] == ["a.csv"]


def test_sim_with_subcommands_is_declared_on_argparse() -> None:
    with pytest.raises(NeedsArgparse):
        declared("sim")


PLAIN_RUN_LINES = [
    ["-g", "1", "--", "true"],
    ["-g2", "--wait", "--timeout", "5m", "--", "python", "train.py", "--lr", "3e-4"],
    ["--gpus=0,2", "--min-free", "20GiB", "--max-util", "10", "--", "python", "-m", "x"],
    ["--cpu", "--ddp", "--nproc", "4", "--", "train.py"],
    ["--mem", "10G", "--uuid", "python", "train.py", "-g", "3"],
    ["--dry-run", "-g", "1"],
    ["--count", "", "--exclude", "0", "--model", "A100*", "--min-capability", "8.0", "x"],
    [],
]


@pytest.mark.parametrize("argv", PLAIN_RUN_LINES)
def test_plain_run_lines_take_the_fast_way_and_agree(argv: list[str]) -> None:
    options = declared("run")
    assert options.read(argv) is not None, argv
    agree(options, argv)


def test_the_command_keeps_its_own_dashes_and_options() -> None:
    args = declared("run").read(["-g", "1", "--", "python", "x.py", "-g", "2", "--", "--help"])
    assert args is not None
    assert args.count == "1"
    assert args.cmd == ["--", "python", "x.py", "-g", "2", "--", "--help"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-g"],  # a value is missing
        ["--wai", "--", "true"],  # abbreviated: argparse resolves it
        ["--nproc", "four", "--", "x"],  # type error
        ["-g", "-1", "--", "x"],  # a value that looks like an option
        ["--wait=yes"],  # a flag given a value
        ["--bogus", "--", "x"],
        ["-g=1", "x"],
    ],
)
def test_unusual_lines_go_to_argparse(argv: list[str]) -> None:
    options = declared("run")
    assert options.read(argv) is None
    agree(options, argv)


def test_status_positional_and_its_type() -> None:
    options = declared("status")
    assert agree(options, ["--json"]) is not None
    args = options.read(["--watch=2.5", "--json"])
    assert args is not None and args.json is True and args.watch == 2.5
    assert options.read(["--watch", "soon"]) is None  # not a number: argparse says so
    assert vars(options.read(["--watch"])) == {"json": False, "watch": 2.0, "user": None}
    assert vars(options.read(["--watch", "--json"])) == {"json": True, "watch": 2.0, "user": None}
    assert options.read(["1"]) is None  # no positional: argparse refuses it


TOKENS = [
    "-g", "-g1", "-g=2", "--count", "--count=3", "--gpus", "--gpus=0,1", "--min-free", "20GiB",
    "--max-util", "--wait", "--wait=1", "--timeout", "5m", "--uuid", "--cpu", "--dry-run",
    "--ddp", "--nproc", "2", "x", "-1", "--", "-", "", "--mem", "--model", "A*", "--exclude",
    "--wai", "-h", "python", "train.py", "--min", "-q", "--json", "0.5", "--explain", "3",
    "--watch", "--watch=1", "--for", "4h", "id", "--m", "-gx", "--ti", "-u",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    command=st.sampled_from([*HOT, "drain", "health", "plot", "record", "doctor"]),
    argv=st.lists(st.sampled_from(TOKENS), max_size=8),
)
def test_both_readers_agree_on_random_lines(command: str, argv: list[str]) -> None:
    agree(declared(command), argv)


def test_remainder_is_argparse_remainder() -> None:
    import argparse

    assert argparse.REMAINDER == REMAINDER


def test_run_reads_its_options_without_argparse(
    sim, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim("server-8xa100")
    monkeypatch.delitem(sys.modules, "argparse", raising=False)
    monkeypatch.setitem(sys.modules, "argparse", None)  # importing it now fails
    assert main(["run", "-g", "1", "--", "true"]) == 0


def test_help_and_errors_are_argparse_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-g"])
    assert exit_.value.code == 2
    assert "argument -g/--count: expected one argument" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    assert "--min-free SIZE" in capsys.readouterr().out


def test_what_options_lacks_is_a_missing_attribute() -> None:
    options = Options("gpuwarden x")
    assert not hasattr(options, "add_subparsers")
    assert not hasattr(options.add_argument_group("g"), "add_mutually_exclusive_group")
    with pytest.raises(NeedsArgparse):
        options.set_defaults(x=1)
