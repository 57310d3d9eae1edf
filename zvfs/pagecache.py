"""Hints to the kernel's page cache, shared by the start-up read-ahead (warmup) and the
directory store: nothing here may import more than ``os``, as warmup runs before the rest
of zvfs is imported."""

from __future__ import annotations

import os


def read_ahead_and_close(fd: int) -> None:
    """Have the kernel read the whole file behind ``fd`` in the background, then close
    ``fd``. Only a hint: a file system that cannot is no error."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
