"""The server's own memory of the last hour: per-GPU utilization and temperature.

Every sample the server takes goes into fixed-width time buckets (mean
utilization, highest temperature), and only the last `span` seconds of buckets
are kept, so memory is bounded (`points` buckets per GPU) and a page receives a
short series for its sparkline rather than an hour of raw samples.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from gpuwarden.machine.inventory import Snapshot


class _Bucket:
    __slots__ = ("start", "temp", "util_n", "util_sum")

    def __init__(self, start: float) -> None:
        self.start = start
        self.util_sum = 0.0
        self.util_n = 0
        self.temp: Optional[int] = None


class History:
    """Bounded per-GPU series; `add` each snapshot, `series()` for the API."""

    def __init__(self, span: float = 3600.0, points: int = 180) -> None:
        if span <= 0 or points <= 0:
            raise ValueError("span and points must be positive")
        self.width = span / points
        self._buckets: dict[str, deque[_Bucket]] = {}
        self._points = points
        self.span = span
        self._latest = float("-inf")

    def add(self, snapshot: Snapshot) -> None:
        start = snapshot.taken_at - snapshot.taken_at % self.width
        self._latest = max(self._latest, start)
        for g in snapshot.gpus:
            line = self._buckets.get(g.uuid)
            if line is None:
                line = self._buckets[g.uuid] = deque(maxlen=self._points)
            if not line or line[-1].start < start:
                line.append(_Bucket(start))
            bucket = line[-1]
            if g.utilization_gpu is not None:
                bucket.util_sum += g.utilization_gpu
                bucket.util_n += 1
            if g.temperature is not None and (bucket.temp is None or g.temperature > bucket.temp):
                bucket.temp = g.temperature

    def series(self) -> dict[str, dict[str, list]]:
        """Per UUID: bucket start times, mean utilization (or None), highest temperature."""
        out = {}
        oldest = self._latest - self.span  # after a pause in sampling, older buckets linger
        for uuid, line in self._buckets.items():
            kept = [b for b in line if b.start > oldest]
            out[uuid] = {
                "t": [b.start for b in kept],
                "utilization": [
                    round(b.util_sum / b.util_n, 1) if b.util_n else None for b in kept
                ],
                "temperature": [b.temp for b in kept],
            }
        return out
