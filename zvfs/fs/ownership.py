"""Who owns the mount's files, and with which permission bits.

A store has no owners or modes (S3, zip), or has ones that mean nothing to the mount's
users (a directory written by another machine's uid), so the mount decides: every node
belongs to ``uid``:``gid`` with ``file_mode`` or ``dir_mode``, as mountpoint-s3 (--uid,
--gid, --file-mode, --dir-mode), rclone and s3fs do. The kernel enforces them
(``default_permissions``), so with ``allow_other`` these bits decide who may read and
write. A node that cannot be written (a read-only mount, the decoded views) shows no
write bits, whatever the mode asks: ``ls -l`` then tells the truth, and a write is
refused before it reaches the daemon.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

#: the write bits a node that cannot be written drops
WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class Ownership:
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    file_mode: int = 0o644
    dir_mode: int = 0o755

    def mode(self, is_dir: bool, writable: bool) -> int:
        """``st_mode`` of a directory or a regular file."""
        perm = self.dir_mode if is_dir else self.file_mode
        if not writable:
            perm &= ~WRITE_BITS
        return (stat.S_IFDIR if is_dir else stat.S_IFREG) | perm
