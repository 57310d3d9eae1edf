"""Reading the kernel's mount table (/proc/self/mountinfo), shared by the CLI and the daemon."""

from __future__ import annotations

import os
import re

_OCTAL = re.compile(rb"\\([0-7]{3})")


def _unescape(field: bytes) -> bytes:
    """mountinfo escapes space, tab, newline and backslash as \\ooo; other bytes are raw."""
    return _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field)


def mount_device(path: str) -> str | None:
    """'major:minor' of the file system mounted at ``path`` (the topmost one), or None."""
    target = os.fsencode(os.path.realpath(path))
    found = None
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            parts = line.split(b" ")
            if len(parts) > 4 and _unescape(parts[4]) == target:
                found = parts[2].decode()
    return found


def is_mounted(path: str) -> bool:
    return mount_device(path) is not None
