"""A GPU's health (docs/health.md), one module per part:

- `judgement`: judging a GPU from a snapshot and the XIDs seen on it, the rules
  an admin tunes (`health.*`) and NVIDIA's actions in words (policy layer, pure);
- `xids`: NVIDIA's Xid catalogue as data, loaded only when an XID is described
  (policy layer, pure);
- `xidlog`: the XID log on disk, and whose lines are believed (state layer);
- `watch`: the health watch, which hears XIDs from NVML, polls the rest, drains
  and alerts (orchestration layer).

This file imports nothing, so judging a GPU loads neither the XID log nor the
watch's threads, and `status` never loads the catalogue for a healthy machine.
"""
