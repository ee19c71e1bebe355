"""Where the settings files are: the system file, the user file and the project file
(and where the queue service listens unless they say otherwise).

Apart from `gpuwarden.config` (which reads them) so that a command that only needs
to know whether a file is there (`submit`'s short path, `queueclient.thin`) finds
out with a few `stat` calls and imports nothing else. Strings, not Paths: pathlib
stays off the start-up path.
"""

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Optional

SYSTEM_CONFIG = "/etc/gpuwarden/config.toml"
PROJECT_FILE = "gpuwarden.toml"
DEFAULT_SOCKET = "/run/gpuwarden/gpuwarden.sock"  # the queue service's, unless configured


def system_config(env: "Mapping[str, str]") -> str:
    return env.get("GPUWARDEN_SYSTEM_CONFIG") or SYSTEM_CONFIG


def user_config(env: "Mapping[str, str]") -> str:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpuwarden", "config.toml")


def absolute(path: "str | os.PathLike[str]") -> str:
    """`Path(path).absolute()` as a string: joined to the working directory, `.` and
    doubled slashes dropped, `..` kept (it may cross a symlink)."""
    joined = os.path.join(os.getcwd(), path)
    return "/" + "/".join(p for p in joined.split("/") if p and p != ".")


def project_config(cwd: "str | os.PathLike[str] | None" = None) -> "Optional[str]":
    """The nearest `gpuwarden.toml` from `cwd` upwards, stopping at the repository root
    (a directory holding `.git`), the home directory or `/`; None if there is none.

    Walking up lets a job started from `experiments/` in a repository use the
    repository's settings; stopping at the repository root keeps one project's
    file from leaking into another."""
    directory = absolute(os.getcwd() if cwd is None else cwd)
    home = absolute(os.path.expanduser("~"))
    while True:
        candidate = os.path.join(directory, PROJECT_FILE)
        if os.path.lexists(candidate):  # whatever it is: a planted FIFO is refused, not skipped
            return candidate
        if directory == home or os.path.exists(os.path.join(directory, ".git")):
            return None
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
