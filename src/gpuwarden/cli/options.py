"""A command's options, read without argparse when the command line is plain.

`gpuwarden run` parses a handful of options before every training job starts,
and argparse (with the gettext and locale modules it loads, and the parser it
builds) costs ~4 ms of that before it has read one argument. So commands declare
their options once, through the part of argparse's API that `Options` offers
(`add_argument`, `add_argument_group`, `usage`, `epilog`), and `Options.parse`
reads a plain command line itself: exact option names, values after them or
after `=`, `-gN`, on/off flags, options whose value may be left out (`nargs="?"`), one
optional positional or a trailing `argparse.REMAINDER`.

Anything else — `--help`, a mistake, an abbreviated option, a value that looks
like an option, a type or choice that does not fit — goes to a real argparse
parser built from the same declarations, so help, errors and every corner of
argparse's grammar are argparse's own. A declaration the fast reader does not
know (another action, nargs, `required`) sends the whole command to argparse;
a call outside this API raises `NeedsArgparse`, and the caller declares the
command on an `argparse.ArgumentParser` instead. tests/test_options.py checks
that both readers agree on generated command lines.
"""

from __future__ import annotations

from types import SimpleNamespace

TYPE_CHECKING = False  # typing costs ~2.5 ms to import; annotations need it only here
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any, Optional, Union

    # What a command's add_arguments() is given: Options, or a real parser when the
    # command declares more than Options reads (see NeedsArgparse).
    Parser = Union["Options", argparse.ArgumentParser]
    Group = Union["_Group", "argparse._ArgumentGroup"]

REMAINDER = "..."  # argparse.REMAINDER's value: the rest of the line, as written

# What the fast reader understands of add_argument's keywords and actions.
_KEYWORDS = frozenset(
    {"action", "type", "default", "const", "metavar", "help", "dest", "nargs", "choices"}
)
_ACTIONS = frozenset({None, "store", "store_true"})


class NeedsArgparse(AttributeError):
    """The command uses argparse beyond `Options`: declare it on a real parser. (An
    AttributeError, so that `hasattr` and other probes see a missing attribute.)"""


class Namespace(SimpleNamespace):
    """The parsed options, behaving as argparse.Namespace does (attributes, `in`)."""

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__


class _Declared:
    """One add_argument call, as given and as the fast reader sees it."""

    __slots__ = ("dest", "flags", "group", "kwargs", "positional", "takes_value")

    def __init__(self, flags: tuple[str, ...], kwargs: dict[str, Any], group: Optional[int]):
        self.flags = flags
        self.kwargs = kwargs
        self.group = group
        self.positional = not flags[0].startswith("-")
        self.takes_value = kwargs.get("action") in (None, "store")
        if "dest" in kwargs:
            self.dest = kwargs["dest"]
        elif self.positional:
            self.dest = flags[0]
        else:
            name = next((f for f in flags if f.startswith("--")), flags[0])
            self.dest = name.lstrip("-").replace("-", "_")

    def default(self) -> Any:
        if self.kwargs.get("nargs") == REMAINDER:
            return self.kwargs.get("default", [])
        if "default" in self.kwargs:
            return self.kwargs["default"]
        return False if self.kwargs.get("action") == "store_true" else None


class _Group:
    def __init__(self, options: Options, number: int) -> None:
        self._options = options
        self._number = number

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        self._options._declare(flags, kwargs, self._number)

    def __getattr__(self, name: str) -> Any:
        raise NeedsArgparse(name)


class Options:
    """A command's declared options; `parse()` reads a command line against them."""

    def __init__(self, prog: str, description: Optional[str] = None) -> None:
        self.prog = prog
        self.description = description
        self.usage: Optional[str] = None
        self.epilog: Optional[str] = None
        self._declared: list[_Declared] = []
        self._groups: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._fast = True

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        self._declare(flags, kwargs, None)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> _Group:
        self._groups.append((args, kwargs))
        return _Group(self, len(self._groups) - 1)

    def __getattr__(self, name: str) -> Any:  # subparsers, exclusive groups, defaults...
        raise NeedsArgparse(name)

    def _declare(
        self, flags: tuple[str, ...], kwargs: dict[str, Any], group: Optional[int]
    ) -> None:
        declared = _Declared(flags, kwargs, group)
        self._declared.append(declared)
        if not kwargs.keys() <= _KEYWORDS or kwargs.get("action") not in _ACTIONS:
            self._fast = False
        elif declared.positional:
            positionals = [d for d in self._declared if d.positional]
            if len(positionals) > 1 or kwargs.get("nargs") not in (None, "?", REMAINDER):
                self._fast = False
        elif kwargs.get("nargs") not in (None, "?"):
            self._fast = False

    def argparser(self) -> argparse.ArgumentParser:
        """The same declarations on a real argparse parser."""
        import argparse

        parser = argparse.ArgumentParser(
            prog=self.prog,
            description=self.description,
            usage=self.usage,
            epilog=self.epilog,
            formatter_class=formatter(),
        )
        groups = [parser.add_argument_group(*args, **kwargs) for args, kwargs in self._groups]
        for declared in self._declared:
            target = parser if declared.group is None else groups[declared.group]
            target.add_argument(*declared.flags, **declared.kwargs)
        return parser

    def parse(self, argv: Sequence[str]) -> Any:
        """The options of `argv` (argparse's exits for help and errors included)."""
        fast = self.read(argv) if self._fast else None
        return fast if fast is not None else self.argparser().parse_args(list(argv))

    def read(self, argv: Sequence[str]) -> Optional[Namespace]:
        """The fast reader: the Namespace argparse would return, or None to let argparse
        answer (it either reads the line some other way or explains what is wrong)."""
        if not self._fast:
            return None
        flags = {flag: d for d in self._declared if not d.positional for flag in d.flags}
        positional = next((d for d in self._declared if d.positional), None)
        given: dict[str, Any] = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg == "--" or arg == "-" or not arg.startswith("-"):
                if positional is None or positional.dest in given:
                    return None  # argparse: "unrecognized arguments"
                if positional.kwargs.get("nargs") == REMAINDER:
                    if any(_ambiguous(rest, flags) for rest in _before_dashes(argv[i:])):
                        return None  # argparse refuses these even inside the command
                    given[positional.dest] = list(argv[i:])
                    break
                if arg == "--":
                    return None
                value = _convert(positional, arg, check=True)
                if value is _INVALID:
                    return None
                given[positional.dest] = value
                i += 1
                continue
            if arg.startswith("--"):
                name, eq, value = arg.partition("=")
                attached = value if eq else None
            else:
                name, attached = arg[:2], (arg[2:] or None)
                if attached is not None and "=" in attached:
                    return None
            declared = flags.get(name)
            if declared is None:
                return None
            if not declared.takes_value:
                if attached is not None:
                    return None
                given[declared.dest] = True
                i += 1
                continue
            if attached is None:
                following = argv[i + 1] if i + 1 < len(argv) else None
                alone = following is None or following == "--" or following in flags
                if declared.kwargs.get("nargs") == "?" and alone:
                    given[declared.dest] = declared.kwargs.get("const")  # `--watch` alone
                    i += 1
                    continue
                if following is None or following.startswith("-"):
                    return None
                attached = following
                i += 1
            value = _convert(declared, attached, check=True)
            if value is _INVALID:
                return None
            given[declared.dest] = value
            i += 1
        result = Namespace()
        for declared in self._declared:
            if declared.dest in given:
                setattr(result, declared.dest, given[declared.dest])
                continue
            if declared.positional and declared.kwargs.get("nargs") is None:
                return None  # a required positional is missing
            value = declared.default()
            if isinstance(value, str) and declared.takes_value:
                # argparse converts a string default, and checks its choice only for
                # a positional
                value = _convert(declared, value, check=declared.positional)
                if value is _INVALID:
                    return None
            if not hasattr(result, declared.dest):
                setattr(result, declared.dest, value)
        return result


_INVALID = object()


def _before_dashes(args: Sequence[str]) -> Sequence[str]:
    return args[: args.index("--")] if "--" in args else args


def _ambiguous(arg: str, flags: dict[str, _Declared]) -> bool:
    """Whether argparse, sorting every word into option or not before it reads any,
    finds `arg` an abbreviation of more than one option (an error wherever it is)."""
    if not arg.startswith("-") or arg in flags or len(arg) < 2:
        return False
    head = arg.partition("=")[0]
    if head in flags:
        return False
    if arg.startswith("--"):
        return sum(flag.startswith(head) for flag in flags) > 1
    return sum(flag == arg[:2] or flag.startswith(arg) for flag in flags) > 1


def _convert(declared: _Declared, text: str, check: bool) -> Any:
    """`text` through the declared type (and choices when `check`), or _INVALID."""
    convert = declared.kwargs.get("type")
    value: Any = text
    if convert is not None:
        try:
            value = convert(text)
        except (TypeError, ValueError):
            return _INVALID
    choices = declared.kwargs.get("choices")
    if check and choices is not None and value not in choices:
        return _INVALID
    return value


def formatter() -> type[argparse.HelpFormatter]:
    """argparse's help formatter, told the terminal's width: left to find it itself,
    it imports shutil (~2 ms, with its compression modules) for every argument."""
    import argparse

    from gpuwarden.table import columns

    class Formatter(argparse.HelpFormatter):
        def __init__(
            self,
            prog: str,
            indent_increment: int = 2,
            max_help_position: int = 24,
            width: Optional[int] = None,
        ) -> None:
            width = columns() - 2 if width is None else width
            super().__init__(prog, indent_increment, max_help_position, width)

    return Formatter
