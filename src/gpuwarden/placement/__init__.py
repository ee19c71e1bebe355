"""Which GPUs a request gets, as pure functions over a snapshot:

- `request`: `Request`, the one request type every face builds;
- `requestwire`: a `Request` to and from JSON, the one conversion each way (the
  queue's wire and journal, the wait line's tickets);
- `selection`: filters, then ranking (`choose`);
- `refusals`: why GPUs are passed over, in words;
- `mig`: MIG devices as units of placement;
- `visible`: `CUDA_VISIBLE_DEVICES` read the way the CUDA driver reads it.

This file imports nothing, so each module costs only itself.
"""
