"""The vocabulary every layer shares, below everything else of gpuwarden:

- `errors`: `UserError`, the one exception printed as a single line;
- `records`: `@record`, frozen dataclasses whose methods are shared;
- `lazyimport`: `dataclasses` without what it loads and gpuwarden never uses;
- `units`: sizes, durations and addresses as people type them;
- `table`: plain-text tables for terminals;
- `checked`: type and range checks of JSON values another process wrote.

This file imports nothing, so each module costs only itself.
"""
