"""Reading the kernel's mount table (/proc/self/mountinfo), shared by the CLI and the daemon."""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

_OCTAL = re.compile(rb"\\([0-7]{3})")


def _unescape(field: bytes) -> bytes:
    """mountinfo escapes space, tab, newline and backslash as \\ooo; other bytes are raw."""
    return _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field)


@dataclass(frozen=True)
class MountEntry:
    """One line of the mount table, the fields zvfs needs."""

    mountpoint: str
    device: str  # 'major:minor'
    fstype: str  # e.g. 'fuse.zvfs'
    source: str  # e.g. 'zvfs:s3://bucket/prefix'
    options: str  # per-mount options, e.g. 'ro,nosuid,nodev,noatime'


def mount_table() -> list[MountEntry]:
    """Every mount of this mount namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            pre, _, post = line.rstrip(b"\n").partition(b" - ")
            parts, tail = pre.split(b" "), post.split(b" ")
            if len(parts) < 6 or len(tail) < 2:
                continue
            out.append(MountEntry(
                mountpoint=os.fsdecode(_unescape(parts[4])),
                device=parts[2].decode(),
                fstype=tail[0].decode(errors="replace"),
                source=os.fsdecode(_unescape(tail[1])),
                options=parts[5].decode(errors="replace"),
            ))
    return out


def mount_entry(path: str) -> MountEntry | None:
    """The file system mounted at ``path`` (the topmost one), or None.

    realpath() does not need the mount to answer, so a dead FUSE mount is found too."""
    target = os.path.realpath(path)
    found = None
    for entry in mount_table():
        if entry.mountpoint == target:
            found = entry
    return found


def mount_device(path: str) -> str | None:
    """'major:minor' of the file system mounted at ``path`` (the topmost one), or None."""
    entry = mount_entry(path)
    return entry.device if entry else None


def is_mounted(path: str) -> bool:
    return mount_entry(path) is not None


#: what the kernel answers on a FUSE mount whose connection is gone (the daemon died: ENOTCONN,
#: or the connection was aborted: ECONNABORTED)
DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)


def is_dead(path: str) -> bool:
    """True when ``path`` is a FUSE mount whose daemon is gone.

    statfs always reaches the daemon (a stat may be answered from the kernel's cache)."""
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc.errno in DEAD_ERRNOS
    return False
