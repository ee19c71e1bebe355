"""The bad-input corpus: malformed command-line values, config files, sim specs and
environment variables, each of which must give one clear line and a non-zero exit (or,
where one is documented, its fallback) — never a traceback, never a silent wrong result,
never a hang.

The cases run in-process through `gpuwarden.cli.main` (a subprocess costs ~100 ms, and
there are a few hundred cases); a handful at the end go through real processes to show
that what is checked here is what a shell sees. "One line" is the line the CLI prints
for a `UserError` (`gpuwarden COMMAND: ...`); argparse's own errors are its usage and
then one `gpuwarden COMMAND: error: ...` line, and that last line is what is checked.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Optional

import pytest

from gpuwarden.config import keys as configkeys
from gpuwarden.config import trust as config_trust

SECONDS = 20  # no case may take this long: a hang fails the case instead of the run


class Case(NamedTuple):
    argv: tuple[str, ...]
    expect: str  # in the error line
    env: dict[str, str] = {}  # noqa: RUF012 (never changed)
    files: dict[str, bytes] = {}  # noqa: RUF012 (relative to the working directory)
    spec: Optional[str] = None  # GPUWARDEN_SIM (default: server-8xa100)


def case(*argv: str, expect: str, **kw: Any) -> Case:
    return Case(tuple(argv), expect, **kw)


# --- command-line values ---------------------------------------------------------------------

# A value that looks like an option: argparse before Python 3.14 takes "-5G" for one and
# says the option lacks its argument; from 3.14 it is the option's value, which our own
# check refuses. Either way one clear line.
OPTION_LIKE = "expected one argument" if sys.version_info < (3, 14) else "invalid"

SIZES = [
    ("10XB", "invalid"),
    ("-5G", OPTION_LIKE),
    ("", "invalid"),
    ("   ", "invalid"),
    ("nan", "invalid"),
    ("inf", "invalid"),
    ("1e9", "invalid"),
    ("GiB", "invalid"),
    ("20 G i B", "invalid"),
    ("2000000EiB", "invalid"),
    ("9" * 30, "(1EiB at most)"),
    ("1" * 400, "(1EiB at most)"),
    ("2000000000TiB", "(1EiB at most)"),
    ("0x10G", "invalid"),
    ("20GiB;rm", "invalid"),
]
DURATIONS = [
    ("99999999999d", "above ten years"),
    ("3651d", "above ten years"),
    ("87601h", "above ten years"),
    ("-1", "invalid"),
    ("-5m", OPTION_LIKE),
    ("", "invalid"),
    ("nan", "invalid"),
    ("inf", "invalid"),
    ("5y", "invalid"),
    ("1e9", "invalid"),
    ("4 hours", "invalid"),
    ("h", "invalid"),
]
CLI_CASES = (
    [case("select", "--min-free", text, expect=want) for text, want in SIZES]
    + [case("reserve", "--for", text, expect=want) for text, want in DURATIONS]
    + [
        case("run", "--wait", "--timeout", text, "--", "true", expect=want)
        for text, want in [
            ("99999999999d", "(ten years at most)"),
            ("3651d", "(ten years at most)"),
            ("-1", "invalid timeout"),
            ("-5m", OPTION_LIKE),
            ("soon", "invalid timeout"),
            ("nan", "invalid timeout"),
        ]
    ]
    + [
        case("select", "--max-util", "150", expect="invalid max_util"),
        case("select", "--max-util", "-1", expect="invalid max_util"),
        case("select", "--max-util", "lots", expect="invalid max_util"),
        case("select", "--max-util", "nan", expect="invalid max_util"),
        case("select", "--max-util", "inf", expect="invalid max_util"),
        case("select", "--min-capability", "eight", expect="invalid min_capability"),
        case("select", "--min-capability", "8.x", expect="invalid min_capability"),
        case("select", "--min-capability", "-8.0", expect="invalid min_capability"),
        case("select", "-n", "x", expect="invalid GPU count"),
        case("select", "-n", "-1", expect="invalid GPU count"),
        case("select", "-n", "1.5", expect="invalid GPU count"),
        case("select", "--gpus", ",,", expect="invalid gpus"),
        case("select", "--exclude", "1,,2", expect="invalid exclude"),
        case("select", "--mig", "1g", expect="a MIG profile such as 1g.10gb"),
        case("select", "--bogus", expect="error:"),
        case("run", "-g", "x", "--", "true", expect="invalid GPU count"),
        case("run", "-g", "-2", "--", "true", expect="count"),
        case("run", "--min-free", "lots", "--", "true", expect="invalid"),
        case("run", "--mem", "-1G", "--", "true", expect=OPTION_LIKE),
        case("run", "--mem", "1EB", "--", "true", expect="invalid size"),
        case("reserve", "-g", "x", expect="invalid GPU count"),
        case("kernel", "install", "--name", "My Kernel", expect="invalid kernel name"),
        case("kernel", "install", "-g", "0", expect="asks for no GPU"),
        case("kernel", "install", "--mem", "10XB", expect="invalid"),
        case("kernel", "install", "--min-free", "lots", expect="invalid"),
        case("kernel", "uninstall", "nosuch", expect="no kernelspec 'nosuch'"),
        case("run", "--", "podman", "run", "--gpus", "all", "img", expect="outside its lease"),
        case("run", "--", "docker", "run", "--privileged", "img", expect="outside its lease"),
        case("reserve", "--min-free", "10XB", expect="invalid"),
        case("status", "--watch", "0", expect="positive"),
        case("status", "--watch", "-1", expect="positive"),
        case("status", "--watch", "x", expect="error:"),
        case("status", "--watch", "nan", expect="positive"),
        case("status", "--watch", "inf", expect="positive"),
        case("status", "--watch", "1e9", expect="a day at most"),
        case("status", "--bogus", expect="error:"),
        case("config", "run.min_fre", expect="unknown setting 'run.min_fre'"),
        case("config", "nonsense", expect="unknown setting"),
        case("record", "out.csv", "--interval", "0", expect="interval"),
        case("record", "out.csv", "--interval", "-1", expect="interval"),
        case("record", "out.csv", "--interval", "nan", expect="interval"),
        case("record", "out.csv", "--interval", "x", expect="interval"),
        case("record", "out.csv", "--interval", "1e300", expect="interval"),
        case("record", "out.csv", "--max-bytes", "10XB", expect="max_bytes"),
        case("record", "out.csv", "--max-bytes", "0", expect="max_bytes"),
        case("record", "out.csv", "--count", "x", expect="error:"),
        case("record", expect="required: FILE.csv"),
        case("exporter", "--listen", "localhost", "--once", expect="listen"),
        case("exporter", "--listen", "host:0", "--once", expect="listen"),
        case("exporter", "--listen", "host:99999", "--once", expect="listen"),
        case("exporter", "--listen", "host:-1", "--once", expect="listen"),
        case("exporter", "--listen", ":", "--once", expect="listen"),
        case("exporter", "--listen", "", "--once", expect="listen"),
        case("exporter", "--listen", "host:port", "--once", expect="listen"),
        case("plot", "missing.csv", "-o", "x.png", expect="missing.csv"),
        case("stauts", expect="did you mean 'status'?"),
        case("confg", expect="did you mean 'config'?"),
        case("xyzzy", expect="unknown command"),
        case("--bogus", "status", expect="unrecognized option"),
        case("--sim", "no-such-spec", "status", expect="unknown spec"),
        case("visible", "--bogus", expect="error:"),
        # Digits that str.isdigit() accepts and int() refuses ("²", "①"): one line each
        case("select", "--gpus", "\u00b2", expect="unknown GPU"),
        case("run", "--gpus", "1,\u2460", "--dry-run", "--", "true", expect="unknown GPU"),
        case("drain", "\u00b2", "--reason", "x", expect="unknown GPU"),
        case("cancel", "\u00b2", expect="invalid job id"),
        case("logs", "\u2460", expect="invalid job id"),
        case("submit", "--nice", "\u00b2", "--dry-run", "--", "true", expect="invalid --nice"),
        case("submit", "--time", "\u00b2", "--dry-run", "--", "true", expect="invalid --time"),
        case(
            "submit",
            "--time",
            "1h",
            "--signal",
            "USR9@60",
            "--dry-run",
            "--",
            "true",
            expect="invalid --signal 'USR9@60': expected [B:]SIG[@SECONDS]",
        ),
        case(
            "submit",
            "--time",
            "1h",
            "--signal",
            "B:USR1@1m",
            "--dry-run",
            "--",
            "true",
            expect="invalid --signal",
        ),
        case(
            "submit", "--signal", "USR1", "--dry-run", "--", "true", expect="--signal needs --time"
        ),
        case("submit", "--slurm", "-g", "\u00b2", "--dry-run", "--", "true", expect="count"),
        case("submit", "--slurm", "--nodes", "\u00b2", "--dry-run", "--", "true", expect="nodes"),
        case("submit", "--slurm", "--mem", "\u00b2G", "--dry-run", "--", "true", expect="mem"),
        case("submit", "--slurm", "--time", "1-\u00b2", "--dry-run", "--", "t", expect="--time"),
        case("sim", "set", "--gpu", "\u00b2", "util=5", expect="no GPU"),
        # sbatch's --array syntax and --param sweeps (docs/sweeps.md)
        case("submit", "--array", "0-", "--dry-run", "--", "true", expect="not a task id"),
        case("submit", "--array", "5-1", "--dry-run", "--", "true", expect="ends before"),
        case("submit", "--array", "0-9%0", "--dry-run", "--", "true", expect="from 1 to 10000"),
        case("submit", "--array", "0-99%1e20", "--dry-run", "--", "t", expect="from 1 to 10000"),
        case(
            "submit", "--array", "0-99%" + "9" * 30, "--dry-run", "--", "true", expect="from 1 to"
        ),
        case("submit", "--array", "0-99999", "--dry-run", "--", "t", expect="the most an array"),
        case("submit", "--array", "0-\u00b2", "--dry-run", "--", "true", expect="not a task id"),
        case("submit", "--param", "x", "--dry-run", "--", "true", expect="expected NAME=V1"),
        case("submit", "--param", "a=1", "--array", "0-3", "--", "t", expect="only a throttle"),
        case("submit", "--slurm", "--array", "1-", "--dry-run", "--", "t", expect="--array"),
        case("submit", "--slurm", "--param", "a=1", "--", "t", expect="--param is for this"),
        case("cancel", "12_", expect="invalid job id"),
        case("submit", "--begin", "soon", "--dry-run", "--", "true", expect="invalid time"),
        case("submit", "--notify", "often", "--dry-run", "--", "t", expect="invalid --notify"),
        case("submit", "--slurm", "--notify", "end", "--", "t", expect="--notify is for this"),
        case("submit", "--begin", "25:00", "--dry-run", "--", "true", expect="invalid time"),
        case("submit", "--begin", "9999-12-31", "--dry-run", "--", "t", expect="1970 to 5000"),
        case("submit", "--begin", "now+999999999weeks", "--dry-run", "--", "t", expect="year 5000"),
        case("book", "-g", "2", "--start", "16:00", "--for", "4h", expect="needs --reason"),
        case("book", "-g", "0", "--start", "now", "--for", "1h", "--reason", "x", expect="-g"),
        case("book", "-g", "1", "--start", "x", "--for", "1h", "--reason", "x", expect="time"),
        case("book", "-g", "1", "--start", "now", "--for", "0", "--reason", "x", expect="--for"),
        case("book", "-g", "1", "--start", "now", "--reason", "x", expect="needs --for"),
        # several hosts (docs/hosts.md): refused before any ssh runs
        case("status", "--hosts=-oProxyCommand=x", expect="not a host name"),
        case("status", "--hosts", "a;b", expect="not a host name"),
        case("status", "--hosts", " , ", expect="no host names"),
        case("status", "--hosts", "a", "--watch", "2", expect="--watch is for"),
        case("status", "--hosts", "a", env={"GPUWARDEN_HOSTS_TIMEOUT": "0"}, expect="timeout"),
        case("queue", "--hosts", "a", "--slurm", expect="Slurm's queue is one already"),
        case("select", "--hosts", "a", "-g", "x", expect="invalid GPU count"),
        case("slurm", "cluster", expect="needs the nodes' host names"),
        case("slurm", "cluster", "a", expect="needs --out"),
        case("slurm", "cluster", "--out", "d", "--", "-ox", expect="not a host name"),
        case("slurm", "cluster", "--out", "d", "a", "--port", "0", expect="--port"),
        case("slurm", "cluster", "a", "--out", "d", "--controller", "x y", expect="--controller"),
        case("slurm", "cluster", "a", "--out", "d", "--port", "0", expect="--port"),
        case("slurm", "cluster", "a", "--out", "d", "--hook-env", "rel", expect="--hook-env"),
        case("slurm", "conf", "a", expect="takes no host names"),
        case("web", "--peers", "ftp://x", "--once", expect="--peers needs"),
        case("web", "--peers", "http://x:99999/", "--once", expect="not a port"),
    ]
)

# --- sim set and sim specs -------------------------------------------------------------------

SIM_SET = [
    ("temp=-500", "temperature must be 0 to 150"),
    ("temp=1000", "temperature must be 0 to 150"),
    ("temp=x", "bad value for temperature"),
    ("temp=", "bad value for temperature"),
    ("util=101", "utilization must be 0 to 100"),
    ("util=-1", "utilization must be 0 to 100"),
    ("mem_util=1000", "memory_utilization"),
    ("power=nan", "power must be"),
    ("power=inf", "power must be"),
    ("power=-1", "power must be"),
    ("power=99999", "power must be"),
    ("fan=50", "has no fan"),
    ("clock_sm=-1", "clock_sm must be"),
    ("pcie_replay=-1", "pcie_replay must be"),
    ("mem=1TiB", "memory_used must be"),
    ("mem=-1", "invalid size"),
    ("lost=maybe", "bad value for lost"),
    ("compute_mode=Weird", "compute_mode must be one of"),
    ("voltage=3", "cannot set 'voltage'"),
    ("noequals", "expected KEY=VALUE"),
]
SIM_CASES = [case("sim", "set", "--gpu", "0", item, expect=want) for item, want in SIM_SET] + [
    case("sim", "set", "--gpu", "99", "temp=50", expect="99"),
    case("sim", "inject", "xid", "--gpu", "99", "48", expect="99"),
    case("sim", "occupy", "--gpu", "0", "--mem", "10XB", expect="invalid size"),
]

GOOD_GPU = '[[gpu]]\nmodel = "A100-SXM4-80GB"\n'
SPECS = [
    (b"", "gpu"),
    (b"\x00\xff\xfe garbage", "spec"),
    (b'name = "x"\n[[gpu]\n', "malformed TOML"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\ntemperature = -5\n', "temperature"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\nutilization = 250\n', "utilization"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\nutilization = "high"\n', "utilization"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\nfan = 300\n', "fan"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\nmemory_used = "10XB"\n', "memory_used"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\nmemory_used = "1TiB"\n', "memory used"),
    (b'[[gpu]]\nmodel = "NoSuchCard"\n', "NoSuchCard"),
    (b"[[gpu]]\nmodel = 5\n", "model"),
    (b"[[gpu]]\n", "model"),
    (b'gpu = "eight"\n', "gpu"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\ncompute_mode = "Weird"\n', "compute_mode"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\nthrottle = ["melting"]\n', "throttle"),
    (b'[[gpu]]\nmodel = "A100-SXM4-80GB"\n[[gpu]\n', "malformed TOML"),
    (GOOD_GPU.encode()[:20], "malformed TOML"),
]
SPEC_CASES = [
    case("status", expect=want, files={"bad.toml": text}, spec="bad.toml") for text, want in SPECS
]

# --- environment variables -------------------------------------------------------------------

BAD_BY_KIND: dict[str, list[str]] = {
    "bool": ["maybe", "2"],
    "int": ["x", "1.5", "-1"],
    "float": ["x", "nan", "-inf"],
    "seconds": ["-1", "inf", "1e300", "soon"],
    "percent": ["150", "-1", "lots"],
    "size": ["10XB", "-1G", "2000000EiB"],
    "duration": ["-5m", "99999999999d", "forever"],
    "ids": [",,", "1,,2"],
    "ints": ["a,b", "79,-1"],
    "capability": ["eight", "8.x"],
    "listen": ["localhost", "host:0", "host:99999"],
    "choice": ["bogus"],
    "names": [",", "a,,b"],
    "shares": ["alice", "alice=0", "alice=-1,bob=2"],
    "limits": ["alice", "{}"],
    "accounts": ["vision", "{}"],
    "profile": ["10gb", "1g", "1g.10gb;rm"],
}


def _bad_env() -> Iterator[Case]:
    for key in configkeys.SCHEMA:
        for text in BAD_BY_KIND.get(key.kind, []):
            if key.kind == "int" and text == "-1" and key.low is None:
                continue
            if key.kind == "float" and key.low is None and text == "-inf":
                text = "inf"
            name = key.env_names[0]
            yield case("config", expect=f"{name}=", env={name: text})


ENV_CASES = [
    *_bad_env(),
    case("config", expect="GPU_IDS=", env={"GPU_IDS": "1,,2"}),
    case("status", expect="unknown spec", env={"GPUWARDEN_SIM": "nope"}),
    case("status", expect="not found", env={"GPUWARDEN_SIM": "/no/such/spec.toml"}),
    case("status", expect="spec", env={"GPUWARDEN_SIM": "."}),
    case("status", expect="is not a regular file", env={"GPUWARDEN_SIM": "/dev/null"}),
    case("status", expect="is not a regular file", env={"GPUWARDEN_SIM": "/tmp/"}),
    case("status", expect="GPUWARDEN_SIM_STATE", env={"GPUWARDEN_SIM_STATE": "/dev/null"}),
    case(
        "sim",
        "set",
        "--gpu",
        "0",
        "temp=50",
        expect="GPUWARDEN_SIM_STATE",
        env={"GPUWARDEN_SIM_STATE": "/dev/null"},
    ),
]

# --- config files ----------------------------------------------------------------------------


def _bad_files() -> Iterator[Case]:
    toml_bad: dict[str, list[str]] = {
        "str": ["5", "[1]", "{a = 1}"],
        "path": ["5", "true"],
        "bool": ['"maybe"', "1"],
        "int": ['"x"', "1.5", "true"],
        "float": ['"x"', "[1]", "nan"],
        "seconds": ["-1", "inf", '"x"', "1e300"],
        "percent": ["150", "-1", '"lots"'],
        "size": ['"10XB"', "-1", "1.5", '"2000000EiB"'],
        "duration": ['"-5m"', '"99999999999d"', "true"],
        "ids": ['",,"', "[true]", "{}", '[""]'],
        "ints": ["[1.5]", '"a,b"', "5", "[-1]"],
        "capability": ['"eight"', "[8]", "true"],
        "listen": ['"localhost"', '"host:0"', "9400"],
        "choice": ['"bogus"', "1"],
        "names": ["5", '[""]', "[1]"],
        "shares": ["5", "{alice = 0}", '{alice = "x"}', "[1]"],
        "limits": [
            "5",
            "{alice = 2}",
            "{alice = {max_gpus = 0}}",
            "{alice = {max_gpu = 2}}",
            '{"@lab" = {max_time = "forever"}}',
        ],
        "profile": ['"1g"', "5", '"3g.40gb,1g.10gb"'],
        "accounts": [
            "5",
            "{vision = 2}",
            "{vision = {max_jobs = 2}}",
            '{vision = {members = ["alice"], max_gpus = 0}}',
            '{vision = {members = ["alice"], share = -1}}',
            '{vision = {members = ["alice"], max_gpu = 2}}',
            '{"no good" = {members = ["alice"]}}',
        ],
    }
    for key in configkeys.SCHEMA:
        section, name = key.name.split(".")
        for value in toml_bad[key.kind]:
            if key.kind == "int" and value == "-1" and key.low is None:
                continue
            text = f"[{section}]\n{name} = {value}\n".encode()
            yield case("config", expect=f"{key.name} must be", files={"gpuwarden.toml": text})


FILE_CASES = [
    *_bad_files(),
    case("config", expect="not UTF-8", files={"gpuwarden.toml": b'[run]\nmodel = "\xff"\n'}),
    case("config", expect="not UTF-8", files={"gpuwarden.toml": b"\xfe\xff[run]\n"}),
    case("config", expect="invalid TOML", files={"gpuwarden.toml": b"[run\n"}),
    case("config", expect="invalid TOML", files={"gpuwarden.toml": b"[run]\nmin_free = \n"}),
    case("config", expect="invalid TOML", files={"gpuwarden.toml": b"\x00\x00\x00"}),
    case("config", expect="invalid TOML", files={"gpuwarden.toml": b"[run]\n[run]\n"}),
    case("config", expect="unknown key", files={"gpuwarden.toml": b"[runn]\ngpus = 1\n"}),
    case("config", expect="unknown key", files={"gpuwarden.toml": b"gpus = 1\n"}),
    case("config", expect="unknown key", files={"gpuwarden.toml": b"[run]\nmin_fre = 1\n"}),
    case("config", expect="too large", files={"gpuwarden.toml": b"#" * (2 << 20)}),
]

ALL = CLI_CASES + SIM_CASES + SPEC_CASES + ENV_CASES + FILE_CASES


def test_the_corpus_is_big_enough() -> None:
    assert len(ALL) >= 150


class _Hung(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hung


def invoke(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> tuple[Optional[int], str, str]:
    """`gpuwarden ARGV` in this process: (exit code, stdout, stderr)."""
    from gpuwarden.cli import main

    config_trust._WARNED.clear()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    try:
        code: Any = main(list(argv))
    except SystemExit as stop:
        code = stop.code
    except _Hung:
        pytest.fail(f"gpuwarden {' '.join(argv)} still ran after {SECONDS}s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    return code, out, err


def error_line(code: Optional[int], err: str) -> str:
    """The one line a bad input gives, after checking that it is one line."""
    assert code not in (0, None), f"exit code {code}, stderr: {err!r}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    if lines and lines[0].startswith("usage:"):  # argparse: its usage, then the error
        assert ": error: " in lines[-1], err
        lines = lines[-1:]
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuwarden"), err
    return lines[0]


@pytest.mark.parametrize(
    "bad", ALL, ids=[f"{i}-{' '.join(c.argv)[:40]}" for i, c in enumerate(ALL)]
)
def test_bad_input_is_one_clear_line(
    bad: Case, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUWARDEN_SIM", "server-8xa100")
    for name, data in bad.files.items():
        Path(name).write_bytes(data)
    if bad.spec is not None:
        monkeypatch.setenv("GPUWARDEN_SIM", os.path.abspath(bad.spec))
    for name, value in bad.env.items():
        monkeypatch.setenv(name, value)
    code, _, err = invoke(bad.argv, capsys)
    line = error_line(code, err)
    assert bad.expect in line, line


# --- documented fallbacks --------------------------------------------------------------------


def test_a_refused_config_file_is_skipped_with_one_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = Path("gpuwarden.toml")
    path.write_text('[run]\nmodel = "H100"\n')
    path.chmod(0o666)
    code, out, err = invoke(("config", "run.model"), capsys)
    assert code == 0
    assert out.split()[:2] == ["run.model", "-"]  # the default: the file was not read
    why = "the file is writable by others (mode 0666)"
    assert err == f"gpuwarden: ignoring config file {path.absolute()}: {why}\n"


def test_exporter_without_prometheus_client_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUWARDEN_SIM", "server-8xa100")
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    code, _, err = invoke(("exporter", "--once"), capsys)
    assert error_line(code, err) == (
        "gpuwarden exporter: the exporter needs prometheus-client: "
        "pip install 'gpuwarden[exporter]'"
    )


@pytest.mark.parametrize(
    "value", ["0,0", "x", "0,,1", "-1,0", "99", "GPU-zz", "MIG-zz", " ", "0,x"]
)
def test_malformed_cuda_visible_devices_is_one_problem_line_and_exit_1(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The documented fallback (docs/visible.md): `visible` shows what CUDA will do with
    the value and names the problem; `--check` makes it the exit status."""
    monkeypatch.setenv("GPUWARDEN_SIM", "server-8xa100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    code, out, err = invoke(("visible", "--check"), capsys)
    assert code == 1 and err == ""
    problems = [ln for ln in out.splitlines() if ln.startswith("problem: ")]
    assert len(problems) == 1 and "CUDA_VISIBLE_DEVICES" in problems[0]


def test_unknown_cuda_device_order_falls_back_to_cuda_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUWARDEN_SIM", "server-8xa100")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "RANDOM")
    code, out, _ = invoke(("visible",), capsys)
    assert code == 0
    assert "CUDA uses its default, FASTEST_FIRST" in out


# --- the same through real processes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "expect"),
    [
        (("reserve", "--for", "99999999999d"), {}, "above ten years"),
        (("sim", "set", "--gpu", "0", "temp=-500"), {}, "temperature must be 0 to 150"),
        (("stauts",), {}, "did you mean 'status'?"),
        (("config",), {"GPUWARDEN_RECORD_INTERVAL": "0"}, "record.interval must be"),
        (("select", "--min-free", "1" * 400), {}, "(1EiB at most)"),
    ],
)
def test_real_processes_print_the_same_one_line(cli, sim, args, env, expect) -> None:
    sim("server-8xa100")
    r = cli(*args, env=env, timeout=SECONDS)
    assert expect in error_line(r.returncode, r.stderr)


def test_non_utf8_config_through_a_real_process(cli, sim) -> None:
    sim("server-8xa100")
    Path("gpuwarden.toml").write_bytes(b'[run]\nmodel = "\xe9"\n')
    r = cli("config", timeout=SECONDS)
    assert "not UTF-8 text (byte 0xe9 on line 2)" in error_line(r.returncode, r.stderr)
