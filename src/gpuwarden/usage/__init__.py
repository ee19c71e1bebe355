"""How GPUs were used, judged as pure functions over samples and runs:

- `report`: usage summed by who and when (`gpuwarden report`);
- `efficiency`: how well a job used what it held (`gpuwarden eff`);
- `digest`: the week's digest for each user and for the admins;
- `enforcement`: the policies on over-use, idle holds and unleased use.

This file imports nothing, so each module costs only itself.
"""
