"""Local disk space for files being written to a remote store.

A file written through an S3 mount lives here while it is open, and until its
upload succeeds. The space has its own bound and a floor of free space on its
disk, so a big ``cp`` fails with ENOSPC instead of filling the disk. Staged
files that could not be uploaded are kept (never deleted by zvfs), and their
path is logged: nothing written is lost silently.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid

from zvfs.stores.base import WriteRefused

log = logging.getLogger(__name__)

#: seconds a write that finds staging full waits for space being given back (see grow())
RELEASE_WAIT = 1.0


class Staging:
    """``directory`` (a private temporary one when None), bounded by ``max_bytes`` and
    leaving ``min_free`` bytes free on its disk."""

    def __init__(self, directory: str | None, max_bytes: int, min_free: int) -> None:
        if directory is None:
            self.dir = tempfile.mkdtemp(prefix="zvfs-staging-")
        else:
            self.dir = os.path.join(directory, "staging")
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.max_bytes = max_bytes
        self.min_free = min_free
        self.used = 0
        self._cond = threading.Condition()

    def new_file(self, key: str) -> tuple[str, int]:
        """A new empty staged file for ``key``: (path, fd opened read-write)."""
        name = f"{uuid.uuid4().hex}-{os.path.basename(key)[:80]}"
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        return path, fd

    def grow(self, key: str, extra: int) -> None:
        """Account ``extra`` more staged bytes, or refuse with ENOSPC.

        A refusal waits up to RELEASE_WAIT first: a file's space comes back when the kernel
        releases it, just after its close() returned, so a ``cp`` of one big file after
        another near the bound could meet the last one's space still held."""
        with self._cond:
            if extra <= 0:
                self.used += extra
                self._cond.notify_all()
                return
            deadline = time.monotonic() + RELEASE_WAIT
            while True:
                refusal = self._refusal(key, extra)
                if refusal is None:
                    self.used += extra
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise refusal
                self._cond.wait(left)

    def _refusal(self, key: str, extra: int) -> WriteRefused | None:
        if self.used + extra > self.max_bytes:
            return WriteRefused(
                errno.ENOSPC,
                f"{key}: staging space is full ({self.used} of {self.max_bytes} bytes in use; "
                "raise --staging-max-size)",
            )
        if shutil.disk_usage(self.dir).free - extra < self.min_free:
            return WriteRefused(
                errno.ENOSPC,
                f"{key}: the staging disk ({self.dir}) would drop below its {self.min_free} "
                "free bytes (--staging-min-free)",
            )
        return None

    def cleanup(self) -> None:
        """At unmount: remove the private directory if nothing was kept in it."""
        try:
            if os.path.basename(self.dir).startswith("zvfs-staging-") and not os.listdir(self.dir):
                shutil.rmtree(self.dir, ignore_errors=True)
        except OSError:
            pass
