"""Key validation shared by every store and by the fs layer.

A key becomes a path, so a key that could escape the mount (``..``), alias
another key (empty segment, ``.``) or cut a C string (NUL) is refused here, once.
"""

from __future__ import annotations


def safe_name(name: str) -> bool:
    """True if ``name`` can be one path segment (listings drop the others)."""
    return bool(name) and "/" not in name and "\x00" not in name and name not in (".", "..")


def bad_segment(key: str) -> str | None:
    """Return why ``key`` cannot be a POSIX path, or None if it can."""
    if safe_name(key):
        return None  # one plain segment (every name of a listing): decided without a split
    if not key:
        return "empty key"
    if "\x00" in key:
        return "contains NUL"
    if key.startswith("/"):
        return "absolute key"
    for seg in key.split("/"):
        if seg == "":
            return "empty segment"
        if seg in (".", ".."):
            return f"segment {seg!r}"
    return None


def skipped_key(key: str, under: bool = False) -> str:
    """The log line of ``key``, a key that cannot be a path (``under``: the prefix ``key/``,
    standing for every key below it), and why."""
    why = bad_segment(key + "/x" if under else key) or "not a path segment"
    what = f"the store keys under {key + '/'!r}" if under else f"store key {key!r}"
    return f"skipping {what}: cannot be a POSIX path ({why})"


def is_safe_key(key: str) -> bool:
    return bad_segment(key) is None
