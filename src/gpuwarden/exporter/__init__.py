"""The Prometheus exporter (`gpuwarden exporter`), one module per part:

- `server`: the views read at most once per cache period and served over HTTP
  (services layer; prometheus-client is the `exporter` extra, imported only there
  and inside the families' functions);
- `metrics`: gpuwarden's own metric families for GPUs, processes, users, leases,
  drains and health, from one `metrics.View` (pure);
- `dcgm`: dcgm-exporter's names, units and labels for the same view (pure);
- `queue`: the queue service's metrics from its `stats` answer (pure);
- `counters`: the NVML counters only the exporter shows, read in the same NVML
  session as the snapshot when the exporter asks (machine layer).

This file imports nothing, so a pure family module loads neither the HTTP server
nor NVML.
"""
