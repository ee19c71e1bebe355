"""The queue service's client side: what runs in a user's process to talk to
`gpuwarden serve` (docs/service.md).

`protocol` is the wire format both sides speak; `client` sends one request and reads
its answer (and keeps an attached job's terminal); `holding` is `gpuwarden.lease()`
through the service; `probe` asks whether a service answers. Nothing here imports the
daemon (`gpuwarden.service`), which imports `protocol` from here.
"""
