"""The per-machine queue service (`gpuwarden serve`): one privileged process that owns
the queue, the leases and the decisions on a shared server, so that no user can block
or forge another's (docs/service.md).

Layer: above `scheduling`, `leases`, `selection` and `inventory`, which it calls;
below `cli`, whose commands talk to it through `gpuwarden.queueclient` (the client
side, and the wire format this package reads). Nothing outside this package imports
the daemon's modules, except the CLI.
"""
