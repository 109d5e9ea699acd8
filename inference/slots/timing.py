"""Small, allocation-light metrics: a bounded ring of timings with percentiles."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np


class TimingRing:
    """The last ``size`` durations (ms), safe to append from one thread and read from another."""

    def __init__(self, size: int = 512):
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, ms: float) -> None:
        with self._lock:
            self._values.append(ms)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def recent(self, count: int | None = None) -> tuple[float, ...]:
        """The newest ``count`` values (all when None), oldest first."""
        with self._lock:
            values = tuple(self._values)
        return values if count is None else values[-count:]

    def percentiles(self) -> tuple[float, float]:
        """(p50, p99) in ms; zeros while empty."""
        values = self.recent()
        if not values:
            return 0.0, 0.0
        p50, p99 = np.percentile(np.asarray(values), [50, 99])
        return float(p50), float(p99)
