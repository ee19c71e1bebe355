"""Several machines seen as one: each host's own `gpuwarden ... --json` run over the
user's SSH (`remote`), and the replies merged into one view (`merge`, pure).

Nothing new runs on a host: ssh starts the same command a user would type there, as
that user, and a host that does not answer in time is reported, never waited for.
"""
