"""`gpuwarden web`: a live, read-only page of the machine for everyone in the lab.

`model` builds the API document (pure), `history` keeps the last hour of
samples, `server` serves the page, its assets (`static/`, package data) and the
JSON API (`/api/v1/state`, `/api/v1/events`, `/api/v1/schema`). See docs/web.md.
"""
