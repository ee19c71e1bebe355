"""gpuwarden's GPUs for Jupyter kernels (docs/notebooks.md), one module per part:

- `kernelspec`: the kernelspec `gpuwarden kernel install` writes, which names the
  provisioner and the GPU request; needs no Jupyter installed;
- `provisioner`: the jupyter_client kernel provisioner (entry point `gpuwarden`)
  that leases each kernel's GPUs for its life; needs `jupyter_client`
  (`gpuwarden[jupyter]`).

This file imports nothing, so `kernel install` never imports jupyter_client.
"""
