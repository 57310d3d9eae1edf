"""One line per bad key: the log-once every layer shares.

A corrupt chunk or an unsafe key name is met again on every lookup, every read
and every kernel retry; the log must say it once, naming the key. A mount holds
one :class:`LogOnce` (its context's), and a store that logs on its own holds one
too. No dependencies, so any layer may use it.
"""

from __future__ import annotations

import logging
import threading


class LogOnce:
    """Remembers the keys it has reported; thread-safe (worker threads report too).

    At most ``limit`` keys are remembered, the oldest forgotten first, so a store of a
    million bad names cannot grow it without bound (a forgotten key may log again).
    """

    def __init__(self, logger: logging.Logger, limit: int = 100_000) -> None:
        self._logger = logger
        self._limit = limit
        self._seen: dict[str, None] = {}
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        """True the first time ``key`` is seen: the caller logs, at whatever level it likes."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > self._limit:
                del self._seen[next(iter(self._seen))]
            return True

    def warning(self, key: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` as a warning the first time ``key`` is seen."""
        if self.first(key):
            self._logger.warning(msg, *args)
