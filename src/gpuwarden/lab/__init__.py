"""The lab as `gpuwarden top` and `gpuwarden mcp` see it: the GPUs and the queue read
once (`reading`), and why a waiting job waits, in words (`waiting`)."""
