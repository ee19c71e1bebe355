"""The curses loop: the only part of `top` that touches the terminal.

It reads the lab every `interval` seconds (and right after an action), waits for a
key in between (no busy loop: `getch` blocks until a key or the next reading is due),
and paints `screen.draw`'s lines. Only the keyboard is read (no mouse), colour is
used only where the terminal has it and `NO_COLOR` is unset, and a resize redraws at
the new size. The reading runs on this thread: a refresh costs milliseconds locally
(over ssh with `--hosts`, the interval is what the hosts can bear).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from gpuwarden.lab.reading import Lab
from gpuwarden.top.model import Action, State, press
from gpuwarden.top.screen import STYLES, draw

NAMES = {
    "KEY_UP": "up",
    "KEY_DOWN": "down",
    "KEY_PPAGE": "pgup",
    "KEY_NPAGE": "pgdn",
    "KEY_HOME": "home",
    "KEY_END": "end",
    "KEY_BACKSPACE": "backspace",
    "KEY_ENTER": "enter",
    "\n": "enter",
    "\r": "enter",
    "\t": "tab",
    "\x1b": "esc",
    "\x7f": "backspace",
    "\x08": "backspace",
}


def attributes(curses: Any, color: bool) -> dict[str, int]:
    """Each style's curses attribute: bold, reverse and dim always; colour only if asked."""
    plain = {
        "normal": curses.A_NORMAL,
        "title": curses.A_REVERSE | curses.A_BOLD,
        "header": curses.A_BOLD | curses.A_UNDERLINE,
        "selected": curses.A_REVERSE,
        "dim": curses.A_NORMAL,
        "good": curses.A_NORMAL,
        "warn": curses.A_BOLD,
        "bad": curses.A_BOLD,
        "prompt": curses.A_BOLD | curses.A_REVERSE,
    }
    if not color:
        return plain
    for n, fg in enumerate((curses.COLOR_GREEN, curses.COLOR_YELLOW, curses.COLOR_RED), 1):
        curses.init_pair(n, fg, -1)
    plain["good"] = curses.color_pair(1)
    plain["warn"] = curses.color_pair(2) | curses.A_BOLD
    plain["bad"] = curses.color_pair(3) | curses.A_BOLD
    plain["dim"] = curses.A_DIM
    return plain


def run(
    read: Callable[[State, int], Sequence[Lab]],
    act: Callable[[Action], str],
    log_tail: Callable[[Optional[str], str, int], list[str]],
    interval: float,
    state: Optional[State] = None,
) -> None:
    """Show the lab until `q`. `read(state, rows)` gives the labs now for a view of
    `rows` job rows (see `model.wanted_rows`), `act` carries out a confirmed
    action and says what came of it, `log_tail(host, job, lines)` a job's last lines."""
    import curses

    def main(window: Any) -> None:
        color = False
        if "NO_COLOR" not in os.environ and curses.has_colors():
            curses.start_color()
            curses.use_default_colors()
            color = True
        styles = attributes(curses, color)
        assert set(styles) == set(STYLES)
        _can_hide_cursor(curses)
        window.keypad(True)
        view = state or State()
        labs = read(view, window.getmaxyx()[0])
        asked = _asked(view, window.getmaxyx()[0])
        due = time.monotonic() + interval
        while not view.quit:
            height, width = window.getmaxyx()
            paint(window, draw(labs, view, width, height), styles)
            window.timeout(max(50, int((due - time.monotonic()) * 1000)))
            key = _key(window, curses)
            if key == "resize":
                curses.update_lines_cols()
                continue
            if key is not None:
                action = press(view, key, labs, page=max(1, height - 14))
                if action is not None:
                    view.message = act(action)
                    due = 0.0  # read again at once: the action's effect is what to see
                elif _beyond(view, labs, height, asked):
                    due = 0.0  # moved past the rows read: read down to there now
            if time.monotonic() >= due:
                labs = read(view, height)
                asked = _asked(view, height)
                if view.log is not None:
                    view.log_lines = log_tail(view.log[0], view.log[1], 200)
                due = time.monotonic() + interval

    curses.wrapper(main)


def _beyond(view: State, labs: Sequence[Lab], height: int, asked: tuple[Any, ...]) -> bool:
    """Whether the view now needs what the last reading did not ask for: another filter,
    order or log, or rows below those read."""
    from gpuwarden.top.model import wanted_rows

    if (view.mine, view.user, view.sort, view.log) != asked[:4]:
        return True
    want = wanted_rows(view, height)
    more = any(lab.total > len(lab.jobs) for lab in labs)
    return more and want is not None and asked[4] is not None and want > asked[4]


def _asked(view: State, height: int) -> tuple[Any, ...]:
    from gpuwarden.top.model import wanted_rows

    return (view.mine, view.user, view.sort, view.log, wanted_rows(view, height))


def _can_hide_cursor(curses: Any) -> bool:
    try:
        curses.curs_set(0)
    except curses.error:
        return False
    return True


def _key(window: Any, curses: Any) -> Optional[str]:
    try:
        code = window.get_wch()
    except curses.error:  # the timeout: no key
        return None
    if code == curses.KEY_RESIZE:
        return "resize"
    if isinstance(code, int):
        name = curses.keyname(code).decode("ascii", "replace")
        return NAMES.get(name, name)
    return NAMES.get(code, code)


def paint(window: Any, lines: Sequence[Sequence[tuple[str, str]]], styles: dict[str, int]) -> None:
    """Write the lines; the bottom-right cell is left alone (writing it scrolls some
    terminals, and curses reports an error for it)."""
    import curses

    window.erase()
    height, width = window.getmaxyx()
    for y, line in enumerate(lines[:height]):
        x = 0
        for text, style in line:
            room = width - x - (1 if y == height - 1 else 0)
            if room <= 0:
                break
            with contextlib.suppress(curses.error):
                window.addstr(y, x, text[:room], styles.get(style, 0))
            x += len(text[:room])
    window.refresh()
