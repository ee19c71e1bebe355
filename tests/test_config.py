"""Config: layering, provenance, normalisation and one-line errors for every bad input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpuwarden import config
from gpuwarden.base import units
from gpuwarden.base.errors import UserError
from gpuwarden.config import keys as configkeys
from gpuwarden.config import trust as config_trust
from gpuwarden.config import values as configvalues
from gpuwarden.files import locations

GiB = 2**30


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def system(isolated: Path) -> Path:
    return isolated / "etc" / "config.toml"


@pytest.fixture
def user(isolated: Path) -> Path:
    return isolated / "xdg-config" / "gpuwarden" / "config.toml"


def test_defaults_come_from_the_schema() -> None:
    cfg = config.load()
    assert cfg.get("run.keep_first_last") is True
    assert cfg.get("exporter.listen") == "127.0.0.1:9400"
    assert cfg.get("health.fatal_xids") is None  # health's catalogue list applies
    assert cfg.source("run.min_free") == "default"
    assert [k for k, _, _ in cfg.items()] == [k.name for k in configkeys.SCHEMA]


def test_precedence_system_user_project_env_cli(
    system: Path, user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(system, '[run]\nmin_free = "1GiB"\nmax_util = 10\nmodel = "sys"\nexclude = [7]\n')
    write(user, '[run]\nmin_free = "2GiB"\nmax_util = 20\nmodel = "user"\n')
    write(Path("gpuwarden.toml"), '[run]\nmin_free = "3GiB"\nmax_util = 30\n')
    monkeypatch.setenv("GPUWARDEN_RUN_MIN_FREE", "4GiB")
    cfg = config.load({"run.min_free": "5GiB", "run.count": None})
    assert cfg.get("run.min_free") == 5 * GiB
    assert cfg.source("run.min_free") == "command line"
    assert cfg.get("run.max_util") == 30.0
    assert cfg.source("run.max_util").startswith("project: ")
    assert cfg.get("run.model") == "user"
    assert cfg.source("run.model") == f"user: {user}"
    assert cfg.get("run.exclude") == ("7",)
    assert cfg.source("run.exclude") == f"system: {system}"
    assert cfg.get("run.count") is None  # a None on the command line means "not given"
    monkeypatch.delenv("GPUWARDEN_RUN_MIN_FREE")
    assert config.load().get("run.min_free") == 3 * GiB


def test_project_file_is_found_from_a_subdirectory_but_not_past_the_repo_root(
    isolated: Path,
) -> None:
    repo = isolated / "cwd"
    write(repo / "gpuwarden.toml", '[run]\nmodel = "A100"\n')
    (repo / ".git").mkdir()
    sub = repo / "experiments" / "deep"
    sub.mkdir(parents=True)
    assert config.load(cwd=sub).get("run.model") == "A100"
    # A nested repository does not inherit its parent's project file.
    inner = sub / "vendored"
    (inner / ".git").mkdir(parents=True)
    assert config.load(cwd=inner).get("run.model") is None


def test_gpu_ids_is_a_default_for_run_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    write(Path("gpuwarden.toml"), '[run]\ngpus = "0,1"\n')
    monkeypatch.setenv("GPU_IDS", "2, 3")
    cfg = config.load()
    assert cfg.get("run.gpus") == ("2", "3")
    assert cfg.source("run.gpus") == "env: GPU_IDS"
    monkeypatch.setenv("GPUWARDEN_RUN_GPUS", "GPU-ab")
    assert config.load().get("run.gpus") == ("GPU-ab",)
    assert config.load({"run.gpus": "5"}).get("run.gpus") == ("5",)
    monkeypatch.delenv("GPUWARDEN_RUN_GPUS")
    monkeypatch.setenv("GPU_IDS", "")  # set but empty: ignored, the file applies
    assert config.load().get("run.gpus") == ("0", "1")


def test_short_env_names(monkeypatch: pytest.MonkeyPatch, isolated: Path) -> None:
    monkeypatch.setenv("GPUWARDEN_DEVICE", "cpu")
    cfg = config.load()
    assert cfg.get("torch.device") == "cpu"
    assert cfg.source("torch.device") == "env: GPUWARDEN_DEVICE"
    assert cfg.get("lease.dir") == str(isolated / "leases")
    assert locations.lease_location() == str(isolated / "leases")
    assert locations.state_location() == str(isolated / "state")


def test_values_are_normalised(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUWARDEN_LEASE_DIR")
    write(
        user,
        "[run]\n"
        'min_capability = "8.6"\n'
        'timeout = "1h"\n'
        'gpus = [0, "GPU-3f"]\n'
        "[health]\n"
        "fatal_xids = [79, 48]\n"
        "[record]\n"
        "max_bytes = 1024\n"
        "[lease]\n"
        'dir = "rel/leases"\n',
    )
    cfg = config.load()
    assert cfg.get("run.min_capability") == (8, 6)
    assert cfg.get("run.timeout") == 3600.0
    assert cfg.get("run.gpus") == ("0", "GPU-3f")
    assert cfg.get("health.fatal_xids") == (79, 48)
    assert cfg.get("record.max_bytes") == 1024
    # A relative path in a file is relative to that file, not to wherever a job starts.
    assert cfg.get("lease.dir") == str(user.parent / "rel" / "leases")


def test_dotted_keys_at_top_level_work(user: Path) -> None:
    write(user, 'run.model = "H100"\n')
    assert config.load().get("run.model") == "H100"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[run]\nmin_fre = "1G"\n',
            "unknown key 'run.min_fre' (line 2); did you mean 'run.min_free'?",
        ),
        ("[runn]\ngpus = 1\n", "unknown key 'runn.gpus' (line 2)"),
        ("gpus = 1\n", "unknown key 'gpus' (line 1)"),
        (
            '[run]\nmax_util = "high"\n',
            "run.max_util must be a percentage 0-100, got 'high' (line 2)",
        ),
        ("[run]\nmax_util = 150\n", "run.max_util must be a percentage 0-100, got 150"),
        ('[run]\nmin_free = "10XB"\n', "run.min_free must be a size such as 20GiB or 500M"),
        ("[run]\nkeep_first_last = 1\n", "run.keep_first_last must be true or false, got 1"),
        ('[run]\nid_format = "pci"\n', "run.id_format must be one of index|uuid, got 'pci'"),
        ("[run]\ncount = 1.5\n", "run.count must be an integer >= 0, got 1.5"),
        (
            '[service]\nkeep_history = "1d"\n',
            "service.keep_history must be a duration such as 90, 30s, 5m or 4h (ten years at "
            "most), at least 8 days, got '1d'",
        ),
        ('[health]\nfatal_xids = ["x"]\n', "health.fatal_xids must be a list of integers"),
        ('[exporter]\nlisten = "localhost"\n', "exporter.listen must be HOST:PORT"),
        ('[run]\nmin_capability = "eight"\n', "run.min_capability must be a compute capability"),
    ],
)
def test_bad_file_values_name_file_key_and_type(user: Path, text: str, expected: str) -> None:
    write(user, text)
    with pytest.raises(UserError) as err:
        config.load()
    message = str(err.value)
    assert message.startswith(f"{user}: ")
    assert expected in message
    assert "\n" not in message


def test_broken_toml_is_one_line_with_the_position(system: Path) -> None:
    write(system, "[run\nmin_free = \n")
    with pytest.raises(UserError) as err:
        config.load()
    assert str(err.value).startswith(f"{system}: invalid TOML: ")
    assert "line 1" in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_env_and_cli_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_RUN_MAX_UTIL", "lots")
    with pytest.raises(UserError, match=r"GPUWARDEN_RUN_MAX_UTIL='lots': run.max_util must be"):
        config.load()
    monkeypatch.delenv("GPUWARDEN_RUN_MAX_UTIL")
    with pytest.raises(UserError, match=r"invalid min_free '10XB': expected a size"):
        config.load({"run.min_free": "10XB"})
    with pytest.raises(UserError, match="GPU_IDS='0,,1'"):
        monkeypatch.setenv("GPU_IDS", "0,,1")
        config.load()
    monkeypatch.delenv("GPU_IDS")
    with pytest.raises(KeyError):
        config.load({"run.nope": 1})


def test_unknown_gpuwarden_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher exports GPUWARDEN_* variables describing a lease; they must not be
    # mistaken for (or rejected as) settings.
    monkeypatch.setenv("GPUWARDEN_LEASE_ID", "abc")
    monkeypatch.setenv("GPUWARDEN_MEM_LIMIT", "1")
    assert config.load().source("lease.dir") == "env: GPUWARDEN_LEASE_DIR"


def test_durations_and_capabilities() -> None:
    assert units.parse_duration("90") == 90
    assert units.parse_duration("1.5m") == 90
    assert units.parse_duration("2d") == 172800
    assert configvalues.parse_capability("9") == (9, 0)
    assert configvalues.parse_capability(8.6) == (8, 6)
    for bad in ("4 hours", "-1", "h"):
        with pytest.raises(UserError, match="invalid duration"):
            units.parse_duration(bad)


def test_time_limits_are_read_as_slurm_reads_them() -> None:
    """`--time 90` is ninety minutes with the queue service as with --slurm; every form
    the Slurm path accepts means the same number of seconds on both."""
    from gpuwarden.slurm.batch import slurm_time

    cases = {
        "90": 5400,
        "5:30": 330,
        "1:30:00": 5400,
        "2-00": 172800,
        "2-3:4": 183840,
        "2-3:4:5": 183845,
        "90s": 90,
        "30m": 1800,
        "1.5h": 5400,
        "2d": 172800,
    }
    for text, seconds in cases.items():
        assert units.parse_time_limit(text) == seconds, text
        assert units.parse_time_limit(slurm_time(text)) == seconds, text
    for unlimited in ("0", "UNLIMITED", "infinite", "0:00"):
        assert units.parse_time_limit(unlimited) is None
    bad_ones = ("junk", "1:2:3:4", "-5", "", "1:", "x-1", "4 hours", "99999999", "0s")
    for bad in (*bad_ones, "\u00b2", "1-\u00b2", "\u0663\u0660"):  # ², 1-², Arabic-Indic 30
        with pytest.raises(UserError, match=r"^invalid --time "):
            units.parse_time_limit(bad)
        with pytest.raises(UserError, match=r"^invalid --time "):
            slurm_time(bad)


def test_locations_fall_back_to_system_then_per_user(
    monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    monkeypatch.delenv("GPUWARDEN_LEASE_DIR")
    monkeypatch.delenv("GPUWARDEN_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(isolated / "xdg-state"))
    shared = isolated / "var"
    monkeypatch.setattr(locations, "SYSTEM_LEASE_DIR", str(shared / "leases"))
    monkeypatch.setattr(locations, "SYSTEM_STATE_DIR", str(shared / "state"))
    assert locations.lease_location() == str(isolated / "xdg-state" / "gpuwarden" / "leases")
    assert locations.state_location() == str(isolated / "xdg-state" / "gpuwarden")
    (shared / "leases").mkdir(parents=True)
    (shared / "state").mkdir()
    assert locations.lease_location() == str(shared / "leases")
    assert locations.state_location() == str(shared / "state")
    write(Path("gpuwarden.toml"), '[lease]\ndir = "/srv/l"\n[state]\ndir = "/srv/s"\n')
    assert locations.lease_location() == str(Path("/srv/l"))
    assert locations.state_location() == str(Path("/srv/s"))


def test_loading_without_files_does_not_import_tomllib(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys; from gpuwarden import config; config.load(); "
        "print('tomllib' in sys.modules or 'tomli' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == "False"


def test_docs_list_every_key() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    for key in configkeys.SCHEMA:
        assert f"`{key.name}`" in doc, key.name
        for name in key.env_names:
            assert name in doc, name


def test_cli_config_shows_values_and_sources(cli, user: Path) -> None:
    write(user, '[run]\nmin_free = "20GiB"\n')
    out = cli("config", env={"GPUWARDEN_RUN_MAX_UTIL": "50"})
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert "20.0GiB" in lines["run.min_free"] and f"user: {user}" in lines["run.min_free"]
    assert "env: GPUWARDEN_RUN_MAX_UTIL" in lines["run.max_util"]
    assert "default" in lines["run.keep_first_last"]
    data = json.loads(cli("config", "--json").stdout)
    assert data["run.min_free"] == {"value": 20 * GiB, "source": f"user: {user}"}
    assert data["health.fatal_xids"]["value"] is None


def test_cli_config_bad_file_is_one_line(cli, user: Path) -> None:
    write(user, "[run]\nzzz = 1\n")
    out = cli("config")
    assert out.returncode == 2
    assert out.stderr.strip() == f"gpuwarden config: {user}: unknown key 'run.zzz' (line 2)"


# --- trust: files and directories another user can write are refused ---------------------

OTHER_USER = "gpuwarden-other"


@pytest.fixture
def other_uid() -> int:
    """The uid of a real second Unix account (created here when missing, as root)."""
    import pwd
    import shutil
    import subprocess

    from components import require

    require(os.geteuid() == 0, "needs root to create and chown to a second Unix user")
    try:
        return pwd.getpwnam(OTHER_USER).pw_uid
    except KeyError:
        pass
    require(shutil.which("useradd") is not None, "useradd is not installed")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
        check=False,
        capture_output=True,
    )  # a parallel test may have made it first: look it up either way
    return pwd.getpwnam(OTHER_USER).pw_uid


HOOK = '[health]\nhook = "touch /tmp/owned"\n'


def project(isolated: Path, mode: int = 0o755) -> Path:
    """A project directory holding gpuwarden.toml, with the working directory below it."""
    top = isolated / "proj"
    (top / "sub").mkdir(parents=True)
    top.chmod(mode)
    os.chdir(top / "sub")
    return write(top / "gpuwarden.toml", HOOK)


def refused_load(capsys: pytest.CaptureFixture[str]) -> tuple[config.Config, str]:
    config_trust._WARNED.clear()
    cfg = config.load()
    return cfg, capsys.readouterr().err


def test_a_project_file_owned_by_another_user_is_refused(
    isolated: Path, other_uid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project(isolated)
    os.chown(path, other_uid, -1)
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") is None
    assert cfg.files == ()
    assert cfg.refused[0][:2] == ("project", str(path))
    assert f"owned by {OTHER_USER}" in cfg.refused[0][2]
    assert err == (
        f"gpuwarden: ignoring config file {path}: the file is owned by {OTHER_USER} "
        f"(uid {other_uid}), not by you or root\n"
    )
    config.load()  # once per process, however often settings are loaded
    assert capsys.readouterr().err == ""


def test_a_directory_owned_by_another_user_is_refused(
    isolated: Path, other_uid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project(isolated)
    os.chown(path.parent, other_uid, -1)  # they can replace the file at will
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") is None
    assert f"its directory {path.parent} is owned by {OTHER_USER}" in err


def test_a_symlink_planted_by_another_user_is_refused(
    isolated: Path, other_uid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = write(isolated / "mine.toml", HOOK)
    top = isolated / "proj"
    top.mkdir()
    os.chdir(top)
    link = top / "gpuwarden.toml"
    link.symlink_to(mine)
    assert config.load().get("health.hook") == "touch /tmp/owned"  # my own link: followed
    os.lchown(link, other_uid, -1)
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") is None
    assert "the symlink is owned by" in err


@pytest.mark.parametrize("mode", [0o777, 0o757, 0o722])
def test_a_directory_others_can_write_is_refused(
    isolated: Path, mode: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = project(isolated, mode)
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") is None
    assert f"its directory {path.parent} is writable by others (mode {mode:04o})" in err


def test_a_sticky_shared_directory_keeps_your_own_file(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project(isolated, 0o1777)  # like /tmp: others may add files, not replace ours
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") == "touch /tmp/owned"
    assert err == ""


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o602])
def test_a_file_others_can_write_is_refused(
    user: Path, mode: int, capsys: pytest.CaptureFixture[str]
) -> None:
    write(user, HOOK).chmod(mode)
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") is None
    assert cfg.refused == (
        ("user", str(user), f"the file is writable by others (mode {mode:04o})"),
    )
    assert err.count("\n") == 1


def test_a_fifo_or_directory_in_place_of_the_file_is_refused_without_hanging(
    isolated: Path, user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    user.parent.mkdir(parents=True)
    os.mkfifo(user)  # opening it for reading would wait for a writer forever
    Path("gpuwarden.toml").mkdir()
    cfg, err = refused_load(capsys)
    assert [(layer, why) for layer, _, why in cfg.refused] == [
        ("user", "not a regular file"),
        ("project", "not a regular file"),
    ]
    assert err.count("\n") == 2


def test_cli_config_shows_the_refusal(cli, isolated: Path) -> None:
    path = project(isolated, 0o777)
    r = cli("config")
    assert r.returncode == 0, r.stderr
    why = f"its directory {path.parent} is writable by others (mode 0777)"
    assert f"file refused: project: {path}: {why}" in r.stdout
    assert r.stderr == f"gpuwarden: ignoring config file {path}: {why}\n"


def test_a_huge_file_is_one_line(user: Path) -> None:
    write(user, "# " + "x" * (config.MAX_CONFIG_BYTES + 10) + "\n")
    with pytest.raises(UserError, match="too large for a config file"):
        config.load()


def test_a_file_swapped_after_its_check_is_refused_in_one_line(tmp_path: Path) -> None:
    """Between `trust.refusal`'s look and the read the file may be replaced: a FIFO is
    never waited on, a huge file never read whole (safefiles.read_small)."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(UserError) as err:
        config._read_toml(fifo)
    assert str(err.value) == f"{fifo}: not a regular file"
    huge = write(tmp_path / "huge.toml", "#" * (config.MAX_CONFIG_BYTES + 1))
    with pytest.raises(UserError) as err:
        config._read_toml(huge)
    assert str(err.value) == (
        f"{huge}: too large for a config file (over {config.MAX_CONFIG_BYTES} bytes)"
    )
    with pytest.raises(UserError) as err:
        config._read_toml(tmp_path / "gone.toml")
    assert str(err.value) == f"{tmp_path / 'gone.toml'}: cannot read: No such file or directory"


def test_non_utf8_file_is_one_line_naming_the_file(user: Path, cli) -> None:
    user.parent.mkdir(parents=True)
    user.write_bytes(b'[run]\nmodel = "caf\xe9"\n')
    with pytest.raises(UserError) as err:
        config.load()
    assert str(err.value) == f"{user}: not UTF-8 text (byte 0xe9 on line 2)"
    r = cli("config")
    assert r.returncode == 2
    assert r.stderr == f"gpuwarden config: {user}: not UTF-8 text (byte 0xe9 on line 2)\n"


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("exporter", "cache_seconds", "-1"),
        ("exporter", "idle_seconds", "0"),
        ("exporter", "idle_seconds", "-5"),
        ("health", "poll_seconds", "0"),
        ("health", "poll_seconds", "-0.5"),
        ("health", "poll_seconds", "1e300"),
        ("health", "hook_timeout", "0"),
        ("health", "webhook_timeout", "-1"),
        ("health", "ecc_corrected_warn", "-1"),
        ("health", "ecc_corrected_rate_warn", "-0.1"),
        ("health", "pcie_replay_warn", "-3"),
        ("health", "fatal_xids", "[79, -1]"),
        ("health", "fatal_xids", "[0]"),
        ("record", "interval", "0"),
        ("record", "interval", "-1"),
        ("record", "interval", "nan"),
        ("record", "interval", "inf"),
        ("record", "max_bytes", "0"),
        ("record", "max_bytes", "-1"),
        ("run", "count", "-1"),
        ("run", "timeout", "-1"),
        ("run", "timeout", '"99999999999d"'),
        ("run", "min_free", '"2000000EiB"'),
        ("run", "min_free", "-1"),
    ],
)
def test_numbers_out_of_range_name_the_key(user: Path, section: str, key: str, value: str) -> None:
    write(user, f"[{section}]\n{key} = {value}\n")
    with pytest.raises(UserError) as err:
        config.load()
    assert str(err.value).startswith(f"{user}: {section}.{key} must be ")
    assert str(err.value).endswith(" (line 2)")


def test_zero_cache_means_every_scrape_reads(user: Path) -> None:
    write(user, "[exporter]\ncache_seconds = 0\n")
    assert config.load().get("exporter.cache_seconds") == 0.0


def test_out_of_range_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_HEALTH_POLL_SECONDS", "0")
    with pytest.raises(UserError) as err:
        config.load()
    assert str(err.value) == (
        "GPUWARDEN_HEALTH_POLL_SECONDS='0': health.poll_seconds must be "
        "a number of seconds (ten years at most) > 0"
    )


def test_group_write_counts_only_when_someone_else_is_in_the_group(
    user: Path, other_uid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    import pwd

    write(user, HOOK).chmod(0o664)  # umask 002 with a user private group: the usual case
    os.chown(user, -1, pwd.getpwuid(os.geteuid()).pw_gid)
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") == "touch /tmp/owned" and err == ""
    os.chown(user, -1, pwd.getpwuid(other_uid).pw_gid)  # the other user's primary group
    cfg, err = refused_load(capsys)
    assert cfg.get("health.hook") is None
    assert "the file is writable by others (mode 0664)" in err


def test_every_load_reads_the_configuration_in_force(
    user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reading is kept for later calls, in this thread or another: a command hands
    its one reading down as an argument (issue 25), so `load()` has nothing to
    remember. A cached reading (module-wide, or scoped to a block or context) would
    answer one of these with an earlier reading."""
    import contextvars
    import threading

    write(user, "[run]\ncount = 2\n")
    first = config.load()
    write(user, "[run]\ncount = 3\n")
    seen: list[object] = []
    other = threading.Thread(target=lambda: seen.append(config.load().get("run.count")))
    other.start()
    other.join()
    monkeypatch.setenv("GPUWARDEN_RUN_COUNT", "5")
    assert (first.get("run.count"), seen, config.load().get("run.count")) == (2, [3], 5)
    kept = [
        name
        for name, value in vars(config).items()
        if isinstance(value, (config.Config, contextvars.ContextVar))
    ]
    assert kept == [], f"a reading kept in gpuwarden.config: {kept}"
