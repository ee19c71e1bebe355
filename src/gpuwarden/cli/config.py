"""`gpuwarden config`: every effective setting and the layer it came from."""

from __future__ import annotations

import json

TYPE_CHECKING = False  # argparse is read only by type checkers here
if TYPE_CHECKING:
    import argparse

    from gpuwarden.cli import Commands


def register(commands: Commands, name: str) -> None:
    from gpuwarden.cli import subcommand

    parser = subcommand(commands, name)
    parser.add_argument("key", nargs="?", help="show only this setting (e.g. run.min_free)")
    parser.add_argument("--json", action="store_true", help="print JSON: {key: {value, source}}")
    parser.add_argument(
        "--keys", action="store_true", help="list every setting: type, default, variable, meaning"
    )


def run(args: argparse.Namespace) -> int:
    from gpuwarden import config
    from gpuwarden.base.errors import UserError
    from gpuwarden.config import keys as configkeys
    from gpuwarden.files import locations

    names = max(len(key.name) for key in configkeys.SCHEMA)
    if args.keys:
        for key in configkeys.SCHEMA:
            default = configkeys.format_value(key.default, key.name)
            print(
                f"{key.name:<{names}} {key.expected():<34} {default:<16} {','.join(key.env_names)}"
            )
            print(f"{'':<{names}} {key.doc}")
        return 0
    cfg = config.load()
    rows = list(cfg.items())
    if args.key:
        if args.key not in configkeys.KEYS:
            raise UserError(f"unknown setting {args.key!r} (see `gpuwarden config --keys`)")
        rows = [r for r in rows if r[0] == args.key]
    if args.json:
        data = {
            k: {"value": list(v) if isinstance(v, tuple) else v, "source": s} for k, v, s in rows
        }
        print(json.dumps(data, indent=2))
        return 0
    width = max(len(configkeys.format_value(v, k)) for k, v, _ in rows)
    for key, value, source in rows:
        print(f"{key:<{names}} {configkeys.format_value(value, key):<{width}}  {source}")
    if not args.key:
        read = ", ".join(f"{layer}: {path}" for layer, path in cfg.files) or "none"
        print(f"\nfiles read: {read}")
        for layer, path, why in cfg.refused:
            print(f"file refused: {layer}: {path}: {why}")
        print(f"lease directory: {locations.lease_location(cfg)}")
        print(f"state directory: {locations.state_location(cfg)}")
    return 0
