"""Real Unix users for tests of identity and isolation (root only).

`make_user("alice")` creates the account once per machine (named with a `gw-`
prefix so no real account is touched) and returns its `Person`; tests that need
it skip with the reason where they cannot create users (not root, no useradd),
and fail under CI, which must run them (components.require).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess

from components import require
from gpuwarden.service.identity import Person, person

PREFIX = "gw-"


def can_make_users() -> bool:
    return os.geteuid() == 0 and shutil.which("useradd") is not None


def make_group(name: str) -> int:
    full = PREFIX + name
    try:
        return grp.getgrnam(full).gr_gid
    except KeyError:
        subprocess.run(["groupadd", full], check=True, capture_output=True)
        return grp.getgrnam(full).gr_gid


def make_user(name: str, groups: tuple[str, ...] = ()) -> Person:
    """The test user `gw-NAME` (created if missing), member of `gw-GROUP` for each group."""
    require(can_make_users(), "creating Unix users needs root and useradd")
    full = PREFIX + name
    try:
        pwd.getpwnam(full)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--shell", "/bin/sh", full],
            check=True,
            capture_output=True,
        )
    for group in groups:
        make_group(group)
        subprocess.run(["usermod", "-aG", PREFIX + group, full], check=True, capture_output=True)
    return person(pwd.getpwnam(full).pw_uid)
