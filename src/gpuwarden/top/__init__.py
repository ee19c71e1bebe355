"""`gpuwarden top`: a full-screen view of the GPUs and the queue that acts on jobs.

`model` is the view's state and what each key does to it (pure); `screen` draws a
reading of the lab (`gpuwarden.lab`) and that state as lines of styled text (pure,
tested without a terminal); `acting` carries out a confirmed action through the queue
service as the user, so every refusal is the service's; `terminal` is the thin curses
loop that reads keys, refreshes and paints the lines.
"""
