"""Helpers shared by the store backends (key checks, prefix checks, log-once)."""

from __future__ import annotations

import logging
import threading

from zvfs.stores.base import KeyNotFound
from zvfs.stores.keys import bad_segment


def check_key(key: str) -> None:
    """Refuse a key that cannot be a POSIX path; it can never exist in the mount."""
    why = bad_segment(key)
    if why is not None:
        raise KeyNotFound(f"unsafe key {key!r}: {why}")


def check_prefix(prefix: str) -> None:
    """A listing prefix is '' or a safe key followed by '/'."""
    if prefix == "":
        return
    if not prefix.endswith("/"):
        raise KeyNotFound(f"bad prefix {prefix!r}: must be '' or end with '/'")
    check_key(prefix[:-1])


def safe_name(name: str) -> bool:
    """True if ``name`` can be one path segment (listings drop the others)."""
    return bool(name) and "/" not in name and "\x00" not in name and name not in (".", "..")


class LogOnce:
    """Log a warning at most once per key, so a bad entry does not flood the log."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args: object) -> None:
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        self._logger.warning(msg, *args)
