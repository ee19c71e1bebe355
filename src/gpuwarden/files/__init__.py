"""The shared state directories and the files in them, read as hostile input:

- `locations`: where the lease directory and the state directory are;
- `paths`: safety checks for directories several users share;
- `safefiles`: reading and writing small state files others can write;
- `configfiles`: where the settings files are (read by `config`).

This file imports nothing, so each module costs only itself.
"""
