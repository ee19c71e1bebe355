"""`gpuwarden mcp`: the answers of `status`, `queue`, `logs` and `run --dry-run` for
coding assistants, over the Model Context Protocol (docs/mcp.md).

`answers` holds what each tool says, as plain data, from the lab's reading
(`gpuwarden.lab`) and the queue service asked as the user; `previews` the rule that a
submit is previewed first and sent only with the preview's token; `server` wires them
to the official `mcp` SDK, the only module that imports it.
"""
