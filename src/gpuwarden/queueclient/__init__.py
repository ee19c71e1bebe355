"""The queue service's client side: what runs in a user's process to talk to
`gpuwarden serve` (docs/service.md).

`protocol` is the wire format both sides speak; `client` sends one request and reads
its answer (and keeps an attached job's terminal); `holding` is `gpuwarden.lease()`
through the service; `probe` asks whether a service answers. The daemon
(`gpuwarden.service`) imports `protocol` from here; only the checks of a submit's
fields, which the daemon runs, borrow `service.spawn.argv_of` and `service.jobnotify`
(both in this layer), so a client's start-up loads nothing of the daemon.
"""
