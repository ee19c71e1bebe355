"""The screen as a pure function: a reading of the lab and the view's state in, lines
of styled text out, exactly `width` columns by at most `height` rows.

Nothing here touches a terminal, so the whole layout is tested as text at 80×24 and
beyond, and the redraw's cost is measured alone (bench/top.py). Only the job rows
that fit are formatted, whatever the queue's length. The styles are names
(`STYLES`); `terminal` maps them to curses attributes, with colour or, under
`NO_COLOR`, without.

    title         host, time, who you are, GPUs free, jobs running and waiting
    GPU rows      one per GPU and MIG slice: load and memory bars, temperature,
                  power, health or drain, who holds it (leases) and runs on it
    bookings      the next 24 hours, one line per booking
    jobs          running, then waiting with reason and estimated start (arrays
                  folded); the selected row highlighted
    log           the selected job's output, when opened (l)
    message       the last action's outcome, or the question being asked
    keys          what the keys do
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from gpuwarden.base.units import format_span
from gpuwarden.files.safefiles import printable
from gpuwarden.lab.reading import Lab
from gpuwarden.top.model import State, gpu_rows, job_rows

Segment = tuple[str, str]
Line = list[Segment]
STYLES = ("normal", "title", "header", "selected", "dim", "good", "warn", "bad", "prompt")
KEYS = "c cancel h hold r release R requeue l log m mine / user s sort Tab ?help q quit"
HELP = [
    "Keys (every action asks first; y confirms, anything else takes it back):",
    "  Up/Down j/k PgUp/PgDn Home/End   move      Tab      between the GPUs and the jobs",
    "  c  cancel the selected job       h  hold it            r  release (unhold) it",
    "  R  requeue it (end it, then run it again)              l/Enter  follow its output",
    "  m  only my jobs     /  only one user's jobs     s  sort: queue, user, GPUs, waited",
    "  d  drain the selected GPU (admins)              D  undrain it (admins)",
    "  q  quit             Esc  close the log or this help",
    "The queue service decides: what you may not do, it refuses, and its reason is shown.",
]


def fit(text: str, width: int) -> str:
    """`text` cut or padded to exactly `width` columns."""
    if len(text) > width:
        return text[: max(0, width - 1)] + "~" if width > 0 else ""
    return text.ljust(width)


def bar(fraction: Optional[float], width: int) -> str:
    """`[####    ]`, `width` columns in all; `[  n/a   ]` when unknown."""
    inner = max(1, width - 2)
    if fraction is None:
        return "[" + "n/a".center(inner) + "]"
    full = round(max(0.0, min(1.0, fraction)) * inner)
    return "[" + "#" * full + " " * (inner - full) + "]"


def _level(fraction: Optional[float]) -> str:
    if fraction is None:
        return "dim"
    return "bad" if fraction >= 0.9 else "warn" if fraction >= 0.6 else "good"


def draw(
    labs: Sequence[Lab],
    state: State,
    width: int,
    height: int,
    now: Optional[float] = None,
) -> list[Line]:
    """The whole screen, at least 20×5 (smaller: one line saying so)."""
    if width < 20 or height < 5:
        return [[(fit("gpuwarden top: the terminal is too small", width), "bad")]]
    now = time.time() if now is None else now
    rows = job_rows(labs, state)
    gpus = gpu_rows(labs)
    lines: list[Line] = [[(fit(_title(labs, rows, now), width), "title")]]
    if not state.mine:
        lines += _mine(labs, width, now)
    if state.help:
        lines += [[(fit(h, width), "normal")] for h in HELP]
        return _finish(lines, state, width, height)
    # What is left once the title, the jobs' header, the message and the keys are placed:
    # the GPUs get up to half of it, the jobs the rest (at least three rows).
    room = height - 4
    gpu_room = max(1, min(_gpu_lines(gpus), room // 2))
    lines += _gpus(gpus, state, width, gpu_room)
    bookings = [b for lab in labs for b in lab.bookings]
    left = height - len(lines) - 3
    if bookings and left > 5:
        lines += _bookings(bookings, width, now, min(2, left - 4))
    lines += _services(labs, width)
    left = height - len(lines) - 3
    log_room = 0
    if state.log is not None and left >= 6:
        log_room = left // 2
    lines += _jobs(rows, state, width, left - log_room, now, any(r.get("host") for r in rows))
    if log_room:
        lines += _log(state, width, log_room)
    return _finish(lines, state, width, height)


def _finish(lines: list[Line], state: State, width: int, height: int) -> list[Line]:
    lines = lines[: height - 2]
    while len(lines) < height - 2:
        lines.append([(" " * width, "normal")])
    if state.prompt is not None:
        shown = state.prompt.question + (state.prompt.text or "")
        lines.append([(fit(printable(shown), width), "prompt")])
    else:
        lines.append(
            [(fit(printable(state.message), width), "warn" if state.message else "normal")]
        )
    lines.append([(fit(KEYS, width), "dim")])
    return lines


def _title(labs: Sequence[Lab], rows: Sequence[Mapping[str, Any]], now: float) -> str:
    hosts = ",".join(lab.host for lab in labs)
    who = next((lab.user for lab in labs if lab.user), None)
    admin = any(lab.admin for lab in labs)
    free = sum(1 for _, g in gpu_rows(labs) if _free(g))
    total = sum(len(lab.gpus) for lab in labs)
    # The rows read may be the queue's first screens only (model.wanted_rows): running
    # jobs come first, and the service counts the rest.
    running = sum(1 for r in rows if r.get("state") in ("RUNNING", "STARTING"))
    waiting = sum(1 for r in rows if r.get("state") == "PENDING")
    waiting += sum(max(0, lab.total - len(lab.jobs)) for lab in labs)
    parts = [f"gpuwarden top  {hosts}  {time.strftime('%H:%M:%S', time.localtime(now))}"]
    if who:
        parts.append(f"you: {who}{' (admin)' if admin else ''}")
    parts.append(f"GPUs free {free}/{total}")
    parts.append(f"jobs {running} running, {waiting} waiting")
    return printable("  ".join(parts))


def _mine(labs: Sequence[Lab], width: int, now: float) -> list[Line]:
    """One line of my jobs, whatever the list below shows: `mine: 12 running on 0,1
    (2h01m), 14 waiting (Resources, ~5m00s)`; none where I have none."""
    own = []
    for lab in labs:
        rows = (
            lab.mine
            if lab.mine is not None
            else [j for j in lab.jobs if lab.user and j.get("user") == lab.user]
        )
        own += rows
    if not own:
        return []
    said = []
    for job in own:
        label = str(job.get("label") or job.get("id"))
        if job.get("state") == "PENDING":
            start = job.get("estimated_start")
            when = (
                f", ~{format_span(max(0.0, start - now))}"
                if isinstance(start, (int, float))
                else ""
            )
            said.append(f"{label} waiting ({job.get('reason') or '-'}{when})")
        else:
            since = job.get("started")
            took = (
                f" ({format_span(max(0.0, now - since))})"
                if isinstance(since, (int, float))
                else ""
            )
            said.append(f"{label} running on {_gpus_cell(job)}{took}")
    return [[(fit(printable("mine: " + ", ".join(said)), width), "header")]]


def _free(g: Mapping[str, Any]) -> bool:
    return (
        not g.get("leases") and not g.get("processes") and not g.get("drain") and not g.get("lost")
    )


def _gpu_lines(gpus: Sequence[tuple[Optional[str], Mapping[str, Any]]]) -> int:
    return 1 + sum(1 + len(g.get("slices") or ()) for _, g in gpus)


def _gpus(
    gpus: Sequence[tuple[Optional[str], Mapping[str, Any]]], state: State, width: int, room: int
) -> list[Line]:
    several = any(h for h, _ in gpus)
    bw = bar_width(width)
    head = f"{'HOST ' if several else ''}GPU {'NAME':<10}{'UTIL':<{bw + 6}}{'MEMORY':<{bw + 9}}"
    head += " TEMP POWER HEALTH WHO"
    out: list[Line] = [[(fit(head, width), "header")]]
    body: list[tuple[int, Line]] = []
    for n, (host, g) in enumerate(gpus):
        chosen = state.focus == "gpus" and n == state.gpu_cursor
        body.append((n, _gpu_line(host, g, width, chosen, several)))
        for m in g.get("slices") or ():
            body.append((n, _slice_line(m, width, several)))
    room -= 1
    if len(body) > room:  # scroll so that the selected GPU stays in view
        first = next((i for i, (n, _) in enumerate(body) if n == state.gpu_cursor), 0)
        start = max(0, min(first - room // 2, len(body) - room))
        body = body[start : start + room]
    return out + [line for _, line in body]


def bar_width(width: int) -> int:
    """Columns of a load or memory bar: 8 at 80 columns, wider on a wide terminal."""
    return max(8, min(22, 8 + (width - 100) // 8))


def short_name(name: str) -> str:
    """`A100-SXM4-80GB` for `NVIDIA A100-SXM4-80GB`, `RTX 4090` for `NVIDIA GeForce RTX 4090`:
    the words that tell GPUs apart in nine columns."""
    for noise in ("NVIDIA ", "GeForce ", "Tesla "):
        name = name.replace(noise, "")
    return name.split("-")[0] if len(name) > 9 else name


def _gpu_line(
    host: Optional[str], g: Mapping[str, Any], width: int, chosen: bool, several: bool
) -> Line:
    util = g.get("utilization")
    total, used = g.get("memory_total"), g.get("memory_used")
    mem = used / total if isinstance(used, int) and isinstance(total, int) and total else None
    u = None if not isinstance(util, (int, float)) else util / 100.0
    name = short_name(str(g.get("name") or "?"))
    bw = bar_width(width)
    temp = g.get("temperature")
    power = g.get("power_draw")
    health, tone = _health(g)
    lead = f"{fit(printable(str(host)), 4)} " if several else ""
    first = f"{lead}{g.get('index')!s:>3} {fit(printable(name), 9)} "
    tail = (
        f" {'n/a' if temp is None else f'{temp:.0f}C':>4}"
        f" {'n/a' if power is None else f'{power:.0f}W':>5} {fit(health, 6)} "
    )
    who = _who(g)
    if chosen:
        text = (
            first
            + bar(u, bw)
            + f" {_pct(util)} "
            + bar(mem, bw)
            + f" {_mem(used, total)}"
            + tail
            + who
        )
        return [(fit(text, width), "selected")]
    line: Line = [
        (first, "normal"),
        (bar(u, bw), _level(u)),
        (f" {_pct(util)} ", "normal"),
        (bar(mem, bw), _level(mem)),
        (f" {_mem(used, total)}", "normal"),
        (tail[: len(tail) - len(fit(health, 6)) - 1], "normal"),
        (fit(health, 6), tone),
        (" ", "normal"),
    ]
    used_cols = sum(len(t) for t, _ in line)
    line.append((fit(who, max(0, width - used_cols)), "normal"))
    return _clip(line, width)


def _slice_line(m: Mapping[str, Any], width: int, several: bool) -> Line:
    total, used = m.get("memory_total"), m.get("memory_used")
    mem = used / total if isinstance(used, int) and isinstance(total, int) and total else None
    lead = " " * 5 if several else ""
    who = ", ".join(_lease(x) for x in m.get("leases") or ()) or "free"
    text = (
        f"{lead}  - MIG {m.get('index')} {fit(printable(str(m.get('profile') or '?')), 10)}"
        f"{' ' * (bar_width(width) - 2)}{bar(mem, bar_width(width))} {_mem(used, total)}  "
        f"{printable(who)}"
    )
    return [(fit(text, width), "dim")]


def _health(g: Mapping[str, Any]) -> tuple[str, str]:
    if g.get("lost") or g.get("error"):
        return "LOST", "bad"
    if g.get("drain"):
        return "DRAIN", "bad"
    level = (g.get("health") or {}).get("level") or "ok"
    return {"ok": ("ok", "good"), "warning": ("WARN", "warn")}.get(level, ("FATAL", "bad"))


def _lease(x: Mapping[str, Any]) -> str:
    job = x.get("job")
    return f"{x.get('user')}:{job}" if job is not None else str(x.get("user"))


def _who(g: Mapping[str, Any]) -> str:
    """Leases, then processes outside them (`user:prog!` marks use under no lease)."""
    parts = [_lease(x) for x in g.get("leases") or ()]
    for p in g.get("processes") or ():
        mark = "" if p.get("reserved") else "!"
        parts.append(f"{p.get('user') or '?'}({p.get('name') or p.get('pid')}){mark}")
    if g.get("drain"):
        parts.append(f"drained: {(g.get('drain') or {}).get('reason')}")
    return printable(", ".join(parts) or "free")


def _pct(util: Any) -> str:
    return " n/a" if not isinstance(util, (int, float)) else f"{util:3.0f}%"


def _mem(used: Any, total: Any) -> str:
    if not isinstance(used, int) or not isinstance(total, int):
        return fit("n/a", 8)
    return fit(f"{used / 2**30:.0f}/{total / 2**30:.0f}G", 8)


def _clip(line: Line, width: int) -> Line:
    out: Line = []
    left = width
    for text, style in line:
        if left <= 0:
            break
        out.append((text[:left], style))
        left -= len(text[:left])
    if left > 0:
        out.append((" " * left, "normal"))
    return out


def _bookings(rows: Sequence[Mapping[str, Any]], width: int, now: float, room: int) -> list[Line]:
    """A line per booking over the next 24 hours: `#` while booked."""
    slots = max(8, min(48, width - 50))
    step = 86400.0 / slots
    out: list[Line] = []
    for r in sorted(rows, key=lambda r: float(r.get("start") or 0))[:room]:
        start, end = float(r.get("start") or 0), float(r.get("end") or 0)
        cells = "".join(
            "#" if start < now + (i + 1) * step and now + i * step < end else "."
            for i in range(slots)
        )
        whom = r.get("user") or f"@{r.get('group')}"
        when = "now" if start <= now else f"in {format_span(start - now)}"
        length = format_span(end - max(start, now))
        text = f"booked [{cells}] {r.get('count')} GPUs for {whom} ({when}, {length})"
        out.append([(fit(printable(text), width), "dim")])
    return out


def _services(labs: Sequence[Lab], width: int) -> list[Line]:
    """One line per host whose queue or GPUs could not be read."""
    out: list[Line] = []
    for lab in labs:
        for why in (lab.service, lab.error):
            if why:
                where = f"{lab.host}: " if len(labs) > 1 else ""
                out.append([(fit(printable(where + why), width), "warn")])
    return out


def _jobs(
    rows: Sequence[Mapping[str, Any]],
    state: State,
    width: int,
    room: int,
    now: float,
    hosts: bool,
) -> list[Line]:
    lead = "HOST " if hosts else ""
    head = f"{lead}{'JOB':<12} {'USER':<10} {'STATE':<8} {'GPUS':<5} {'TIME':>7} "
    head += f"{'REASON / START':<24} COMMAND"
    out: list[Line] = [[(fit(head, width), "header")]]
    room = max(1, room - 1)
    if not rows:
        out.append([(fit("  no jobs queued or running" + _filters(state), width), "dim")])
        return out
    state.cursor = max(0, min(state.cursor, len(rows) - 1))
    if state.cursor < state.offset:
        state.offset = state.cursor
    elif state.cursor >= state.offset + room:
        state.offset = state.cursor - room + 1
    state.offset = max(0, min(state.offset, max(0, len(rows) - room)))
    for n in range(state.offset, min(len(rows), state.offset + room)):
        job = rows[n]
        text = _job_text(job, now, hosts)
        chosen = state.focus == "jobs" and n == state.cursor
        style = "selected" if chosen else ("normal" if job.get("mine") else "dim")
        if (
            not chosen
            and job.get("state") == "PENDING"
            and job.get("reason") == "DependencyNeverSatisfied"
        ):
            style = "bad"
        out.append([(fit(text, width), style)])
    return out


def _filters(state: State) -> str:
    said = []
    if state.mine:
        said.append("only mine (m)")
    if state.user:
        said.append(f"only {state.user} (/)")
    return f" [{', '.join(said)}]" if said else ""


def _job_text(job: Mapping[str, Any], now: float, hosts: bool) -> str:
    pending = job.get("state") == "PENDING"
    label = str(job.get("label") or job.get("id"))
    if pending:
        since = job.get("submitted")
        reason = str(job.get("reason") or "-")
        start = job.get("estimated_start")
        if isinstance(start, (int, float)):
            reason += f" ~{format_span(max(0.0, start - now))}"
    else:
        since = job.get("started")
        reason = ""
        limit = job.get("time_limit")
        if isinstance(limit, (int, float)) and isinstance(since, (int, float)):
            reason = f"ends in {format_span(max(0.0, since + limit - now))}"
    waited = format_span(max(0.0, now - since)) if isinstance(since, (int, float)) else "-"
    words = job.get("command")
    command = " ".join(str(w) for w in words) if isinstance(words, list) else "(hidden)"
    state = str(job.get("state"))
    if job.get("held"):
        state = "HELD"
    lead = f"{fit(str(job.get('host')), 4)} " if hosts else ""
    return printable(
        f"{lead}{fit(label, 12)} {fit(str(job.get('user')), 10)} {fit(state, 8)} "
        f"{fit(_gpus_cell(job), 5)} {waited:>7} {fit(reason, 24)} {command}"
    )


def _gpus_cell(job: Mapping[str, Any]) -> str:
    """The GPUs a job holds (indices), or how many it waits for, as `queue` shows them."""
    held = job.get("indices") or []
    if held:
        return ",".join("?" if i is None else str(i) for i in held)
    return f"({job.get('count') or 0}{'s' if job.get('mem') else ''})"


def _log(state: State, width: int, room: int) -> list[Line]:
    host, job = state.log or (None, "?")
    where = f" on {host}" if host else ""
    out: list[Line] = [[(fit(f"output of job {job}{where} (l or Esc closes)", width), "header")]]
    lines = state.log_lines[-(room - 1) :] if room > 1 else []
    out += [[(fit(line, width), "normal")] for line in lines]
    return out
