"""Draw a recording: utilization and memory per GPU over time, leases and drains marked.

One row of axes per GPU (small multiples share the time axis, so "which GPU
was busy when" reads straight down the page). Utilization is a line, memory
in use a filled area on the same 0-100% scale, leased stretches are shaded
and labelled with the user, drained stretches hatched red.

matplotlib is the optional `plot` extra, imported here only, with the Agg
backend: no display needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Optional

from gpuwarden.base.errors import UserError


def _float(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def series(rows: Sequence[dict[str, str]]) -> dict[int, dict[str, list]]:
    """Per-GPU columns from a recording (pure): t, util, mem_pct, lease, drained."""
    out: dict[int, dict[str, list]] = {}
    for row in rows:
        try:
            gpu = int(row["gpu"])
            t = float(row["epoch"])
        except (KeyError, TypeError, ValueError):
            continue
        s = out.setdefault(
            gpu,
            {"t": [], "util": [], "mem": [], "lease": [], "drained": [], "model": row.get("model")},
        )
        used, total = _float(row.get("fb_used_mib", "")), _float(row.get("fb_total_mib", ""))
        s["t"].append(t)
        s["util"].append(_float(row.get("sm_pct", "")))
        s["mem"].append(used / total * 100 if used is not None and total else None)
        s["lease"].append(row.get("lease_users", "") or "")
        s["drained"].append(row.get("drained", "") or "")
    for s in out.values():
        order = sorted(range(len(s["t"])), key=s["t"].__getitem__)
        for key in ("t", "util", "mem", "lease", "drained"):
            s[key] = [s[key][i] for i in order]
    return dict(sorted(out.items()))


def spans(times: Sequence[float], labels: Sequence[str]) -> list[tuple[float, float, str]]:
    """Stretches where `labels` stay the same non-empty value (pure)."""
    result: list[tuple[float, float, str]] = []
    start: Optional[float] = None
    current = ""
    for i, (t, label) in enumerate(zip(times, labels)):
        if label != current:
            if current and start is not None:
                result.append((start, t, current))
            start, current = t, label
        if i == len(times) - 1 and current and start is not None:
            result.append((start, t, current))
    return result


def plot(rows: Sequence[dict[str, str]], out: str, title: Optional[str] = None) -> str:
    """Write the picture to `out` (format from its suffix); returns `out`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plot needs matplotlib: pip install 'gpuwarden[plot]'") from None
    data = series(rows)
    if not data:
        raise UserError("the recording has no samples to draw")
    n = len(data)
    fig, axes = plt.subplots(
        n, 1, sharex=True, figsize=(11, 1.25 + 1.45 * n), squeeze=False, constrained_layout=True
    )
    lease_label = drain_label = False
    models = {s.get("model") or "" for s in data.values()}
    for ax, (gpu, s) in zip(axes[:, 0], data.items()):
        t = [datetime.fromtimestamp(x) for x in s["t"]]
        mem = [float("nan") if v is None else v for v in s["mem"]]
        util = [float("nan") if v is None else v for v in s["util"]]
        for start, end, who in spans(s["t"], s["lease"]):
            ax.axvspan(
                datetime.fromtimestamp(start),
                datetime.fromtimestamp(end),
                color="#4c72b0",
                alpha=0.12,
                label=None if lease_label else "leased",
            )
            lease_label = True
            ax.text(
                datetime.fromtimestamp(start),
                97,
                f" {who}",
                va="top",
                ha="left",
                fontsize=7,
                color="#2b4a80",
                clip_on=True,
            )
        for start, end, why in spans(s["t"], s["drained"]):
            ax.axvspan(
                datetime.fromtimestamp(start),
                datetime.fromtimestamp(end),
                facecolor="none",
                edgecolor="#c44e52",
                hatch="///",
                linewidth=0,
                label=None if drain_label else "drained",
            )
            drain_label = True
            ax.text(
                datetime.fromtimestamp(start),
                80,
                f" drained: {why[:60]}",
                va="top",
                ha="left",
                fontsize=7,
                color="#c44e52",
                clip_on=True,
            )
        ax.fill_between(t, mem, step="post", color="#55a868", alpha=0.35, label="memory used")
        ax.step(t, util, where="post", color="#dd8452", linewidth=1.2, label="utilization")
        ax.set_ylim(0, 100)
        ax.set_yticks([0, 50, 100])
        label = f"GPU {gpu}" if len(models) == 1 else f"GPU {gpu}\n{_short_model(s['model'])}"
        ax.set_ylabel(f"{label}\n%", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    heading = title or "GPU utilization and memory" + (
        f" ({next(iter(models))})" if len(models) == 1 and next(iter(models)) else ""
    )
    axes[0, 0].set_title(heading, fontsize=10, loc="left")
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    axes[0, 0].legend(
        handles,
        labels,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=len(labels),
        fontsize=7,
        frameon=False,
    )
    axes[-1, 0].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    try:
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot write {out}: {getattr(err, 'strerror', None) or err}") from None
    finally:
        plt.close(fig)
    return out


def _short_model(name: object) -> str:
    return str(name or "").replace("NVIDIA ", "")[:18]


def plot_files(paths: Sequence[str], out: str, title: Optional[str] = None) -> str:
    from gpuwarden.monitoring.sampling import read_csv

    rows: list[Any] = []
    for path in paths:
        rows.extend(read_csv(path))
    return plot(rows, out, title)
