"""Helpers shared by the store backends (key checks, prefix checks, log-once)."""

from __future__ import annotations

import os

from zvfs.logonce import LogOnce as LogOnce  # the one log-once; re-exported for the stores
from zvfs.stores.base import KeyNotFound, StoreError
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


def pread_all(fd: int, start: int, length: int, key: str, *, until_eof: bool = False) -> bytes:
    """Read ``length`` bytes at ``start`` (fewer at EOF); with until_eof, read past a grown file."""
    parts: list[bytes] = []
    pos, left = start, length
    try:
        while left > 0 or until_eof:
            want = left if left > 0 else 1 << 20
            chunk = os.pread(fd, min(want, 1 << 26), pos)
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
            left -= len(chunk)
    except OSError as e:
        raise StoreError(f"{key}: read failed: {e.strerror}") from e
    return parts[0] if len(parts) == 1 else b"".join(parts)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> int:
    """Write all of ``data`` at ``offset`` (pwrite may write less than asked); returns its length."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done
