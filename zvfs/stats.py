"""Live counters for ``.zvfs/stats.json``.

A plain registry with no dependencies, so every layer may count into it
without importing the layer that reports it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict


class Counters:
    """Thread-safe named counters (worker threads and the trio thread both count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: defaultdict[str, float] = defaultdict(float)
        self.started = time.time()

    def add(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._values[name] += amount

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {k: (int(v) if float(v).is_integer() else round(v, 6)) for k, v in self._values.items()}
        out["uptime_seconds"] = round(time.time() - self.started, 3)
        return dict(sorted(out.items()))


#: the process-wide counters; one mount per process
counters = Counters()
