"""`gpuwarden slurm cluster HOST... --check`: what breaks first when a lab moves onto
Slurm is rarely slurm.conf but the machines: a user whose uid differs between hosts
(a job runs as a number, so it runs as someone else, or not at all), a munge key not
copied (every message between the nodes is refused), data at another path, clocks
apart (munge refuses credentials from a clock minutes off, and accounting mixes up
times), Slurm versions that cannot talk, a gres.conf that no longer says what the
GPUs are. Each check here is a pure function over the hosts' own documents
(gpuwarden.slurm.hostfacts), and each problem is one line with its fix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.base.records import record

#: Seconds two clocks may differ (the issue of a lab's move is minutes; NTP keeps ms).
MAX_SKEW = 1.0


@record
class Host:
    """One host's document and when this machine asked for it (its clock's times
    just before the ssh and just after the answer: the host's time lies between)."""

    name: str
    facts: Mapping[str, Any]
    asked: float
    answered: float


def _most(values: Sequence[Any]) -> Any:
    """The value most hosts have (the first host's among equals): the one to keep."""
    counts = Counter(values)
    top = max(counts.values())
    return next(v for v in values if counts[v] == top)


def users(hosts: Sequence[Host]) -> list[str]:
    """Every account the same uid, gid and home on every host, and no uid two names."""
    seen: dict[str, dict[str, tuple[int, int, str]]] = {}
    for h in hosts:
        for name, uid, gid, home in h.facts["users"]:
            seen.setdefault(name, {})[h.name] = (uid, gid, home)
    out = []
    for name in sorted(seen):
        where = seen[name]
        for i, what in enumerate(("uid", "gid", "home")):
            values = {host: v[i] for host, v in where.items()}
            keep = _most(list(values.values()))
            first = next(host for host, v in values.items() if v == keep)
            for host, value in values.items():
                if value == keep:
                    continue
                fix = {
                    "uid": f"usermod -u {keep} {name} there, then chown its files",
                    "gid": f"give it group {keep} there (usermod -g, groupmod -g)",
                    "home": f"usermod -d {keep} {name} there, or mount it at {keep}",
                }[what]
                out.append(f"{host}: user {name} has {what} {value}, {keep} on {first}: {fix}")
        homeless = [h.name for h in hosts if name in h.facts.get("missing_homes", ())]
        if homeless and len(homeless) < len(where):
            home = next(iter(where.values()))[2]
            for host in homeless:
                out.append(
                    f"{host}: user {name}'s home {home} is missing (it is there on the others): "
                    "mount the homes there at the same path (a job starts in it)"
                )
        missing = [h.name for h in hosts if h.name not in where]
        if missing and name not in ("slurm", "munge"):
            uid, gid, _ = next(iter(where.values()))
            for host in missing:
                out.append(
                    f"{host}: no user {name} (uid {uid} on {', '.join(sorted(where))}): its jobs "
                    f"cannot run there; useradd -u {uid} -g {gid} {name}, or one directory "
                    "for all (LDAP, sssd)"
                )
    by_uid: dict[int, set[str]] = {}
    for name, where in seen.items():
        for uid, _, _ in where.values():
            by_uid.setdefault(uid, set()).add(name)
    for uid, names in sorted(by_uid.items()):
        if len(names) > 1:
            out.append(
                f"uid {uid} is {' and '.join(sorted(names))} on different hosts: a job of one "
                "would run as the other; give each person one uid everywhere"
            )
    return out


def munge(hosts: Sequence[Host], key_file: str) -> list[str]:
    """munged answering on every host, with one key: the same SHA-256 where the key
    could be read, and a credential made on the checking machine decoded everywhere."""
    out = []
    copy = (
        f"copy one {key_file} to every host (owner munge, mode 400) and restart munge "
        "(README: the munge key)"
    )
    for h in hosts:
        m = h.facts["munge"]
        if not m["answering"]:
            out.append(
                f"{h.name}: munged does not answer ({m['error']}): install and start munge "
                "(apt install munge; systemctl enable --now munge)"
            )
        elif m["decoded"] is False:
            out.append(
                f"{h.name}: cannot decode a munge credential made here ({m['decode_error']}): "
                f"its munge key differs; {copy}"
            )
    hashes = {h.name: h.facts["munge"]["key_sha256"] for h in hosts}
    known = [v for v in hashes.values() if v]
    if known:
        keep = _most(known)
        first = next(host for host, v in hashes.items() if v == keep)
        for host, value in hashes.items():
            if value and value != keep:
                out.append(
                    f"{host}: munge key differs from {first}'s (sha256 {value[:12]}…, "
                    f"not {keep[:12]}…): {copy}"
                )
    unread = [
        h
        for h in hosts
        if not h.facts["munge"]["key_sha256"]
        and h.facts["munge"]["decoded"] is None
        and h.facts["munge"]["answering"]
    ]
    if unread:
        names = ", ".join(h.name for h in unread)
        why = unread[0].facts["munge"]["key_error"] or "unreadable"
        out.append(
            f"{names}: munge key not compared ({key_file}: {why}) and no munged here to make "
            "a credential: run --check as root over ssh, or where munged runs"
        )
    return out


def paths(hosts: Sequence[Host]) -> list[str]:
    """Every path the admin named is a directory on every host."""
    out = []
    for h in hosts:
        for path, state in sorted(h.facts["paths"].items()):
            if state != "dir":
                out.append(
                    f"{h.name}: {path} is {state}: mount or make it there at the same path (a "
                    "job opens the paths it was submitted with, on whichever node it runs)"
                )
    return out


def clocks(hosts: Sequence[Host], limit: float = MAX_SKEW) -> list[str]:
    """A host whose clock read outside the moments this machine asked and was answered,
    by more than `limit` seconds: certainly that far off, whatever ssh took."""
    out = []
    for h in hosts:
        then = float(h.facts["time"])
        off = then - h.answered if then > h.answered else then - h.asked if then < h.asked else 0
        if abs(off) > limit:
            side = "ahead of" if off > 0 else "behind"
            out.append(
                f"{h.name}: clock at least {abs(off):.1f} s {side} this machine's: run one "
                "time service everywhere (chrony or systemd-timesyncd); munge refuses "
                "credentials from a clock 5 minutes off"
            )
    return out


def _release(version: str) -> str:
    """ "slurm-wlm 22.05.8" -> "22.05" (the release: what must agree)."""
    words = version.split()
    number = words[-1] if words else version
    return ".".join(number.split(".")[:2])


def slurm(hosts: Sequence[Host]) -> list[str]:
    """slurmd installed everywhere, of one release."""
    out = []
    versions = {h.name: h.facts["slurm"] for h in hosts}
    found = [v for v in versions.values() if v]
    keep = _most([_release(v) for v in found]) if found else None
    for host, version in versions.items():
        if not version:
            also = f" (release {keep}, as on the others)" if keep else ""
            out.append(f"{host}: no slurmd installed: apt install slurmd slurm-client{also}")
        elif keep and _release(version) != keep:
            out.append(
                f"{host}: Slurm {_release(version)}, {keep} on the others: install one release "
                "everywhere (slurmctld never older than any slurmd)"
            )
    return out


def cgroups(hosts: Sequence[Host], asked: str = "autodetect") -> list[str]:
    """One cgroup version on every node, which --cgroup names when it is given."""
    out = []
    versions = [h.facts["cgroup"] for h in hosts]
    keep = asked if asked in ("v1", "v2") else _most(versions)
    for h, version in zip(hosts, versions):
        if version != keep:
            fix = (
                "slurmd autodetects v1 or v2 only: boot it with one"
                if version in ("hybrid", "none")
                else "boot every node with one version (systemd.unified_cgroup_hierarchy)"
            )
            out.append(f"{h.name}: cgroup {version}, not {keep} as the others: {fix}")
    return out


def gres(hosts: Sequence[Host]) -> list[str]:
    """Where a host already has a gres.conf, its lines say what NVML sees now: the GPU
    types and the MIG layout (changed by `nvidia-smi mig` since it was written)."""
    out = []
    for h in hosts:
        have, now = h.facts["gres_conf"], h.facts["gres_lines"]
        if now is None:
            out.append(f"{h.name}: no GPUs read ({h.facts['gpu_error']}): install the driver")
            continue
        if have is None or sorted(have) == sorted(now):
            continue
        out.append(
            f"{h.name}: its gres.conf lists {_summary(have)}, NVML shows {_summary(now)} (GPU "
            "types or the MIG layout changed): write it again (gpuwarden slurm conf), drain "
            "the node and restart slurmd"
        )
    return out


def _summary(lines: Sequence[str]) -> str:
    """ "gpu:a100_1g.10gb x2, gpu:t4" from gres.conf lines."""
    kinds: Counter[str] = Counter()
    for line in lines:
        words = dict(w.partition("=")[::2] for w in line.split())
        kinds[words.get("Type", "untyped")] += 1
    if not kinds:
        return "no GPUs"
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items()))


def problems(
    hosts: Sequence[Host], key_file: str = "/etc/munge/munge.key", cgroup: str = "autodetect"
) -> list[str]:
    """Every problem of the hosts, one line each with its fix."""
    return [
        *users(hosts),
        *munge(hosts, key_file),
        *paths(hosts),
        *clocks(hosts),
        *slurm(hosts),
        *cgroups(hosts, cgroup),
        *gres(hosts),
    ]


def checked(doc: Any) -> Optional[str]:
    """Why a host's answer is not a `slurm facts` document, or None when it is one."""
    if not isinstance(doc, dict) or doc.get("schema") != 1:
        return "did not answer with `gpuwarden slurm facts` (an older gpuwarden there?)"
    for key, kind in (
        ("users", list),
        ("munge", dict),
        ("paths", dict),
        ("time", (int, float)),
        ("cgroup", str),
    ):
        if not isinstance(doc.get(key), kind):
            return f"its facts have no {key}"
    m = doc["munge"]
    if not (
        isinstance(m.get("answering"), bool)
        and m.get("decoded") in (True, False, None)
        and all(isinstance(m.get(k), str) for k in ("error", "decode_error", "key_error"))
        and (m.get("key_sha256") is None or isinstance(m.get("key_sha256"), str))
    ):
        return "its munge facts are not munge's"
    for key in ("gres_lines", "gres_conf"):
        lines = doc.get(key)
        if lines is not None and not (
            isinstance(lines, list) and all(isinstance(x, str) for x in lines)
        ):
            return f"its {key} are not lines"
    homes = doc.get("missing_homes", [])
    if not isinstance(homes, list) or not all(isinstance(x, str) for x in homes):
        return "its missing homes are not names"
    if not all(isinstance(v, str) for v in doc["paths"].values()):
        return "its paths are not paths"
    if not isinstance(doc.get("slurm"), (str, type(None))) or not isinstance(
        doc.get("gpu_error", ""), str
    ):
        return "its Slurm version is not a version"
    for entry in doc["users"]:
        if not (
            isinstance(entry, list)
            and len(entry) == 4
            and isinstance(entry[0], str)
            and all(isinstance(x, int) for x in entry[1:3])
            and isinstance(entry[3], str)
        ):
            return "its users are not [name, uid, gid, home]"
    return None
