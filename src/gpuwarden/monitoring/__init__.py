"""Watching the machine and telling people, one command or thread each:

- `machineview`: what `status`, the exporter and the web page show, read once;
- `sampling`: recording samples to CSV, and `plot`: drawing a recording;
- `enforcer`: the watcher that applies `usage.enforcement`'s policies;
- `alerts`: hook commands and webhooks, off the caller's thread.

This file imports nothing, so each module costs only itself.
"""
